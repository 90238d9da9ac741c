"""The real single-node cluster of tests/cluster as the benchmarks run it.

Importing it puts ``tests/`` on ``sys.path`` (the cluster package imports its siblings as
top-level modules, as pytest's rootdir-relative imports do). :func:`components` gets etcd,
containerd and the pinned Kubernetes build (built into the cache on first use, unlike the
tests, which refuse to spend their time limit on a build); :func:`bench_cluster` starts one
cluster from them and always stops and removes it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent.parent / "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from cluster.build import Binaries  # noqa: E402
from cluster.cluster import Cluster, running_cluster  # noqa: E402
from cluster.dist import fetch_etcd  # noqa: E402
from cluster.lane import CURRENT, Lane  # noqa: E402

#: Loop numbers of the benchmarks: the cluster tests use 400-499, other suites 200-399.
LOOP_LOW, LOOP_HIGH = 500, 599


def missing() -> str | None:
    """Why a cluster benchmark cannot run here (it needs root), or None."""
    if os.geteuid() != 0:
        return "not measured: needs root"
    return None


def components(lane: Lane = CURRENT) -> tuple[Binaries, Path, Path]:
    """The lane's Kubernetes binaries, etcd's root and its runtime's (containerd's or CRI-O's)."""
    etcd, containerd = fetch_etcd(), lane.runtime_root()
    return lane.binaries(), etcd, containerd


@contextlib.contextmanager
def bench_cluster(
    parts: tuple[Binaries, Path, Path] | None = None, lane: Lane = CURRENT
) -> Iterator[Cluster]:
    """A running cluster of ``lane`` with a Ready Node, stopped and removed at the end."""
    binaries, etcd, containerd = parts or components(lane)
    with running_cluster(binaries, etcd, containerd, lane) as cluster:
        yield cluster


def wait_allocatable(
    cluster: Cluster, resources: Sequence[str], count: int, timeout: float = 30
) -> float:
    """Seconds until the Node's allocatable of ``resources`` adds up to ``count``, polled
    every 10 ms (the kubelet publishes it on its status tick, no event to watch for)."""
    start = time.monotonic()
    while sum(cluster.allocatable(r)[1] for r in resources) != count:
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"allocatable {', '.join(resources)} never added up to {count}")
        time.sleep(0.01)
    return time.monotonic() - start
