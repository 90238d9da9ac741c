"""containerd 1.7 (Debian 13's build) and `cdi-gen doctor` agree on which cdiVersion it reads.

Doctor finds the tested containerd on PATH and reads its version, ``1.7.24~ds1``: Debian's
build, whose CDI library is 0.8.0 (upstream 1.7.24 embeds 0.7.2). At 0.8.0 containerd injects
and doctor passes the file; at 1.0.0 CreateContainer fails ("unresolvable CDI devices") and
doctor FAILs naming the file, its version and the limit.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from consumers import doctor
from loopdev import LoopDevices

from .conftest import Pods, SpecFolders
from .daemon import Containerd
from .image import IMAGE_NAME
from .test_cdi_injection import nodes, qualified, run_listing, write_spec

pytestmark = pytest.mark.e2e


def _doctor(daemon: Containerd, spec_dir: Path, work: Path) -> tuple[int, list[str]]:
    # The tested binary first on PATH, and no podman: the verdict is containerd's alone.
    path = f"{daemon.dist / 'usr/bin'}:/usr/sbin:/sbin"
    return doctor(
        work, spec_dir, daemon.spec_dirs, "--containerd-config", daemon.config_path, path=path
    )


@pytest.mark.parametrize("version", ["0.8.0", "1.0.0"])
def test_containerd_and_doctor_agree_at_and_above_the_limit(
    pods: Pods, spec_folders: SpecFolders, loops: LoopDevices, tmp_path: Path, version: str
) -> None:
    readable = version == "0.8.0"
    dev = loops.add()
    path = write_spec(spec_folders.run, [dev], version=version)

    code, lines = _doctor(pods.daemon, spec_folders.run, tmp_path)

    assert any(
        line.startswith("OK   runtime: containerd 1.7.24~ds1 (reads cdiVersion <= 0.8.0;")
        for line in lines
    ), lines
    fails = [line for line in lines if line.startswith("FAIL cdiVersion:")]
    if readable:
        result = run_listing(pods.cri, pods, "at-limit", cdi_devices=[qualified(dev)])
        assert list(nodes(result)) == [str(dev.path)]
        assert fails == [], lines
    else:
        pod = pods.new("above-limit")
        with pytest.raises(grpc.RpcError) as err:
            pods.cri.create_container(
                pod, "lister", IMAGE_NAME, ["/bin/true"], cdi_devices=[qualified(dev)]
            )
        assert "unresolvable CDI devices" in str(err.value.details())
        assert len(fails) == 1, lines
        assert fails[0].startswith(
            f"FAIL cdiVersion: {path}: 1.0.0 is newer than containerd 1.7.24~ds1 reads (<= 0.8.0"
        )
        assert code == 1
