"""Issue 14 on a real node: ``cdi-gen run --api dra`` publishes the node's loop devices as
ResourceSlices, the scheduler allocates them to claims, the kubelet prepares them through the
agent's DRA socket and the runtime injects them through CDI.

The agent runs on the host as in the device-plugin scenarios (``agent.py``), pointed at the
kubelet's plugin folders, the admin kubeconfig and a state folder of the test's own. The
DeviceClasses are the ones ``cdi-gen deviceclasses`` generates for the same config.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from loopdev import LoopDevice, LoopDevices

from cdi_gen.cdi.specnames import spec_filename
from tests.waiting import until_sync

from .agent import DRIVER, VENDOR, NodeAgent, class_config
from .claims import (
    REQUEST,
    Claims,
    allocated_devices,
    claim_consumer,
    device_attribute,
    for_extended_resource,
    generated_device_classes,
    resources_status,
    slice_devices,
)
from .cluster import NODE_NAME, Cluster
from .conftest import DraAgentFactory
from .lane import DRA_FEATURES, Lane
from .pods import Pods, phase, status
from .test_seed_lab import hex_rdev

CLASS = "fpga"
RESOURCE = f"{VENDOR}/{CLASS}"


def cdi_name(dev: LoopDevice) -> str:
    return f"{VENDOR}/{CLASS}={CLASS}-{dev.number}"


def published(devices: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Published devices by the CDI name they carry (attribute ``cdiName``)."""
    return {device_attribute(d, DRIVER, "cdiName"): d for d in devices.values()}


@dataclass
class Node:
    """What a DRA scenario uses on the node, and its one set-up step (``serve``)."""

    cluster: Cluster
    loops: LoopDevices
    start_agent: DraAgentFactory
    claims: Claims
    pods: Pods
    tmp_path: Path

    def serve(
        self, devices: Sequence[LoopDevice], state_dir: Path | None = None, **extra: object
    ) -> tuple[NodeAgent, str]:
        return serve(self.start_agent, self.claims, self.tmp_path, devices, state_dir, **extra)


@pytest.fixture
def node(
    cluster: Cluster,
    loops: LoopDevices,
    dra_agent: DraAgentFactory,
    claims: Claims,
    tmp_path: Path,
) -> Node:
    assert cluster.allocatable(RESOURCE)[1] == 0, (
        "a device plugin still offers the resource; one resource is never offered both ways"
    )
    return Node(cluster, loops, dra_agent, claims, claims.pods, tmp_path)


def serve(
    dra_agent: DraAgentFactory,
    claims: Claims,
    tmp_path: Path,
    devices: Sequence[LoopDevice],
    state_dir: Path | None = None,
    **extra: object,
) -> tuple[NodeAgent, str]:
    """Start the DRA agent for a class of exactly ``devices``, create the class's generated
    DeviceClass, wait until every device is published; the agent and the DeviceClass name."""
    config = class_config(CLASS, [d.name for d in devices], **extra)
    agent = dra_agent(config, state_dir)
    config_path = tmp_path / "deviceclasses-config.yaml"
    config_path.write_text(config)
    device_class = for_extended_resource(generated_device_classes(config_path), RESOURCE)
    claims.ensure_device_class(device_class)  # a restarted agent's test made it already
    wanted = {cdi_name(d) for d in devices}
    claims.wait_devices(
        DRIVER,
        lambda found: set(published(found)) == wanted,
        f"the node's slices publishing exactly {sorted(wanted)}",
    )
    return agent, str(device_class["metadata"]["name"])


def wait_health(pods: Pods, pod: str, cdi: str, health: str, timeout: float = 30) -> None:
    """Wait until the pod's container reports ``health`` for the device ``cdi`` (the kubelet
    names a DRA device in allocatedResourcesStatus by its first CDI ID)."""

    def seen() -> dict[str, dict[str, str]]:
        return resources_status(pods.get(pod))

    until_sync(
        lambda: any(ids.get(cdi) == health for ids in seen().values()),
        f"pod {pod}: allocatedResourcesStatus with {cdi}={health}",
        timeout,
        every=0.2,
        observe=seen,
    )


@pytest.mark.lanes("current", "oldest", "crio")
def test_dra_gates_are_on(cluster: Cluster, lane: Lane) -> None:
    """The DRA features the scenarios use are on in each component they matter to: by default
    in the current lane (which sets no gate), through the lane's alpha gates in the oldest (a
    typo in a gate name would stop the component; a gate left off would only fail later,
    obscurely)."""
    if lane.name == "current":
        assert not lane.feature_gates, "the current lane runs Kubernetes as users do: no gates"
    wanted: dict[str, set[str]] = {}
    for feature, components in DRA_FEATURES.items():
        for component in components:
            wanted.setdefault(component, set()).add(feature)
    for component, gates in wanted.items():
        reported = cluster.feature_gates(component)
        assert {g: reported.get(g) for g in gates} == dict.fromkeys(gates, True), component


#: The DRA scenario of the oldest lane (Kubernetes 1.35 with its alpha gates, containerd 1.7)
#: and of the crio lane (Kubernetes 1.36, CRI-O 1.36).
@pytest.mark.lanes("current", "oldest", "crio")
def test_claim_template_pod_gets_its_device(node: Node) -> None:
    loops, claims, pods = node.loops, node.claims, node.pods
    device = loops.add()
    _, device_class = node.serve([device])
    slice_device = published(claims.devices(DRIVER))[cdi_name(device)]
    assert device_attribute(slice_device, DRIVER, "class") == CLASS
    assert device_attribute(slice_device, DRIVER, "kernelName") == device.name
    (one,) = claims.slices(DRIVER)
    assert one["spec"]["nodeName"] == NODE_NAME and one["spec"]["pool"]["name"] == NODE_NAME
    owner = one["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", NODE_NAME)

    claims.template("one-fpga", device_class)
    claims.pod_with_template("dra-consumer", "one-fpga")
    pods.wait_running("dra-consumer")

    claim = claims.pod_claim("dra-consumer")
    (result,) = allocated_devices(claim)
    assert (result["driver"], result["pool"], result["device"]) == (
        DRIVER,
        NODE_NAME,
        slice_device["name"],
    )
    seen = pods.seen("dra-consumer")
    assert seen.devices == {str(device.path): hex_rdev(device)}
    assert seen.env == {"FPGA_DEVICE": f"{CLASS}-{device.number}"}
    # The agent's health stream reaches the pod's status through the kubelet.
    wait_health(pods, "dra-consumer", cdi_name(device), "Healthy")


@pytest.mark.lanes("current", "crio")
def test_two_devices_three_claims_third_pending(node: Node) -> None:
    loops, claims, pods = node.loops, node.claims, node.pods
    devices = [loops.add(), loops.add()]
    by_path = {str(d.path): d for d in devices}
    _, device_class = node.serve(devices)
    names = ["dra-a", "dra-b", "dra-c"]
    for name in names:
        claims.claim(f"{name}-claim", device_class)
        claims.pod_with_claim(name, f"{name}-claim")

    running, waiting, state = pods.wait_split(names, running=2)
    ((pending, message),) = waiting.items()
    assert phase(state[pending]) == "Pending"
    assert "cannot allocate all claims" in message, message
    assert allocated_devices(claims.get_claim(f"{pending}-claim")) == []

    owner: dict[str, str] = {}
    for name in running:
        seen = pods.seen(name)
        assert len(seen.devices) == 1, seen
        ((path, numbers),) = seen.devices.items()
        assert numbers == hex_rdev(by_path[path])
        owner[path] = name
    assert sorted(owner) == sorted(by_path), "both running pods got the same device"

    freed, victim = next(iter(owner.items()))
    pods.delete(victim)
    pods.wait_running(pending, timeout=90)
    assert pods.seen(pending).devices == {freed: hex_rdev(by_path[freed])}


@pytest.mark.lanes("current", "crio")
def test_extended_resource_pod_served_by_dra(node: Node) -> None:
    cluster, loops, claims, pods = node.cluster, node.loops, node.claims, node.pods
    device = loops.add()
    node.serve([device])
    # Nothing offers the resource by a device plugin now: the scheduler takes the DRA path
    # only where the node's allocatable of the extended resource is zero.
    assert cluster.allocatable(RESOURCE)[1] == 0

    pods.create("dra-extended", {RESOURCE: 1})
    pods.wait_running("dra-extended")
    claim = claims.extended_resource_claim("dra-extended")
    assert claim is not None, status(pods.get("dra-extended"))
    (result,) = allocated_devices(claim)
    assert result["driver"] == DRIVER
    seen = pods.seen("dra-extended")
    assert seen.devices == {str(device.path): hex_rdev(device)}
    assert seen.env == {"FPGA_DEVICE": f"{CLASS}-{device.number}"}

    pods.create("dra-extended-2", {RESOURCE: 1})
    message = pods.wait_unschedulable("dra-extended-2")
    assert message, status(pods.get("dra-extended-2"))


def test_unplug_withdraws_the_device_from_the_slice(node: Node) -> None:
    loops, claims, pods = node.loops, node.claims, node.pods
    devices = [loops.add(), loops.add()]
    _, device_class = node.serve(devices)
    generation = claims.slices(DRIVER)[0]["spec"]["pool"]["generation"]
    claims.template("one-fpga", device_class)
    claims.pod_with_template("holder", "one-fpga")
    pods.wait_running("holder")
    ((held, _),) = pods.seen("holder").devices.items()

    (unused,) = [d for d in devices if str(d.path) != held]
    (kept,) = [d for d in devices if str(d.path) == held]
    loops.remove(unused)
    claims.wait_devices(
        DRIVER,
        lambda found: set(published(found)) == {cdi_name(kept)},
        f"{cdi_name(unused)} withdrawn from the slice",
    )
    # Never lowered; it stays when the withdrawal is one write within one slice.
    assert claims.slices(DRIVER)[0]["spec"]["pool"]["generation"] >= generation
    assert pods.seen("holder", fresh=True).devices == {held: hex_rdev(kept)}
    assert pods.restarts("holder")[0] == 0


def test_unplug_with_taint_evicts_the_pod(node: Node) -> None:
    loops, claims, pods = node.loops, node.claims, node.pods
    device = loops.add()
    _, device_class = node.serve([device], whenGone="taint")
    claims.template("one-fpga", device_class)
    claims.pod_with_template("doomed", "one-fpga")
    pods.wait_running("doomed")
    assert pods.seen("doomed").devices == {str(device.path): hex_rdev(device)}

    loops.remove(device)
    found = claims.wait_devices(
        DRIVER,
        lambda found: any(
            t.get("effect") == "NoExecute"
            for t in published(found).get(cdi_name(device), {}).get("taints", [])
        ),
        f"{cdi_name(device)} kept in the slice with a NoExecute taint",
    )
    assert set(published(found)) == {cdi_name(device)}
    # The controller-manager's device-taint-eviction controller deletes the pod; its last
    # status says why, if the object is seen before it goes.
    reasons: set[str] = set()

    def evicted() -> bool:
        pod = pods.get("doomed")
        for c in (pod or {}).get("status", {}).get("conditions", []):
            if c["type"] == "DisruptionTarget":
                reasons.add(c.get("reason", ""))
        return pod is None

    until_sync(
        evicted, "pod doomed evicted", 60, every=0.2, observe=lambda: status(pods.get("doomed"))
    )
    pods.names.remove("doomed")
    assert reasons <= {"DeletionByDeviceTaintManager"}, reasons


def test_agent_restart_honours_prepared_claims(node: Node) -> None:
    loops, claims, pods, tmp_path = node.loops, node.claims, node.pods, node.tmp_path
    devices = [loops.add(), loops.add()]
    by_path = {str(d.path): d for d in devices}
    state = tmp_path / "state"
    first, device_class = node.serve(devices, state_dir=state)
    claims.template("one-fpga", device_class)
    claims.pod_with_template("steady", "one-fpga")
    pods.wait_running("steady")
    ((held, _),) = pods.seen("steady").devices.items()
    restarts = pods.restarts("steady")
    claim = claims.pod_claim("steady")
    assert claim is not None
    uid = claim["metadata"]["uid"]
    specs = node.cluster.cdi_run
    assert _recorded(state, specs, uid), f"no record in {state} or {specs} names claim {uid}"

    assert first.stop() == 0, first.log()
    node.serve(devices, state_dir=state)
    assert pods.restarts("steady") == restarts
    assert pods.seen("steady", fresh=True).devices == {held: hex_rdev(by_path[held])}

    # A new claim is prepared by the new agent, and the free device is the one it gets.
    claims.pod_with_template("second", "one-fpga")
    pods.wait_running("second")
    ((other, _),) = pods.seen("second").devices.items()
    assert other != held

    # The kubelet removes a pod only once its claims are unprepared: the new agent unprepares
    # the claim its predecessor prepared, and forgets it.
    pods.delete("steady")
    assert not _recorded(state, specs, uid), f"claim {uid} still recorded"


def _recorded(state: Path, specs: Path, uid: str) -> bool:
    """Whether a record of the claim survives the agent: the checkpoint in ``state`` (the one
    store of prepared claims), or a spec of its own in ``specs`` (every claim has its
    device-metadata spec, whose name carries the claim's UID), which goes with the record."""
    in_state = any(uid in f.read_text(errors="replace") for f in state.rglob("*") if f.is_file())
    return in_state or any(uid in f.name for f in specs.iterdir())


def test_kubelet_restart_republishes_slices(node: Node) -> None:
    cluster, loops, claims, pods = node.cluster, node.loops, node.claims, node.pods
    devices = [loops.add(), loops.add()]
    by_path = {str(d.path): d for d in devices}
    agent, device_class = node.serve(devices)
    claims.template("one-fpga", device_class)
    claims.pod_with_template("before", "one-fpga")
    pods.wait_running("before")
    ((held, _),) = pods.seen("before").devices.items()
    restarts = pods.restarts("before")
    before = {s["metadata"]["uid"] for s in claims.slices(DRIVER)}

    cluster.restart_kubelet()
    # The new kubelet wipes the node's slices at start; the agent must publish them again.
    wanted = {cdi_name(d) for d in devices}

    def published_anew() -> set[str]:
        # One listing for both questions: an old slice's devices listed just before the wipe
        # and no slice at all listed just after it would look like a republish.
        found = claims.slices(DRIVER)
        uids = {s["metadata"]["uid"] for s in found}
        anew = set(published(slice_devices(found))) == wanted and not before & uids
        return uids if anew else set()

    republished = until_sync(
        published_anew, "the node's slices published anew after the kubelet restart", 60
    )
    assert agent.running()

    assert pods.restarts("before") == restarts
    assert pods.seen("before", fresh=True).devices == {held: hex_rdev(by_path[held])}
    claims.pod_with_template("after", "one-fpga")
    pods.wait_running("after", timeout=90)
    ((other, _),) = pods.seen("after").devices.items()
    assert other != held
    # And they stayed: a pod scheduled and prepared since is the later event showing the new
    # kubelet is past its start-up, and the very slices republished are still there (a wipe
    # pending behind the republish, even one the agent then repaired, changes their uids).
    assert set(published(claims.devices(DRIVER))) == wanted
    assert {s["metadata"]["uid"] for s in claims.slices(DRIVER)} == republished


@pytest.mark.lanes("oldest")  # DRAConsumableCapacity off: slots (by capacity: test_sharing)
def test_shared_device_slots_go_to_two_pods_and_no_more(node: Node) -> None:
    """``sharing: {replicas: 2}`` through DRA: two slot devices consuming one ``slots: 2``
    counter of their physical device; two claims get the same device node, a third waits."""
    loops, claims, pods, tmp_path = node.loops, node.claims, node.pods, node.tmp_path
    device = loops.add()
    config = class_config(CLASS, [device.name], replicas=2)
    node.start_agent(config, None)
    config_path = tmp_path / "deviceclasses-config.yaml"
    config_path.write_text(config)
    device_class = for_extended_resource(generated_device_classes(config_path), RESOURCE)
    claims.ensure_device_class(device_class)
    slots = {f"{cdi_name(device)}-{i}" for i in range(2)}
    found = claims.wait_devices(
        DRIVER, lambda found: set(published(found)) == slots, f"slots {sorted(slots)} published"
    )
    counter_sets = [s for s in claims.slices(DRIVER) for s in s["spec"].get("sharedCounters") or ()]
    assert [{k: v["value"] for k, v in c["counters"].items()} for c in counter_sets] == [
        {"slots": "2"}
    ], counter_sets
    for slot in found.values():
        (consumes,) = slot["consumesCounters"]
        assert consumes["counterSet"] == counter_sets[0]["name"]
        assert consumes["counters"] == {"slots": {"value": "1"}}

    names = ["share-a", "share-b", "share-c"]
    for name in names:
        claims.claim(f"{name}-claim", str(device_class["metadata"]["name"]))
        claims.pod_with_claim(name, f"{name}-claim")
    running, _, _ = pods.wait_split(names, running=2)
    for name in running:
        assert pods.seen(name).devices == {str(device.path): hex_rdev(device)}
    got = {allocated_devices(claims.get_claim(f"{n}-claim"))[0]["device"] for n in running}
    assert got == {d["name"] for d in found.values()}, "both pods got the same slot"


def test_a_device_is_in_the_slice_only_while_its_spec_entry_is_on_disk(node: Node) -> None:
    """The ordering of the device plugin, through DRA: on hotplug the CDI entry is written
    before the device enters the slice; on unplug the device leaves the slice before its
    entry leaves the spec. Sampled as fast as the API answers, in the order that catches a
    violation: slice then spec while adding, spec then slice while removing."""
    cluster, loops, claims = node.cluster, node.loops, node.claims
    present, hot = loops.add(), loops.reserve()
    node.start_agent(class_config(CLASS, [present.name, hot.name]), None)
    claims.wait_devices(
        DRIVER, lambda found: cdi_name(present) in published(found), "the first device"
    )
    spec = cluster.cdi_run / spec_filename(VENDOR, CLASS)
    entry = f'"{CLASS}-{hot.number}"'

    def in_slice() -> bool:
        return cdi_name(hot) in published(claims.devices(DRIVER))

    def in_spec() -> bool:
        return spec.exists() and entry in spec.read_text()

    loops.add(hot)
    deadline = time.monotonic() + 30
    while not in_slice():
        assert time.monotonic() < deadline, "the hotplugged device never entered the slice"
    assert in_spec(), f"{cdi_name(hot)} in the slice before its entry is in {spec}"

    loops.remove(hot)
    deadline = time.monotonic() + 30
    while in_spec():
        assert time.monotonic() < deadline, "the unplugged device's entry never left the spec"
    assert not in_slice(), f"{cdi_name(hot)} still in the slice after its entry left {spec}"
    assert cdi_name(present) in published(claims.devices(DRIVER))


def test_an_unhealthy_device_reaches_the_pod_status_and_is_tainted(node: Node) -> None:
    """A class with a health check: a loop device with a backing file is healthy; detaching
    the file (size 0) makes it unhealthy, which the kubelet shows in the pod's status from
    the agent's health stream, and the slice marks with a NoSchedule taint."""
    loops, claims, pods, tmp_path = node.loops, node.claims, node.pods, node.tmp_path
    device = loops.add()
    backing = tmp_path / "backing.img"
    backing.write_bytes(b"\0" * 4096)
    loops.attach(device, backing)
    _, device_class = node.serve([device], health={"attributes": {"size": "[1-9]*"}})
    claims.template("one-fpga", device_class)
    claims.pod_with_template("watched", "one-fpga")
    pods.wait_running("watched")
    wait_health(pods, "watched", cdi_name(device), "Healthy")

    loops.detach(device)
    wait_health(pods, "watched", cdi_name(device), "Unhealthy")
    found = claims.wait_devices(
        DRIVER,
        lambda found: any(
            t.get("key") == f"{DRIVER}/unhealthy" and t.get("effect") == "NoSchedule"
            for t in published(found).get(cdi_name(device), {}).get("taints", [])
        ),
        f"{cdi_name(device)} tainted unhealthy (NoSchedule)",
    )
    assert set(published(found)) == {cdi_name(device)}
    # NoSchedule: the pod that holds the device keeps running.
    assert pods.restarts("watched")[0] == 0 and phase(pods.get("watched")) == "Running"


#: Prints the claim named in the device metadata file (KEP-5304) of the pod's claim, which
#: has no configuration: the file reaches it through the claim's metadata spec.
_METADATA_SCRIPT = """\
trap 'exit 0' TERM
while true; do
  echo BEGIN
  echo "ENV META=$(head -n 1 {path} 2>&1 | grep -o '"name":"[a-z0-9-]*"' | head -n 1)"
  echo END
  sleep 2 & wait
done
"""


def _our_status(claims: Claims, name: str) -> list[dict[str, Any]]:
    claim = claims.get_claim(name) or {}
    entries = claim.get("status", {}).get("devices") or []
    return [e for e in entries if e.get("driver") == DRIVER]


@pytest.mark.lanes("current", "oldest")
def test_a_plain_claim_gets_its_metadata_and_its_status(node: Node) -> None:
    """Issue 36 items 4 and 5: a claim without configuration reads its device metadata file,
    and the claim's status shows what it got (Ready, the CDI names, the host node) until
    the pod is gone."""
    claims, pods = node.claims, node.pods
    device = node.loops.add()
    _, device_class = node.serve([device])
    claims.claim("meta-claim", device_class)
    pod = claim_consumer("meta", claim="meta-claim")
    (container,) = pod["spec"]["containers"]
    path = (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/meta-claim/"
        f"{REQUEST}/{DRIVER}-metadata.json"
    )
    container["command"] = ["sh", "-c", _METADATA_SCRIPT.replace("{path}", path)]
    pods.add(pod)
    pods.wait_running("meta")
    assert pods.seen("meta").env == {"META": '"name":"meta-claim"'}

    until_sync(
        lambda: bool(_our_status(claims, "meta-claim")),
        "our entry in the claim's status.devices",
        30,
        every=0.2,
        observe=lambda: claims.get_claim("meta-claim"),
    )
    (entry,) = _our_status(claims, "meta-claim")
    (result,) = allocated_devices(claims.get_claim("meta-claim"))
    assert (entry["pool"], entry["device"]) == (result["pool"], result["device"])
    (ready,) = entry["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
    assert entry["data"]["cdiDeviceIDs"][0] == cdi_name(device)
    assert entry["data"]["deviceNodes"] == [str(device.path)]

    pods.delete("meta")
    until_sync(
        lambda: not _our_status(claims, "meta-claim"),
        "our entry gone from the claim's status once the pod is gone",
        60,
        every=0.5,
        observe=lambda: claims.get_claim("meta-claim"),
    )
