"""Specs written by ``cdi-gen write`` (the product, not a hand-written file) in containerd 1.7.

The spec folder is the daemon's own; the config is one loop class with exact kernel names.
After a device leaves the node, ``cdi-gen write`` again withdraws its entry and containerd
refuses the name; the device still there keeps working.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
import pytest
from consumers import run
from loopdev import LoopDevices

from .agent import RESOURCE, agent_config
from .conftest import Pods, SpecFolders
from .image import IMAGE_NAME
from .test_cdi_injection import nodes, run_listing

pytestmark = pytest.mark.e2e


def cdi_gen_write(config: Path, spec_dir: Path) -> None:
    run(
        [sys.executable, "-m", "cdi_gen", "write", "--config", config, "--spec-dir", spec_dir],
        check=True,
    )


def test_written_specs_inject_and_a_removed_device_is_withdrawn(
    tmp_path: Path, pods: Pods, spec_folders: SpecFolders, loops: LoopDevices
) -> None:
    a, b = loops.add(), loops.add()
    config = tmp_path / "cdi-gen.yaml"
    config.write_text(agent_config([a.name, b.name]))
    cdi_gen_write(config, spec_folders.run)

    both = [f"{RESOURCE}={a.name}", f"{RESOURCE}={b.name}"]
    result = run_listing(pods.cri, pods, "written", cdi_devices=both)
    assert nodes(result) == {
        str(a.path): ("block special file", *a.rdev()),
        str(b.path): ("block special file", *b.rdev()),
    }
    assert result.env["CDI_GEN_CLASS"] == "loop"

    loops.remove(b)
    cdi_gen_write(config, spec_folders.run)

    pod = pods.new("withdrawn")
    with pytest.raises(grpc.RpcError) as err:
        pods.cri.create_container(pod, "c", IMAGE_NAME, ["/bin/true"], cdi_devices=both[1:])
    assert f"unresolvable CDI devices {both[1]}" in str(err.value.details())
    result = run_listing(pods.cri, pods, "still-there", cdi_devices=both[:1])
    assert list(nodes(result)) == [str(a.path)]
    assert result.env["CDI_GEN_DEVNODE"] == str(a.path)
