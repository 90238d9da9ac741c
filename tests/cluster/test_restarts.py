"""Scenarios 3 and 4: restarting the kubelet or the agent leaves running pods and their devices
alone, the agent registers again, and new pods still get free devices."""

from __future__ import annotations

import pytest
from loopdev import LoopDevices

from tests.waiting import until_sync

from .agent import NodeAgent, class_config
from .cluster import Cluster
from .conftest import AgentFactory, wait_capacity
from .pods import Pods
from .test_seed_lab import RESOURCE, hex_rdev

#: The device-plugin scenarios run in the oldest lane (Kubernetes 1.35, containerd 1.7) and the
#: crio lane (Kubernetes 1.36, CRI-O 1.36) too.
pytestmark = pytest.mark.lanes("current", "oldest", "crio")


def _wait_allocatable(cluster: Cluster, capacity: int, allocatable: int, timeout: float) -> None:
    until_sync(
        lambda: cluster.allocatable(RESOURCE) == (capacity, allocatable),
        f"{RESOURCE} (capacity, allocatable) {(capacity, allocatable)}",
        timeout,
        every=0.05,
        observe=lambda: cluster.allocatable(RESOURCE),
    )


def _wait_log(agent: NodeAgent, line: str, count: int, timeout: float = 30) -> None:
    until_sync(
        lambda: agent.log().count(line) >= count,
        f"agent log with {count}x {line!r}",
        timeout,
        every=0.1,
        observe=lambda: agent.log().count(line),
    )


def test_kubelet_restart(
    cluster: Cluster, loops: LoopDevices, node_agent: AgentFactory, pods: Pods
) -> None:
    devices = [loops.add() for _ in range(3)]
    by_path = {str(d.path): d for d in devices}
    agent = node_agent(class_config("fpga", [d.name for d in devices]))
    wait_capacity(cluster, RESOURCE, 3)
    before: dict[str, tuple[str, tuple[int, str]]] = {}
    for name in ("before-a", "before-b"):
        pods.create(name, {RESOURCE: 1})
    for name in ("before-a", "before-b"):
        pods.wait_running(name)
        before[name] = (next(iter(pods.seen(name).devices)), pods.restarts(name))

    cluster.restart_kubelet()
    # A new kubelet.sock: the agent must notice, serve anew and register again. (The Node's
    # allocatable alone proves nothing here: the old kubelet's status is still in the API.)
    _wait_log(agent, "kubelet restarted", 1)
    _wait_log(agent, "registered example.com/fpga with the kubelet", 2)
    assert agent.running()
    assert (
        "Got registration request from device plugin"
        in cluster.components["kubelet"].log_tail(10_000).split("===== kubelet starting")[-1]
    ), "the restarted kubelet never took the agent's registration"
    wait_capacity(cluster, RESOURCE, 3, timeout=60)

    for name, (device, restarts) in before.items():
        assert pods.restarts(name) == restarts, f"{name} was restarted"
        seen = pods.seen(name, fresh=True)
        assert seen.devices == {device: hex_rdev(by_path[device])}

    pods.create("after", {RESOURCE: 1})
    pods.wait_running("after")
    (device,) = pods.seen("after").devices
    assert device not in {d for d, _ in before.values()}


def test_agent_restart(
    cluster: Cluster, loops: LoopDevices, node_agent: AgentFactory, pods: Pods
) -> None:
    devices = [loops.add(), loops.add()]
    by_path = {str(d.path): d for d in devices}
    config = class_config("fpga", [d.name for d in devices])
    first = node_agent(config)
    wait_capacity(cluster, RESOURCE, 2)
    pods.create("steady", {RESOURCE: 1})
    pods.wait_running("steady")
    (held,) = pods.seen("steady").devices
    restarts = pods.restarts("steady")

    assert first.stop() == 0, first.log()
    # The kubelet sees the plugin go: the devices stay in capacity but none is allocatable.
    _wait_allocatable(cluster, 2, 0, timeout=30)
    node_agent(config)
    wait_capacity(cluster, RESOURCE, 2)

    assert pods.restarts("steady") == restarts
    assert pods.seen("steady", fresh=True).devices == {held: hex_rdev(by_path[held])}
    pods.create("second", {RESOURCE: 1})
    pods.wait_running("second")
    (other,) = pods.seen("second").devices
    assert other != held
