"""A cluster whose node cannot start: the error names the component and quotes its log, and
the teardown still stops everything the start had reached and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from .build import COMMANDS, Binaries
from .cluster import Cluster
from .dist import fetch_etcd
from .process import ComponentError


def test_broken_kubelet_fails_by_name_and_leaves_nothing(cluster: Cluster, tmp_path: Path) -> None:
    # The session's binaries, except a kubelet that refuses to run.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in COMMANDS:
        if command != "kubelet":
            (bin_dir / command).symlink_to(cluster.binaries.path(command))
    kubelet = bin_dir / "kubelet"
    kubelet.write_text("#!/bin/sh\necho 'kubelet: broken on purpose by the test' >&2\nexit 3\n")
    kubelet.chmod(0o755)
    broken = Cluster(
        Binaries(cluster.binaries.version, bin_dir, 0.0, 0.0),
        fetch_etcd(),
        cluster.runtime_root,
        cluster.lane,
    )
    with pytest.raises(ComponentError) as failure:
        broken.start()
    assert "kubelet exited 3 while starting" in str(failure.value)
    assert "broken on purpose by the test" in str(failure.value)

    started = [c.process.pid for c in broken.components.values() if c.process is not None]
    assert broken.containerd is not None and broken.namespace is not None
    cgroup_parent = broken.containerd.cgroup_parent
    assert broken.stop() == []
    broken.remove()
    for pid in started:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"pid {pid} survived"
    assert broken.namespace.holder is not None and broken.namespace.holder.poll() is not None
    assert not list(Path("/sys/fs/cgroup").glob(f"*{cgroup_parent}"))
    assert not broken.work.exists()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True
