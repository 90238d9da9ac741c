"""A workload follows its device to another node (issue 55, current lane, three nodes): the
cookbook's scenario docs/examples/follow-to-another-node, run as it is written.

A Deployment's pod holds, through a claim from the cookbook's ResourceClaimTemplate, the
device ``field-camera.img`` of the cookbook's class (``whenGone: taint``, named after its
backing file). The device is a loop device: "unplugged" from node A is a detach of its
backing file there, "plugged into" node B an attach of the same file to B's loop device. A's
agent keeps the device tainted NoExecute, the pod is evicted, and the replacement runs on B
with B's device.

How each "node" sees only its own devices on one machine: every node gets one loop device of
its own, made before the agents start and hidden from the other nodes' mount namespaces
(``fleet.devices_per_node``); each is made without a file, and the class takes only loop
devices with a file of the stick folder attached. Attaching and detaching a file changes an
existing device (a ``change`` uevent), whose sysfs folder every other node has hidden since
the start, so an agent that gets the uevent of another node's device finds nothing there to
match. Two things of the cookbook's config change for this harness: the match names the two
loop devices and the test's stick folder (other suites attach files to loop devices at the
same time), and the node's path in the container is ``/dev/loop-stick``, which the test's
consumer lists.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from loopdev import LoopDevice, LoopDevices

from tests.waiting import until_sync

from .agent import DRIVER
from .api import Api
from .claims import TEMPLATES, Claims, allocated_devices, device_attribute, generated_device_classes
from .cluster import Cluster
from .conftest import _TEST_LOGS
from .daemonset import write_fleet_dra_overlay
from .fleet import devices_per_node
from .image import AgentImage
from .pods import PODS, Pods
from .test_nodes import (
    DEPLOYMENTS,
    _claim_of,
    _deployment,
    _diagnostics,
    _undo_drain_run,
    _wait_replicas,
)
from .test_seed_lab import hex_rdev

pytestmark = pytest.mark.timeout(900)

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "follow-to-another-node"
STICK = "field-camera.img"
CDI_NAME = f"{DRIVER}/stick={STICK}"
IN_CONTAINER = "/dev/loop-stick"


@pytest.fixture
def own_device(fleet: Cluster, loops: LoopDevices) -> Iterator[dict[str, LoopDevice]]:
    """One loop device per node, without a file, hidden from the other nodes."""
    with devices_per_node(fleet, loops, count=1) as devices:
        yield {node: mine for node, (mine,) in devices.items()}


def _config(folder: Path, kernels: list[str]) -> dict[str, Any]:
    """The cookbook's config, matching only ``kernels`` with a file of ``folder``."""
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    (stick,) = config["classes"]
    stick["match"] = [
        {**stick["match"], "kernel": k, "attributes": {"loop/backing_file": f"{folder}/*"}}
        for k in kernels
    ]
    stick["node"] = {"path": IN_CONTAINER}
    return dict(config)


def _offers(claims: Claims, node: str) -> dict[str, Any] | None:
    """The stick as ``node``'s pool publishes it now, or None."""
    for device in claims.devices(DRIVER, node).values():
        if device_attribute(device, DRIVER, "cdiName") == CDI_NAME:
            return dict(device)
    return None


def test_a_deployments_pod_follows_its_device_to_another_node(
    fleet: Cluster,
    own_device: dict[str, LoopDevice],
    loops: LoopDevices,
    agent_image: AgentImage,
    tmp_path: Path,
) -> None:
    api = fleet.api
    assert api is not None
    a, b = fleet.nodes[0].name, fleet.nodes[1].name
    folder = tmp_path / "sticks"
    folder.mkdir()
    image = folder / STICK
    image.write_bytes(b"field camera\n".ljust(1 << 20, b"\0"))
    loops.attach(own_device[a], image)  # plugged into node A
    config = _config(folder, [d.name for d in own_device.values()])
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    for node in fleet.nodes:
        fleet.import_image(agent_image.archive, node)
    overlay = write_fleet_dra_overlay(tmp_path / "overlay", agent_image.name, config, api.port)
    pods = Pods(api)
    claims = Claims(api, pods)
    app = "field-camera-reader"
    _TEST_LOGS.append(("DRA DaemonSet on three nodes (kubectl)", lambda: _diagnostics(fleet)))
    try:
        fleet.kubectl("apply", "-k", str(overlay))
        claims.wait_devices(DRIVER, lambda _: _offers(claims, a) is not None, "A's stick",
                            timeout=120, node=a)  # fmt: skip
        assert _offers(claims, b) is None
        _deploy(api, claims, config_file, app)
        (first, pod), *_ = _wait_replicas(api, app, 1).items()
        assert pod["spec"]["nodeName"] == a, pod["spec"]["nodeName"]
        claim = claims.get_claim(_claim_of(pod))
        (result,) = allocated_devices(claim)
        assert result["pool"] == a, result
        assert pods.seen(first).devices == {IN_CONTAINER: hex_rdev(own_device[a])}

        loops.detach(own_device[a])  # unplugged from node A
        until_sync(
            lambda: any(
                t.get("effect") == "NoExecute" for t in (_offers(claims, a) or {}).get("taints", [])
            ),
            "A keeps the stick tainted NoExecute",
            within=60,
        )
        # Evicted; the replacement waits: no node offers the stick untainted.
        until_sync(
            lambda: api.get_or_none(f"{PODS}/{first}") is None, f"{first} evicted", within=120
        )
        loops.attach(own_device[b], image)  # plugged into node B
        after = _wait_replicas(api, app, 1, gone={first})
        ((second, moved),) = after.items()
        assert moved["spec"]["nodeName"] == b, moved["spec"]["nodeName"]
        (result,) = allocated_devices(claims.get_claim(_claim_of(moved)))
        assert result["pool"] == b, result
        seen = pods.seen(second)
        assert seen.devices == {IN_CONTAINER: hex_rdev(own_device[b])}, seen
        # The evicted pod was told why (an Event from A's agent).
        told = _told(api, first)
        assert told and told[0]["reportingInstance"] == a, told
        print(f"{first} on {a} -> {second} on {b}")
    finally:
        _TEST_LOGS.clear()
        # The Deployment, its pods, the claims, the template, the class, the DaemonSet.
        _undo_drain_run(fleet, claims, overlay, app, None)


def _deploy(api: Api, claims: Claims, config_file: Path, app: str) -> None:
    """The cookbook's DeviceClass and claim template, and its Deployment with the test's
    consumer (an image the nodes have, printing the devices it sees) in its pods."""
    for device_class in generated_device_classes(config_file):
        claims.ensure_device_class(device_class)
    template, deployment = yaml.safe_load_all((EXAMPLE / "claim.yaml").read_text())
    api.create(TEMPLATES, template)
    claims.created.append(f"{TEMPLATES}/{template['metadata']['name']}")  # deleted at the end
    name = template["metadata"]["name"]
    assert deployment["spec"]["template"]["spec"]["resourceClaims"] == [
        {"name": "stick", "resourceClaimTemplateName": name}
    ]
    api.create(DEPLOYMENTS, _deployment(app, 1, name))


def _told(api: Api, pod: str) -> list[dict[str, Any]]:
    """The DeviceGone Events on ``pod``."""
    events = api.get("/apis/events.k8s.io/v1/namespaces/default/events")["items"]
    return [e for e in events if e["reason"] == "DeviceGone" and e["regarding"]["name"] == pod]
