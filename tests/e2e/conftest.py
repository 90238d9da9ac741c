"""Fixtures for the end-to-end tests against real CDI consumers.

Every test in this folder is marked ``e2e``. A missing tool fails the test with the package to
install (`make test` installs them all through scripts/setup.sh); nothing here skips.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from consumers import (
    GoCDI,
    Podman,
    Runc,
    SpecDirs,
    build_cdicheck,
    build_rootfs,
    require_root,
    require_tool,
    setup_podman,
)
from loopdev import LoopDevices

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def go_cdi(tmp_path_factory: pytest.TempPathFactory) -> GoCDI:
    """The Go CDI library 0.5.2 through cdicheck, built once per session."""
    return build_cdicheck(tmp_path_factory.mktemp("cdicheck"))


@pytest.fixture(scope="session")
def podman() -> Iterator[Podman]:
    """podman 4.3 with a private store holding the busybox test image, in a short folder:
    podman refuses a run root of over 50 characters (pytest-xdist's temporary folders,
    ``.../popen-gw0/podman0/runroot``, are longer)."""
    require_root()
    home = Path(tempfile.mkdtemp(dir="/tmp", prefix="cgpod"))
    try:
        yield setup_podman(home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def busybox_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_rootfs(tmp_path_factory.mktemp("busybox") / "rootfs")


@pytest.fixture
def spec_dirs(tmp_path: Path) -> SpecDirs:
    """Empty stand-ins for /etc/cdi and /var/run/cdi."""
    return SpecDirs.under(tmp_path)


@pytest.fixture
def loops() -> Iterator[LoopDevices]:
    """Loop devices numbered 200-299, all removed at the end of the test."""
    require_root()
    if not os.path.exists("/dev/loop-control"):
        pytest.fail("e2e: /dev/loop-control missing (kernel without loop support?)", False)
    devices = LoopDevices()
    try:
        yield devices
    finally:
        devices.cleanup()


@pytest.fixture
def runc(tmp_path: Path) -> Runc:
    require_root()
    require_tool("runc")
    root = tmp_path / "runc-root"
    root.mkdir()
    return Runc(root)
