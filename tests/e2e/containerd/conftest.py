"""Fixtures: a private containerd 1.7 with CDI on (one per session), a factory for daemons with
other settings, and per-test pods and spec folders that are always cleaned up.

Nothing here skips: without root, runc, busybox or a fetchable containerd the tests fail and
say which.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .cri import CRIClient, Finished, Pod
from .daemon import Containerd, DaemonError, remove_work, work_folder
from .fetch import FetchError, fetch
from .image import BUSYBOX, IMAGE_NAME, build_archive

RUNC = Path("/usr/sbin/runc")


@dataclass(frozen=True)
class SpecFolders:
    """The daemon's cdi_spec_dirs, in priority order: ``etc`` (low), ``run`` (high)."""

    etc: Path
    run: Path

    def clear(self) -> None:
        for folder in (self.etc, self.run):
            for f in folder.iterdir():
                f.unlink()


def _need_host() -> None:
    if os.geteuid() != 0:
        pytest.fail("containerd e2e: needs root (containerd, runc, loop devices)", False)
    if not RUNC.exists():
        pytest.fail(f"containerd e2e: {RUNC} missing: apt-get install runc", False)
    if not BUSYBOX.exists():
        pytest.fail(f"containerd e2e: {BUSYBOX} missing: apt-get install busybox-static", False)


@pytest.fixture(scope="session")
def containerd_dist() -> Path:
    """Debian 13's containerd 1.7 unpacked (cached across runs)."""
    _need_host()
    try:
        return fetch()
    except FetchError as exc:
        pytest.fail(f"containerd e2e: cannot fetch containerd 1.7: {exc}", False)


@pytest.fixture(scope="session")
def busybox_oci(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need_host()
    return build_archive(tmp_path_factory.mktemp("oci") / "busybox-oci.tar")


ContainerdFactory = Callable[..., Containerd]


def _start(dist: Path, archive: Path, *, enable_cdi: bool | None = None) -> Containerd:
    work = work_folder()
    spec = SpecFolders(work / "cdi/etc", work / "cdi/run")
    spec.etc.mkdir(parents=True)
    spec.run.mkdir(parents=True)
    daemon = Containerd(dist, work, [spec.etc, spec.run], IMAGE_NAME, enable_cdi=enable_cdi)
    try:
        daemon.start()
        daemon.import_image(archive)
    except DaemonError as exc:
        problems = daemon.stop()
        remove_work(work)
        pytest.fail(f"containerd e2e: containerd 1.7 did not start: {exc} {problems}", False)
    return daemon


def _finish(daemon: Containerd) -> None:
    problems = daemon.stop()
    remove_work(daemon.work)
    if problems:
        pytest.fail("containerd e2e: cleanup left something behind: " + "; ".join(problems))


@pytest.fixture(scope="session")
def containerd(containerd_dist: Path, busybox_oci: Path) -> Iterator[Containerd]:
    """containerd 1.7 configured from deploy/containerd/containerd-1.7-cdi.toml."""
    daemon = _start(containerd_dist, busybox_oci)
    try:
        yield daemon
    finally:
        _finish(daemon)


@pytest.fixture
def start_containerd(containerd_dist: Path, busybox_oci: Path) -> Iterator[ContainerdFactory]:
    """Start extra daemons with other settings (``enable_cdi=False``); all stopped at the end."""
    started: list[Containerd] = []

    def factory(*, enable_cdi: bool | None = None) -> Containerd:
        daemon = _start(containerd_dist, busybox_oci, enable_cdi=enable_cdi)
        started.append(daemon)
        return daemon

    try:
        yield factory
    finally:
        for daemon in started:
            _finish(daemon)


@pytest.fixture
def spec_folders(containerd: Containerd) -> Iterator[SpecFolders]:
    """The session daemon's spec folders, emptied after each test."""
    folders = SpecFolders(*containerd.spec_dirs)
    folders.clear()
    try:
        yield folders
    finally:
        folders.clear()


@dataclass
class Pods:
    """Sandboxes for one test, in the daemon's host network namespace; removed at test end."""

    daemon: Containerd

    def __post_init__(self) -> None:
        self.ids: list[str] = []

    @property
    def cri(self) -> CRIClient:
        assert self.daemon.cri is not None
        return self.daemon.cri

    def new(self, name: str) -> Pod:
        pod = self.cri.run_pod(name, self.daemon.work / "logs", self.daemon.cgroup_parent)
        self.ids.append(pod.id)
        return pod

    async def start_allocated(
        self, name: str, response: Any, script: str, *, use_field: bool = True
    ) -> Finished:
        """What the kubelet does with one ContainerAllocateResponse: copy its CDI names into
        CreateContainer.CDI_devices (unless ``use_field`` is off) and its annotations into the
        container's, never interpreting them; run ``script`` to its end."""
        pod = await asyncio.to_thread(self.new, name)
        return await asyncio.to_thread(
            self.cri.run_to_end,
            pod,
            "consumer",
            IMAGE_NAME,
            script,
            cdi_devices=[d.name for d in response.cdi_devices] if use_field else (),
            annotations=dict(response.annotations),
        )

    def remove_all(self) -> None:
        for pod_id in self.ids:
            self.cri.remove_pod(pod_id)
        self.ids.clear()


@pytest.fixture
def pods(containerd: Containerd) -> Iterator[Pods]:
    p = Pods(containerd)
    try:
        yield p
    finally:
        p.remove_all()
