"""Several nodes (issue 20, current lane): three kubelets, each with its own containerd, mount
namespace, name, ports and pod subnet, against one control plane (``fleet``).

The seed lab across nodes: the DaemonSet as shipped (``write_fleet_overlay``) on all three,
two ``example.com/fpga`` loop devices per node, seven pods asking one each: six run, at most two
on a node, each with its own node's device; the seventh waits with the scheduler's message.
The same with the DRA variant (``write_fleet_dra_overlay``): one pool per node, seven pods with
a claim template, each claim allocated from the pool of its pod's node; the seventh takes the
device a deleted pod freed.

Drain: a Deployment of three pods, each with a claim from a ResourceClaimTemplate;
``kubectl drain`` of a node evicts its pods, whose claims that node's agent unprepares (log and
checkpoint) and which are deleted with them; the replacements run on the other nodes with new
claims from those nodes' pools, prepared by their agents, each with a device no other pod has.

The nodes share this machine's devices; each node's mount namespace hides the other nodes'
loop devices in sysfs (``fleet.devices_per_node``), so that one ConfigMap naming all six
devices is what every agent gets, as on real machines, and each agent finds only its own two.

Not here: hotplug on one node after the DaemonSet started, shown to reach that node only. It
cannot be done faithfully on one machine. Uevents go to every listener of a network namespace,
and the agents use the host's (hostNetwork: in a pod's own namespace they would get none), so
all three receive the add of any new device, with its udev properties in the message; on
separate machines each kernel tells only its own agent. Hiding the new device from two nodes
does not stand in for that either: its sysfs folder exists only once it was added (the event
is on its way by then), and a mount made in a node's namespace after the agent's container
started does not reach that container (hostPath volumes mount with propagation None). What an
agent made of such an event would depend on which sysfs files its config happens to read, not
on what a second machine would do. Hotplug itself is proven on one node (test_hotplug.py).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loopdev import LoopDevice, LoopDevices

from tests.waiting import until_sync

from .agent import DRIVER
from .api import Api
from .claims import CLAIMS as CLAIMS_PATH
from .claims import Claims, allocated_devices, claim_consumer, device_attribute
from .cluster import Cluster, Node
from .conftest import _TEST_LOGS, FLEET_NODES
from .daemonset import (
    NAMESPACE,
    SELECTOR,
    loop_fpga_config,
    write_fleet_dra_overlay,
    write_fleet_overlay,
)
from .fleet import devices_per_node
from .image import AgentImage
from .pods import PODS, Pods, phase
from .test_seed_lab import RESOURCE, hex_rdev

# A cold agent image build takes minutes (see image.py); the scenario itself about one.
pytestmark = pytest.mark.timeout(900)

#: The shipped DeviceClass of the fpga class (deploy/kubernetes/dra/deviceclasses.yaml).
FPGA_CLASS = "fpga.example.com"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


def _wait_every_node(fleet: Cluster, count: int, timeout: float = 120) -> None:
    """Until every Node advertises ``count`` devices (capacity and allocatable)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = {n.name: fleet.allocatable(RESOURCE, n.name) for n in fleet.nodes}
        if all(v == (count, count) for v in seen.values()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{RESOURCE} (capacity, allocatable) per node: {seen}")
        time.sleep(0.2)


def _diagnostics(fleet: Cluster) -> str:
    parts = []
    for args in (
        ("get", "pods", "-A", "-o", "wide"),
        ("-n", NAMESPACE, "logs", "-l", SELECTOR, "--tail=60", "--prefix"),
    ):
        parts.append(f"----- kubectl {' '.join(args)}\n{fleet.kubectl(*args, check=False)}")
    return "\n".join(parts)


@pytest.fixture
def own_devices(fleet: Cluster, loops: LoopDevices) -> Iterator[dict[str, list[LoopDevice]]]:
    """Two loop devices per node, each hidden from the other nodes; node name -> devices."""
    with devices_per_node(fleet, loops) as devices:
        yield devices


def test_seed_lab_across_three_nodes(
    fleet: Cluster,
    own_devices: dict[str, list[LoopDevice]],
    agent_image: AgentImage,
    tmp_path: Path,
) -> None:
    assert fleet.api is not None
    assert len(fleet.nodes) == FLEET_NODES
    every = [d for theirs in own_devices.values() for d in theirs]
    for node in fleet.nodes:
        fleet.import_image(agent_image.archive, node)
    overlay = write_fleet_overlay(
        tmp_path / "overlay",
        agent_image.name,
        loop_fpga_config([d.name for d in every], dfl_path=False),
        fleet.api.port,
    )
    pods = Pods(fleet.api)
    _TEST_LOGS.append(("DaemonSet on three nodes (kubectl)", lambda: _diagnostics(fleet)))
    try:
        fleet.kubectl("apply", "-k", str(overlay))
        _wait_every_node(fleet, 2)
        agents = fleet.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={SELECTOR}")
        placed = sorted(p["spec"]["nodeName"] for p in agents["items"])
        assert placed == sorted(n.name for n in fleet.nodes), placed

        names = [f"fpga-consumer-{i}" for i in range(7)]
        for name in names:
            pods.create(name, {RESOURCE: 1})
        running, waiting, state = pods.wait_split(names, running=6, timeout=120)
        ((pending, message),) = waiting.items()
        assert phase(state[pending]) == "Pending"
        assert f"Insufficient {RESOURCE}" in message, message

        per_node: Counter[str] = Counter()
        owner: dict[str, str] = {}
        for name in running:
            pod = state[name]
            assert pod is not None
            node = pod["spec"]["nodeName"]
            per_node[node] += 1
            seen = pods.seen(name)
            assert len(seen.devices) == 1, seen
            ((path, numbers),) = seen.devices.items()
            # Its own node's device, with the host's numbers, and no one else's.
            mine = {str(d.path): d for d in own_devices[node]}
            assert path in mine, (name, node, seen)
            assert numbers == hex_rdev(mine[path])
            assert seen.env == {"FPGA_DEVICE": f"fpga-{mine[path].number}"}
            assert path not in owner, f"{name} and {owner.get(path)} both got {path}"
            owner[path] = name
        assert all(count <= 2 for count in per_node.values()), per_node
        assert sorted(owner) == sorted(str(d.path) for d in every)
        # For the report (pytest -rA): what starting three nodes took, step by step.
        print("three-node start-up, s:", {k: round(v, 2) for k, v in fleet.timings.items()})
    finally:
        _TEST_LOGS.clear()
        pods.delete_all()
        fleet.kubectl(
            "delete", "--wait", "--cascade=foreground", "--ignore-not-found", "-k", str(overlay)
        )
        # The agents remove their specs on an uninstall (test_uninstall.py); whatever a
        # failed run left goes here, so the next test starts clean.
        for node in fleet.nodes:
            for spec in node.cdi_run.glob("*"):
                spec.unlink()


def test_dra_three_pools_allocate_where_devices_are_free(
    fleet: Cluster,
    own_devices: dict[str, list[LoopDevice]],
    agent_image: AgentImage,
    tmp_path: Path,
) -> None:
    """The DRA variant as shipped on three nodes: one pool per node holding that node's two
    devices; seven pods with a claim template each: six claims allocated, each from the pool
    of the node its pod runs on; the seventh waits until a device is freed, then takes it on
    that node."""
    api = fleet.api
    assert api is not None
    every = [d for theirs in own_devices.values() for d in theirs]
    for node in fleet.nodes:
        fleet.import_image(agent_image.archive, node)
    overlay = write_fleet_dra_overlay(
        tmp_path / "overlay",
        agent_image.name,
        loop_fpga_config([d.name for d in every], dfl_path=False),
        api.port,
    )
    pods = Pods(api)
    claims = Claims(api, pods)
    _TEST_LOGS.append(("DRA DaemonSet on three nodes (kubectl)", lambda: _diagnostics(fleet)))
    try:
        fleet.kubectl("apply", "-k", str(overlay))
        for node in fleet.nodes:
            wanted = {f"{RESOURCE}=fpga-{d.number}" for d in own_devices[node.name]}

            def published(found: dict[str, Any], wanted: set[str] = wanted) -> bool:
                # Only the fpga class: the shipped config's others (kvm) match the host too.
                names = {device_attribute(d, DRIVER, "cdiName") for d in found.values()}
                return {n for n in names if n.startswith(f"{RESOURCE}=")} == wanted

            claims.wait_devices(
                DRIVER, published, f"{node.name}'s own two devices", timeout=120, node=node.name
            )

        claims.template("fpga", FPGA_CLASS)
        names = [f"dra-consumer-{i}" for i in range(7)]
        for name in names:
            claims.pod_with_template(name, "fpga")
        running, waiting, state = pods.wait_split(names, running=6, timeout=120)
        ((pending, message),) = waiting.items()
        assert "cannot allocate all claims" in message, message

        per_node: Counter[str] = Counter()
        for name in running:
            pod = state[name]
            assert pod is not None
            node = pod["spec"]["nodeName"]
            per_node[node] += 1
            (result,) = allocated_devices(claims.pod_claim(name))
            assert (result["driver"], result["pool"]) == (DRIVER, node), result
            _assert_own_device(pods, name, own_devices[node])
        assert all(count <= 2 for count in per_node.values()), per_node

        # A device freed on one node: the waiting pod's claim is allocated there.
        victim = running[0]
        victim_pod = state[victim]
        assert victim_pod is not None
        freed_on = victim_pod["spec"]["nodeName"]
        pods.delete(victim)
        moved = pods.wait_running(pending, timeout=120)
        assert moved["spec"]["nodeName"] == freed_on
        (result,) = allocated_devices(claims.pod_claim(pending))
        assert result["pool"] == freed_on, result
        _assert_own_device(pods, pending, own_devices[freed_on])
    finally:
        _TEST_LOGS.clear()
        # Pods first, while the agents run: the kubelet removes a pod only after its claims
        # were unprepared.
        pods.delete_all()
        claims.delete_all()
        fleet.kubectl(
            "delete", "--wait", "--cascade=foreground", "--ignore-not-found", "-k", str(overlay)
        )
        for node in fleet.nodes:
            claims.delete_slices(DRIVER, node.name)
            for spec in node.cdi_run.glob("*"):
                spec.unlink()


def _assert_own_device(pods: Pods, name: str, mine: list[LoopDevice]) -> None:
    """The pod sees exactly one device, one of ``mine``, with the host's numbers."""
    seen = pods.seen(name)
    assert len(seen.devices) == 1, (name, seen)
    ((path, numbers),) = seen.devices.items()
    by_path = {str(d.path): d for d in mine}
    assert path in by_path, (name, seen, sorted(by_path))
    assert numbers == hex_rdev(by_path[path])


def _wait_pools(claims: Claims, own_devices: dict[str, list[LoopDevice]]) -> None:
    """Until every node's pool publishes exactly its own two fpga devices."""
    for node, mine in own_devices.items():
        wanted = {f"{RESOURCE}=fpga-{d.number}" for d in mine}

        def published(found: dict[str, Any], wanted: set[str] = wanted) -> bool:
            # Only the fpga class: the shipped config's others (kvm) match the host too.
            names = {device_attribute(d, DRIVER, "cdiName") for d in found.values()}
            return {n for n in names if n.startswith(f"{RESOURCE}=")} == wanted

        claims.wait_devices(DRIVER, published, f"{node}'s own two devices", timeout=120, node=node)


def _deployment(name: str, replicas: int, template: str) -> dict[str, Any]:
    """A Deployment of consumer pods, each with a claim made from ``template``."""
    pod = claim_consumer(name, template=template)
    pod["metadata"] = {"labels": {"app": name}}
    pod["spec"]["restartPolicy"] = "Always"  # the only policy a Deployment takes
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": pod,
        },
    }


def _running_replicas(api: Api, app: str) -> dict[str, dict[str, Any]]:
    """The Deployment's pods that run and are not being deleted, by name."""
    items = api.get(f"{PODS}?labelSelector=app%3D{app}")["items"]
    return {
        p["metadata"]["name"]: p
        for p in items
        if phase(p) == "Running" and not p["metadata"].get("deletionTimestamp")
    }


def _wait_replicas(
    api: Api, app: str, count: int, gone: set[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Until ``count`` pods of ``app`` run, none of them one of ``gone``; those pods."""

    def ready() -> dict[str, dict[str, Any]]:
        running = _running_replicas(api, app)
        return running if len(running) == count and not set(running) & (gone or set()) else {}

    return until_sync(
        ready, f"{count} Running replicas of {app}, none of {sorted(gone or ())}", within=120
    )


def _claim_of(pod: dict[str, Any]) -> str:
    (entry,) = pod["status"]["resourceClaimStatuses"]
    name: str = entry["resourceClaimName"]
    return name


def _claim_records(node: Node) -> str:
    """What the node's agent keeps of its prepared claims, as it sees it inside the node's
    mount namespace (the DaemonSet's hostPaths), reached through its holder process: the DRA
    checkpoint in /var/lib/cdi-gen, and the names of the claim specs in /var/run/cdi (every
    prepared claim has one for its device metadata; the name carries the claim's UID)."""
    assert node.namespace is not None and node.namespace.holder is not None
    root = Path(f"/proc/{node.namespace.holder.pid}/root")
    state = root / "var/lib/cdi-gen"
    records = "".join(f.read_text(errors="replace") for f in sorted(state.glob("dra-*.json")))
    specs = node.namespace.cdi_run  # the node's /var/run/cdi, bound from here
    return records + "\n".join(f.name for f in sorted(specs.glob("*")))


def test_drain_moves_dra_pods_to_other_nodes_with_new_claims(
    fleet: Cluster,
    own_devices: dict[str, list[LoopDevice]],
    agent_image: AgentImage,
    tmp_path: Path,
) -> None:
    """``kubectl drain`` of a node running a pod of a Deployment whose pods each get a claim
    from a ResourceClaimTemplate: the pod is evicted, its claim unprepared by that node's agent
    (still running: drain leaves DaemonSet pods) and deleted with the pod; the replacement pod
    gets a new claim, allocated from the pool of another node and prepared by that node's
    agent, with a device of its own."""
    api = fleet.api
    assert api is not None
    every = [d for theirs in own_devices.values() for d in theirs]
    for node in fleet.nodes:
        fleet.import_image(agent_image.archive, node)
    overlay = write_fleet_dra_overlay(
        tmp_path / "overlay",
        agent_image.name,
        loop_fpga_config([d.name for d in every], dfl_path=False),
        api.port,
    )
    pods = Pods(api)
    claims = Claims(api, pods)
    app = "drained"
    drained: str | None = None
    _TEST_LOGS.append(("DRA DaemonSet on three nodes (kubectl)", lambda: _diagnostics(fleet)))
    try:
        fleet.kubectl("apply", "-k", str(overlay))
        _wait_pools(claims, own_devices)
        claims.template("fpga", FPGA_CLASS)
        api.create(DEPLOYMENTS, _deployment(app, len(fleet.nodes), "fpga"))
        before = _wait_replicas(api, app, len(fleet.nodes))
        victim = next(iter(before.values()))
        drained = victim["spec"]["nodeName"]
        moved = {n for n, p in before.items() if p["spec"]["nodeName"] == drained}
        old_claims = {}
        for name in moved:
            obj = claims.get_claim(_claim_of(before[name]))
            assert obj is not None
            old_claims[obj["metadata"]["name"]] = obj["metadata"]["uid"]
            (result,) = allocated_devices(obj)
            assert result["pool"] == drained, result
            assert obj["metadata"]["uid"] in _claim_records(_node(fleet, drained))

        fleet.kubectl(
            "drain", drained, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s",
            timeout=180,
        )  # fmt: skip

        after = _wait_replicas(api, app, len(fleet.nodes), gone=moved)
        used: dict[str, str] = {}
        for name, pod in after.items():
            node = pod["spec"]["nodeName"]
            assert node != drained, (name, node)
            claim = claims.get_claim(_claim_of(pod))
            (result,) = allocated_devices(claim)
            # Allocated from the pool of the node it runs on, prepared by that node's agent.
            assert (result["driver"], result["pool"]) == (DRIVER, node), result
            assert claim is not None and claim["metadata"]["uid"] in _claim_records(
                _node(fleet, node)
            )
            _assert_own_device(pods, name, own_devices[node])
            ((path, _),) = pods.seen(name).devices.items()
            assert path not in used, f"{name} and {used.get(path)} both got {path}"
            used[path] = name

        # The old claims: unprepared on the drained node (its agent's log and checkpoint
        # say so) and deleted with their pods.
        for name, uid in old_claims.items():
            api.wait_for(f"{CLAIMS_PATH}/{name}", lambda o: o is None, 60, f"claim {name} gone")
            assert uid not in _claim_records(_node(fleet, drained))
        new_claims = {
            _claim_of(p): p["spec"]["nodeName"] for n, p in after.items() if n not in before
        }
        _assert_agents_logged(fleet, drained, set(old_claims), new_claims)
        # For the report (pytest -rA): where the replicas ran before and after.
        print(
            f"drained {drained}:",
            {n: p["spec"]["nodeName"] for n, p in before.items()},
            "->",
            {n: p["spec"]["nodeName"] for n, p in after.items()},
        )
    finally:
        _TEST_LOGS.clear()
        _undo_drain_run(fleet, claims, overlay, app, drained)


def _undo_drain_run(
    fleet: Cluster, claims: Claims, overlay: Path, app: str, drained: str | None
) -> None:
    """The node uncordoned; the Deployment's pods deleted while the agents run (the kubelet
    removes a pod only after its claims were unprepared), then the claims and the DaemonSet;
    whatever slices and specs are left removed."""
    api = fleet.api
    assert api is not None
    if drained is not None:
        fleet.kubectl("uncordon", drained, check=False)
    api.delete(f"{DEPLOYMENTS}/{app}")
    until_sync(
        lambda: not api.get(f"{PODS}?labelSelector=app%3D{app}")["items"],
        f"the pods of {app} gone",
        within=120,
    )
    claims.delete_all()
    fleet.kubectl(
        "delete", "--wait", "--cascade=foreground", "--ignore-not-found", "-k", str(overlay)
    )
    for node in fleet.nodes:
        claims.delete_slices(DRIVER, node.name)
        for spec in node.cdi_run.glob("*"):
            spec.unlink()


def _node(fleet: Cluster, name: str) -> Node:
    (node,) = [n for n in fleet.nodes if n.name == name]
    return node


def _agent_on(api: Api, node: str) -> str:
    """The name of the agent pod on ``node``."""
    items = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={SELECTOR}")["items"]
    (name,) = [p["metadata"]["name"] for p in items if p["spec"].get("nodeName") == node]
    return str(name)


def _assert_agents_logged(
    fleet: Cluster, drained: str, unprepared: set[str], prepared: dict[str, str]
) -> None:
    """The drained node's agent logged unpreparing each of ``unprepared``; the agent of each
    claim's node in ``prepared`` (claim -> node) logged preparing it."""
    assert fleet.api is not None
    log = fleet.kubectl(
        "-n", NAMESPACE, "logs", "-l", SELECTOR, "--prefix", "--tail=-1",
        "--max-log-requests=10",
    ).splitlines()  # fmt: skip
    wanted = [(drained, f"unprepared claim default/{name} ") for name in unprepared]
    wanted += [(node, f"prepared claim default/{name} ") for name, node in prepared.items()]
    for node, text in wanted:
        agent = _agent_on(fleet.api, node)
        assert any(f"[pod/{agent}/" in line and text in line for line in log), (
            f"{agent} on {node} did not log {text!r}"
        )
