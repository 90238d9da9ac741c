"""Scenario 2, hotplug on a real node: a new device reaches the Node's allocatable, and removing
an unused one takes it away again without disturbing the pod that holds another."""

from __future__ import annotations

import pytest
from loopdev import LoopDevices

from .agent import class_config
from .cluster import Cluster
from .conftest import AgentFactory, wait_capacity
from .pods import Pods
from .test_seed_lab import RESOURCE, hex_rdev

#: The device-plugin scenarios run in the oldest lane (Kubernetes 1.35, containerd 1.7) and the
#: crio lane (Kubernetes 1.36, CRI-O 1.36) too.
pytestmark = pytest.mark.lanes("current", "oldest", "crio")


def test_add_and_remove_reach_the_node(
    cluster: Cluster,
    loops: LoopDevices,
    node_agent: AgentFactory,
    pods: Pods,
    record_property: object,
) -> None:
    first = [loops.add(), loops.add()]
    later = loops.reserve()
    node_agent(class_config("fpga", [d.name for d in [*first, later]]))
    wait_capacity(cluster, RESOURCE, 2)

    pods.create("holder", {RESOURCE: 1})
    pods.wait_running("holder")
    held = next(iter(pods.seen("holder").devices))

    loops.add(later)
    seconds = wait_capacity(cluster, RESOURCE, 3)
    print(f"kernel add -> Node allocatable {RESOURCE}=3: {seconds:.2f} s")
    if callable(record_property):
        record_property("hotplug_add_seconds", round(seconds, 3))

    unused = next(d for d in [*first, later] if str(d.path) != held)
    loops.remove(unused)
    wait_capacity(cluster, RESOURCE, 2)

    by_path = {str(d.path): d for d in [*first, later]}
    seen = pods.seen("holder", fresh=True)
    assert seen.devices == {held: hex_rdev(by_path[held])}
    assert pods.restarts("holder")[0] == 0
