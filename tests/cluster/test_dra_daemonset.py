"""The DRA variant as shipped: ``kubectl apply -k deploy/kubernetes/dra`` (through the overlay
of ``daemonset.py``) runs the agent image as a DaemonSet pod with its ServiceAccount, RBAC and
DeviceClasses, and the README's unchanged example consumer (``limits: {example.com/fpga: 1}``)
gets its device through DRA: the DeviceClass maps the extended resource to a claim.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from loopdev import LoopDevices

from tests.waiting import until_sync

from .agent import DRIVER
from .claims import Claims, allocated_devices, device_attribute
from .cluster import NODE_NAME, Cluster
from .daemonset import DEPLOY_DRA, NAME, NAMESPACE, loop_fpga_config, write_dra_overlay
from .image import AgentImage
from .lane import Lane
from .pods import NAMESPACE as POD_NAMESPACE
from .test_daemonset import (
    EXAMPLE,
    EXAMPLE_POD,
    agent_pods,
    http_status,
    shipped_run,
    wait_agent_ready,
)

pytestmark = pytest.mark.timeout(900)

RESOURCE = "example.com/fpga"
#: The shipped CDI_GEN_PLUGINS_REGISTRY_DIR: the kubelet's plugin watcher.
PLUGINS_REGISTRY = "/var/lib/kubelet/plugins_registry"


def test_dra_overlay_renders_with_the_release_kubectl(lane: Lane) -> None:
    """`kubectl kustomize deploy/kubernetes/dra` builds (kustomize refuses, e.g., an overlay
    inside its base's folder) and holds the agent, its account, its slice policy and the
    DeviceClasses."""
    kubectl = lane.binaries(allow_build=False).path("kubectl")
    proc = subprocess.run(
        [str(kubectl), "kustomize", str(DEPLOY_DRA)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {
        ("ServiceAccount", "cdi-gen"),
        ("ClusterRole", "cdi-gen-dra"),
        ("ClusterRoleBinding", "cdi-gen-dra"),
        ("ValidatingAdmissionPolicy", "cdi-gen-slices"),
        ("ValidatingAdmissionPolicyBinding", "cdi-gen-slices"),
        ("ConfigMap", "cdi-gen-config"),
        ("DaemonSet", "cdi-gen"),
    } <= kinds, kinds
    assert any(kind == "DeviceClass" for kind, _ in kinds), kinds
    # Cluster-scoped, so kustomize must not have given them the base's namespace.
    policies = [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")]
    assert all("namespace" not in d["metadata"] for d in policies), policies


@pytest.fixture
def shipped_dra_daemonset(
    cluster: Cluster, agent_image: AgentImage, claims: Claims, tmp_path: Path
) -> Iterator[tuple[Path, int]]:
    """:func:`shipped_run` of the DRA DaemonSet; its slices are deleted at the end too."""
    with shipped_run(cluster, agent_image, tmp_path, "DRA DaemonSet") as run:
        yield run
    claims.delete_slices(DRIVER)
    assert not agent_pods(cluster), "the DaemonSet's pod outlived its deletion"


#: On CRI-O too (Kubernetes 1.36, CRI-O 1.36).
@pytest.mark.lanes("current", "crio")
def test_dra_daemonset_as_shipped_serves_the_example_consumer(
    cluster: Cluster,
    loops: LoopDevices,
    claims: Claims,
    shipped_dra_daemonset: tuple[Path, int],
    agent_image: AgentImage,
) -> None:
    overlay, port = shipped_dra_daemonset
    assert cluster.allocatable(RESOURCE)[1] == 0, "a device plugin still offers the resource"
    device = loops.add()
    assert cluster.api is not None
    write_dra_overlay(
        overlay, agent_image.name, loop_fpga_config([device.name]), port, cluster.api.port
    )

    out = cluster.kubectl("apply", "-k", str(overlay))
    for created in (
        "serviceaccount/cdi-gen created",
        "clusterrole.rbac.authorization.k8s.io/cdi-gen-dra created",
        "clusterrolebinding.rbac.authorization.k8s.io/cdi-gen-dra created",
        "daemonset.apps/cdi-gen created",
    ):
        assert created in out, out
    assert re.search(r"^deviceclass\.resource\.k8s\.io/\S+ created$", out, re.M), out

    pod = wait_agent_ready(cluster)
    assert pod["spec"]["serviceAccountName"] == "cdi-gen"
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert http_status(f"http://127.0.0.1:{port}/readyz") == 200

    # Published through the API with the pod's own token (RBAC as shipped), for the node
    # named by the downward API.
    cdi = f"example.com/fpga=fpga-{device.number}"
    claims.wait_devices(
        DRIVER,
        lambda found: any(device_attribute(d, DRIVER, "cdiName") == cdi for d in found.values()),
        f"{cdi} published by the DaemonSet's agent",
        timeout=60,
    )

    out = cluster.kubectl("apply", "-f", str(EXAMPLE))
    assert "pod/fpga-consumer created" in out, out
    example = cluster.api.wait_for(
        EXAMPLE_POD,
        lambda p: p is not None and p.get("status", {}).get("phase") == "Running",
        120,
        "example pod fpga-consumer Running",
    )
    assert example is not None
    # Served by DRA: the scheduler made a claim for the extended resource.
    name = (example["status"].get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    assert name, example["status"]
    (result,) = allocated_devices(claims.get_claim(name))
    assert (result["driver"], result["pool"]) == (DRIVER, NODE_NAME)
    # Its status written with the pod's token: the RBAC as shipped grants resourceclaims/status
    # and, from 1.36, resourceclaims/driver for claims of its own node.

    def ours() -> list[dict[str, object]]:
        entries = (claims.get_claim(name) or {}).get("status", {}).get("devices") or []
        return [e for e in entries if e.get("driver") == DRIVER]

    until_sync(lambda: bool(ours()), "the claim's status.devices entry", 30, every=0.5)
    assert ours()[0]["device"] == result["device"]

    def example_log() -> str:
        return cluster.api.text(f"{EXAMPLE_POD}/log")

    until_sync(
        lambda: "FPGA_DEVICE=" in example_log(),
        "output from the example pod",
        30,
        every=0.5,
        observe=example_log,
    )
    log = example_log()
    major, minor = device.rdev()
    node = re.search(rf"^b\S+\s+\d+\s+\S+\s+\S+\s+{major},\s+{minor}\s.*(/dev/\S+)$", log, re.M)
    assert node is not None, log
    assert node.group(1) == f"/dev/dfl-port.{device.number}", log
    assert f"FPGA_DEVICE=fpga-{device.number}" in log.splitlines(), log
    print(f"example pod output:\n{log}")


def _events(cluster: Cluster, namespace: str, pod: str, reason: str) -> list[str]:
    """The messages of ``pod``'s events for ``reason``."""
    assert cluster.api is not None
    selector = f"involvedObject.name={pod},reason={reason}"
    events = cluster.api.get(f"/api/v1/namespaces/{namespace}/events?fieldSelector={selector}")
    return [str(e.get("message", "")) for e in events["items"]]


#: The kubelet's own GET of a claim, refused by the API server's node authorizer while its
#: graph does not yet link the node to the pod's new claim (it lags under load, and the
#: kubelet retries): the event names it, but no driver was asked anything.
_AUTHORIZER_LAG = "no relationship found between node"


def _prepare_failures(cluster: Cluster, pod: str) -> list[str]:
    """The kubelet's FailedPrepareDynamicResources events of ``pod``: a NodePrepareResources
    that found no driver, or one that failed (not the node authorizer's lag before any
    call)."""
    found = _events(cluster, POD_NAMESPACE, pod, "FailedPrepareDynamicResources")
    return [message for message in found if _AUTHORIZER_LAG not in message]


def _serving_one_device(
    cluster: Cluster,
    loops: LoopDevices,
    claims: Claims,
    shipped_dra_daemonset: tuple[Path, int],
    agent_image: AgentImage,
) -> tuple[dict[str, Any], Callable[[dict[str, dict[str, Any]]], bool]]:
    """The shipped DaemonSet serving one new loop device: its Ready pod, and the check that
    the device is published."""
    overlay, port = shipped_dra_daemonset
    device = loops.add()
    assert cluster.api is not None
    write_dra_overlay(
        overlay, agent_image.name, loop_fpga_config([device.name]), port, cluster.api.port
    )
    cluster.kubectl("apply", "-k", str(overlay))
    pod = wait_agent_ready(cluster)
    cdi = f"example.com/fpga=fpga-{device.number}"

    def published(found: dict[str, dict[str, Any]]) -> bool:
        return any(device_attribute(d, DRIVER, "cdiName") == cdi for d in found.values())

    claims.wait_devices(DRIVER, published, f"{cdi} published", timeout=60)
    return pod, published


def test_dra_daemonset_rolls_without_a_gap(
    cluster: Cluster,
    loops: LoopDevices,
    claims: Claims,
    shipped_dra_daemonset: tuple[Path, int],
    agent_image: AgentImage,
) -> None:
    """A changed DaemonSet rolls with surge (two agents of the driver, each with its pod's
    sockets) while pods with claims start one after another: every pod starts, and the
    kubelet never fails a NodePrepareResources."""
    old, _ = _serving_one_device(cluster, loops, claims, shipped_dra_daemonset, agent_image)
    claims.template("rolling", "fpga.example.com")

    pods = claims.pods
    started: list[str] = []
    failures: dict[str, list[str]] = {}

    def one_pod() -> None:
        name = f"rolling-{len(started)}"
        claims.pod_with_template(name, "rolling")
        pods.wait_running(name, timeout=120)
        started.append(name)
        found = _prepare_failures(cluster, name)
        if found:
            failures[name] = found
        pods.delete(name, timeout=120)  # unprepared by whichever agent the kubelet picks

    one_pod()
    # A changed pod template rolls the DaemonSet, as a changed config does (the chart
    # checksums it into an annotation).
    cluster.kubectl("-n", NAMESPACE, "set", "env", f"daemonset/{NAME}", "CDI_GEN_LOG_LEVEL=debug")

    def rolled() -> bool:
        agents = agent_pods(cluster)
        return (
            len(agents) == 1
            and agents[0]["metadata"]["uid"] != old["metadata"]["uid"]
            and bool(agents[0].get("status", {}).get("containerStatuses"))
            and all(s.get("ready") for s in agents[0]["status"]["containerStatuses"])
        )

    # Pods keep coming, one at a time, until the new agent alone serves; then one more.
    while not rolled():
        one_pod()
    one_pod()
    new = wait_agent_ready(cluster)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert not failures, failures
    print(f"pods started during the rollout: {len(started)}, prepare failures: 0")


def test_a_successor_that_never_gets_ready_does_not_replace_the_agent(
    cluster: Cluster,
    loops: LoopDevices,
    claims: Claims,
    shipped_dra_daemonset: tuple[Path, int],
    agent_image: AgentImage,
) -> None:
    """A new version whose agent cannot register (its registration socket where the kubelet
    does not look) starts beside the old pod and is never Ready: its probe asks its own
    agent, not the node's port, which the old agent holds and answers ready on. The old pod
    is neither deleted nor restarted, its agent keeps the devices published, and undoing
    the change removes only the new pod."""
    _, port = shipped_dra_daemonset
    old, published = _serving_one_device(cluster, loops, claims, shipped_dra_daemonset, agent_image)
    old_uid = old["metadata"]["uid"]

    registry = "CDI_GEN_PLUGINS_REGISTRY_DIR"
    cluster.kubectl(
        "-n", NAMESPACE, "set", "env", f"daemonset/{NAME}", f"{registry}=/var/lib/cdi-gen/nowhere"
    )

    def successor_unready() -> tuple[dict[str, object], list[str]] | None:
        newer = [p for p in agent_pods(cluster) if p["metadata"]["uid"] != old_uid]
        if not newer:
            return None
        # Its agent's own answer (the first probes may come before its socket exists).
        events = _events(cluster, NAMESPACE, newer[0]["metadata"]["name"], "Unhealthy")
        waiting = [e for e in events if "waiting for DRA driver" in e]
        return (newer[0], waiting) if waiting else None

    newer, _ = until_sync(successor_unready, "the new agent's probe saying what it waits for", 120)
    pods = {p["metadata"]["uid"]: p for p in agent_pods(cluster)}
    assert old_uid in pods, "the old agent's pod was replaced by one that is not ready"
    kept = pods[old_uid]
    assert "deletionTimestamp" not in kept["metadata"], "the old pod is being deleted"
    assert kept["status"]["containerStatuses"][0]["ready"] is True
    assert kept["status"]["containerStatuses"][0]["restartCount"] == 0
    assert http_status(f"http://127.0.0.1:{port}/readyz") == 200  # the old agent's port
    claims.wait_devices(DRIVER, published, "the device still published", timeout=10)

    # Undone: the template is the old pod's again, and only the unready pod goes.
    cluster.kubectl(
        "-n", NAMESPACE, "set", "env", f"daemonset/{NAME}", f"{registry}={PLUGINS_REGISTRY}"
    )
    until_sync(
        lambda: [p["metadata"]["uid"] for p in agent_pods(cluster)] == [old_uid],
        "the unready pod removed, the old one kept",
        120,
    )
    assert wait_agent_ready(cluster)["metadata"]["uid"] == old_uid
    assert newer["metadata"]["uid"] != old_uid
