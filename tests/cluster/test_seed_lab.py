"""Scenario 1, the seed lab on a real node: two example.com/fpga devices, three pods asking for
one each; two run with their own device, the third waits for the scheduler, then gets the
device a deleted pod gave back."""

from __future__ import annotations

import pytest
from loopdev import LoopDevice, LoopDevices

from .agent import class_config
from .cluster import Cluster
from .conftest import AgentFactory, wait_capacity
from .pods import Pods, phase

#: The device-plugin scenarios run in the oldest lane (Kubernetes 1.35, containerd 1.7) and the
#: crio lane (Kubernetes 1.36, CRI-O 1.36) too.
pytestmark = pytest.mark.lanes("current", "oldest", "crio")

RESOURCE = "example.com/fpga"


def hex_rdev(dev: LoopDevice) -> str:
    major, minor = dev.rdev()
    return f"{major:x}:{minor:x}"


def test_two_devices_three_pods(
    cluster: Cluster, loops: LoopDevices, node_agent: AgentFactory, pods: Pods
) -> None:
    devices = [loops.add(), loops.add()]
    by_path = {str(d.path): d for d in devices}
    node_agent(class_config("fpga", [d.name for d in devices]))
    wait_capacity(cluster, RESOURCE, 2)

    names = ["fpga-consumer-a", "fpga-consumer-b", "fpga-consumer-c"]
    for name in names:
        pods.create(name, {RESOURCE: 1})

    running, waiting, state = pods.wait_split(names, running=2)
    (pending, message) = next(iter(waiting.items()))
    assert phase(state[pending]) == "Pending"
    assert f"Insufficient {RESOURCE}" in message, message

    owner: dict[str, str] = {}
    for name in running:
        seen = pods.seen(name)
        # Exactly one device node, its own, with the host's numbers, and the class env.
        assert len(seen.devices) == 1, seen
        (path, numbers) = next(iter(seen.devices.items()))
        assert path in by_path, seen
        assert numbers == hex_rdev(by_path[path])
        assert seen.env == {"FPGA_DEVICE": f"fpga-{by_path[path].number}"}
        owner[path] = name
    assert sorted(owner) == sorted(by_path), "both running pods got the same device"

    freed, victim = next(iter(owner.items()))
    pods.delete(victim)
    pods.wait_running(pending)
    seen = pods.seen(pending)
    assert seen.devices == {freed: hex_rdev(by_path[freed])}
    assert seen.env == {"FPGA_DEVICE": f"fpga-{by_path[freed].number}"}
