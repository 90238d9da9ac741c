"""Scenario 5, shared devices on a real node: ``replicas: 2`` doubles the Node's capacity and
two pods get the same device node."""

from __future__ import annotations

from collections import Counter

import pytest
from loopdev import LoopDevices

from .agent import class_config
from .cluster import Cluster
from .conftest import AgentFactory, wait_capacity
from .pods import Pods
from .test_seed_lab import hex_rdev

#: The device-plugin scenarios run in the oldest lane (Kubernetes 1.35, containerd 1.7) and the
#: crio lane (Kubernetes 1.36, CRI-O 1.36) too.
pytestmark = pytest.mark.lanes("current", "oldest", "crio")

SHARED = "example.com/shared"


def test_two_pods_share_each_device(
    cluster: Cluster, loops: LoopDevices, node_agent: AgentFactory, pods: Pods
) -> None:
    devices = [loops.add(), loops.add()]
    by_path = {str(d.path): d for d in devices}
    node_agent(class_config("shared", [d.name for d in devices], replicas=2))
    wait_capacity(cluster, SHARED, 4)

    names = [f"sharer-{i}" for i in range(4)]
    for name in names:
        pods.create(name, {SHARED: 1}, env="SHARED_DEVICE")
    users: Counter[str] = Counter()
    for name in names:
        pods.wait_running(name)
        seen = pods.seen(name)
        assert len(seen.devices) == 1, seen
        (path, numbers) = next(iter(seen.devices.items()))
        assert numbers == hex_rdev(by_path[path])
        assert seen.env["SHARED_DEVICE"].startswith(f"shared-{by_path[path].number}"), seen
        users[path] += 1
    # Four slots over two devices: each device is held by exactly two pods at once.
    assert users == {path: 2 for path in by_path}
