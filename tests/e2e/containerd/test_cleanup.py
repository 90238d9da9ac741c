"""The teardown leaves nothing behind, even when containerd died under a running container.

This is what makes the fixture safe after a failed test: pods are gone through the CRI when the
daemon answers, and through runc, shim PIDs and umount when it does not.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from .conftest import _start
from .cri import CRIClient
from .daemon import CGROUP_ROOT, _mounts_under, _shim_pids, remove_work
from .image import IMAGE_NAME

pytestmark = pytest.mark.e2e


def test_teardown_after_the_daemon_was_killed(containerd_dist: Path, busybox_oci: Path) -> None:
    daemon = _start(containerd_dist, busybox_oci)
    assert daemon.process is not None and daemon.cri is not None
    cri: CRIClient = daemon.cri
    pod = cri.run_pod("orphan", daemon.work / "logs", daemon.cgroup_parent)
    cid = cri.create_container(pod, "sleeper", IMAGE_NAME, ["/bin/sleep", "inf"])
    cri.start_container(cid)
    cri.wait_running(cid)
    assert _shim_pids(daemon.socket), "a running pod should have a shim"
    assert _mounts_under(daemon.work), "a running container should have its rootfs mounted"

    os.kill(daemon.process.pid, signal.SIGKILL)  # a crash: no CRI left to remove the pod
    daemon.process.wait(5)
    problems = daemon.stop()
    remove_work(daemon.work)

    assert problems == []
    assert _shim_pids(daemon.socket) == []
    assert _mounts_under(daemon.work) == []
    assert list(CGROUP_ROOT.glob("*" + daemon.cgroup_parent)) == []
    assert not daemon.work.exists()
