"""Scenario 5, shared devices on a real node: ``replicas: 2`` doubles the Node's capacity and
two pods get the same device node; through DRA, where the API server serves consumable
capacity (current lane), a device's shares are taken by amount until the next claim waits."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from loopdev import LoopDevices

from .agent import DRIVER, VENDOR, class_config
from .claims import (
    Claims,
    allocated_devices,
    device_attribute,
    for_extended_resource,
    generated_device_classes,
)
from .cluster import Cluster
from .conftest import AgentFactory, DraAgentFactory, wait_capacity
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


@pytest.mark.lanes("current")
def test_claims_take_a_shared_device_by_capacity_until_the_next_waits(
    loops: LoopDevices, dra_agent: DraAgentFactory, claims: Claims, tmp_path: Path
) -> None:
    """``replicas: 3`` through DRA on 1.37 (consumable capacity on by default): the device is
    published once with ``shares: 3``; a claim asking for two shares and one taking the
    default one both run on the same device node, each allocation with its own shareID, and
    a third claim's pod is reported unschedulable by the scheduler."""
    pods = claims.pods
    device = loops.add()
    config = class_config("shared", [device.name], replicas=3)
    dra_agent(config, None)
    config_path = tmp_path / "deviceclasses-config.yaml"
    config_path.write_text(config)
    device_class = for_extended_resource(generated_device_classes(config_path), SHARED)
    claims.ensure_device_class(device_class)
    cdi = f"{VENDOR}/shared=shared-{device.number}-0"
    found = claims.wait_devices(
        DRIVER,
        lambda found: [device_attribute(d, DRIVER, "cdiName") for d in found.values()] == [cdi],
        f"{cdi} published once",
    )
    (published,) = found.values()
    assert published["allowMultipleAllocations"] is True, published
    assert published["capacity"]["shares"]["value"] == "3", published
    assert "consumesCounters" not in published, published

    class_name = str(device_class["metadata"]["name"])
    asked = {"big": "2", "small": None, "late": None}
    for name, shares in asked.items():
        claims.claim(
            f"{name}-claim", class_name, capacity=None if shares is None else {"shares": shares}
        )
    for name in ("big", "small"):
        claims.pod_with_claim(name, f"{name}-claim", env="SHARED_DEVICE")
        pods.wait_running(name)
        assert pods.seen(name).devices == {str(device.path): hex_rdev(device)}
    claims.pod_with_claim("late", "late-claim", env="SHARED_DEVICE")
    assert pods.wait_unschedulable("late", timeout=60)

    results = {n: allocated_devices(claims.get_claim(f"{n}-claim")) for n in ("big", "small")}
    assert {n: [r["device"] for r in rs] for n, rs in results.items()} == {
        "big": [published["name"]],
        "small": [published["name"]],
    }
    assert [r["consumedCapacity"] for r in results["big"]] == [{"shares": "2"}]
    assert [r["consumedCapacity"] for r in results["small"]] == [{"shares": "1"}]
    share_ids = {r["shareID"] for rs in results.values() for r in rs}
    assert len(share_ids) == 2, results
