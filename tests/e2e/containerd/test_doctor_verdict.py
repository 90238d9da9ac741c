"""``cdi-gen doctor`` agrees with what containerd 1.7 actually did.

Doctor reads the very config files the e2e daemons ran on, with the version of the tested
binary: the config that injected devices passes, the one that silently dropped them
(enable_cdi = false) is a FAIL and exit 1, and so is a spec folder the daemon does not read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from consumers import doctor as run_doctor
from loopdev import LoopDevices

from .agent import agent_config
from .conftest import ContainerdFactory, Pods, SpecFolders
from .daemon import Containerd
from .fetch import containerd_version
from .test_cdi_injection import nodes, qualified, run_listing, write_spec

pytestmark = pytest.mark.e2e


def doctor(daemon: Containerd, spec_dir: Path, work: Path, loops: LoopDevices) -> tuple[int, str]:
    dev = loops.add()
    config = work / "agent.yaml"
    config.write_text(agent_config([dev.name]))  # a class that matches, so that check is OK
    version = containerd_version(daemon.dist).split("~")[0]  # "1.7.24~ds1" -> "1.7.24"
    code, lines = run_doctor(
        work, spec_dir, daemon.spec_dirs,
        "--config", config,
        "--containerd-config", daemon.config_path,
        "--containerd-version", version,
    )  # fmt: skip
    return code, "\n".join(lines)


def containerd_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if " containerd: " in line]


def test_doctor_passes_the_config_that_injected(
    containerd: Containerd,
    pods: Pods,
    spec_folders: SpecFolders,
    loops: LoopDevices,
    tmp_path: Path,
) -> None:
    dev = loops.add()
    write_spec(spec_folders.run, [dev])
    assert nodes(run_listing(pods.cri, pods, "doctor-ok", cdi_devices=[qualified(dev)]))

    code, output = doctor(containerd, spec_folders.run, tmp_path, loops)

    assert code == 0, output
    lines = containerd_lines(output)
    assert lines and all(line.startswith("OK") for line in lines), output


def test_doctor_fails_the_config_that_dropped_the_device(
    start_containerd: ContainerdFactory, loops: LoopDevices, tmp_path: Path
) -> None:
    daemon = start_containerd(enable_cdi=False)
    dev = loops.add()
    write_spec(daemon.spec_dirs[-1], [dev])
    pods = Pods(daemon)
    try:
        result = run_listing(pods.cri, pods, "doctor-off", cdi_devices=[qualified(dev)])
    finally:
        pods.remove_all()
    assert result.exit_code == 0 and nodes(result) == {}  # what containerd did ...

    code, output = doctor(daemon, daemon.spec_dirs[-1], tmp_path, loops)  # ... and doctor

    assert code == 1, output
    assert any(
        line.startswith("FAIL") and "enable_cdi = false" in line
        for line in containerd_lines(output)
    ), output


def test_doctor_fails_a_spec_folder_the_daemon_does_not_read(
    containerd: Containerd, loops: LoopDevices, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    code, output = doctor(containerd, elsewhere, tmp_path, loops)

    assert code == 1, output
    assert any(
        line.startswith("FAIL") and "cdi_spec_dirs" in line for line in containerd_lines(output)
    ), output
