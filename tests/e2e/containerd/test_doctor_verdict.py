"""``cdi-gen doctor``'s containerd check agrees with what containerd 1.7 actually did.

The check reads the very config files the e2e daemons ran on: the one that injected devices
must pass, the one that silently dropped them (enable_cdi = false) must FAIL, and a folder the
daemon does not read must FAIL too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from consumers import LoopDevices

from cdi_gen.doctor import check_containerd, containerd_version

from .conftest import ContainerdFactory, Pods, SpecFolders
from .daemon import Containerd
from .test_cdi_injection import nodes, qualified, run_listing, write_spec

pytestmark = pytest.mark.e2e


def version_of(daemon: Containerd) -> tuple[int, int, int]:
    version = containerd_version(str(daemon.bin / "containerd"))
    assert version is not None and version[:2] == (1, 7), version
    return version


def statuses(daemon: Containerd, spec_dir: Path) -> list[str]:
    checks = check_containerd(daemon.config_path, spec_dir, version_of(daemon))
    return [c.line() for c in checks]


def test_doctor_passes_the_config_that_injected(
    containerd: Containerd, pods: Pods, spec_folders: SpecFolders, loops: LoopDevices
) -> None:
    dev = loops.add()
    write_spec(spec_folders.run, [dev])
    assert nodes(run_listing(pods.cri, pods, "doctor-ok", cdi_devices=[qualified(dev)]))

    lines = statuses(containerd, spec_folders.run)
    assert lines and all(line.startswith("OK") for line in lines), lines


def test_doctor_fails_the_config_that_dropped_the_device(
    start_containerd: ContainerdFactory, loops: LoopDevices
) -> None:
    daemon = start_containerd(enable_cdi=False)
    dev = loops.add()
    write_spec(daemon.spec_dirs[-1], [dev])
    pods = Pods(daemon)
    try:
        result = run_listing(pods.cri, pods, "doctor-off", cdi_devices=[qualified(dev)])
    finally:
        pods.remove_all()
    assert nodes(result) == {}  # what containerd did ...

    lines = statuses(daemon, daemon.spec_dirs[-1])  # ... and what doctor says about it
    assert any(line.startswith("FAIL") and "enable_cdi = false" in line for line in lines), lines


def test_doctor_fails_a_spec_folder_the_daemon_does_not_read(
    containerd: Containerd, tmp_path: Path
) -> None:
    lines = statuses(containerd, tmp_path)
    assert any(line.startswith("FAIL") and "cdi_spec_dirs" in line for line in lines), lines
