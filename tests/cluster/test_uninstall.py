"""Uninstall leaves nothing of ours; a restart keeps what running pods need (issue 20, current
lane, three nodes: ``fleet``).

Each agent, at SIGTERM, asks the API server about the DaemonSet that runs it (the shipped
manifests name it: ``CDI_GEN_DAEMONSET``, the namespace from the downward API). An agent pod
deleted under a DaemonSet still there is a restart: it logs why it keeps its spec files, and
the node's spec is the same file (inode) when its successor has registered. ``kubectl delete
-k <overlay>`` is an uninstall: kubectl deletes the ServiceAccount first (kustomize's order),
so an agent may hear 401 instead of 404 or a deletionTimestamp, and each of the three takes
that as an uninstall too; afterwards no spec file or owner record is left on any node.

The DRA variant's slices: an agent whose credentials were refused cannot delete them, and the
kubelet does: a driver that stays unregistered has its node's ResourceSlices wiped 30 s after
its plugin went (Kubernetes 1.37, ``pkg/kubelet/cm/dra/manager.go`` ``defaultWipingDelay``,
``DRAPluginManager.sync`` then ``wipeResourceSlices``), so the test waits (up to 120 s) until
no slice of the driver is left on any node, whoever deleted it.

The agents' last lines are read from ``kubectl logs -f`` started before their pods stop (a
deleted pod's log goes with it).
"""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loopdev import LoopDevices

from cdi_gen.cdi.ownerrecords import OWNER_SUFFIX
from tests.waiting import until_sync

from .agent import DRIVER, VENDOR
from .claims import Claims, device_attribute
from .cluster import Cluster, Node
from .conftest import _TEST_LOGS
from .daemonset import (
    NAMESPACE,
    SELECTOR,
    loop_fpga_config,
    write_fleet_dra_overlay,
    write_fleet_overlay,
)
from .fleet import devices_per_node
from .image import AgentImage
from .pods import Pods
from .test_nodes import _diagnostics, _wait_every_node
from .test_seed_lab import RESOURCE

pytestmark = pytest.mark.timeout(900)

SPEC = f"{VENDOR}-fpga.json"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
KEPT = "spec files kept at exit: DaemonSet kube-system/cdi-gen is still there"


class AgentLogs:
    """``kubectl logs -f`` of the agent pods (all, or one), read on a thread."""

    def __init__(self, fleet: Cluster, pod: str | None = None) -> None:
        self.lines: list[str] = []
        target = ["-l", SELECTOR] if pod is None else [f"pod/{pod}"]
        argv = [
            str(fleet.binaries.path("kubectl")),
            "--kubeconfig", str(fleet.admin_kubeconfig),
            "--cache-dir", str(fleet.work / "kubectl-cache"),
            "-n", NAMESPACE, "logs", "-f", "--prefix", "--tail=1", "--max-log-requests=10",
            *target,
        ]  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def following(self, pods: list[str]) -> None:
        """Until every pod's stream has printed (its last line, ``--tail=1``)."""
        until_sync(
            lambda: all(any(f"[pod/{p}/" in line for line in self.lines) for p in pods),
            f"kubectl logs -f following {pods}",
            within=30,
        )

    def messages(self, timeout: float = 60) -> list[tuple[str, str]]:
        """(pod, message) of every JSON line once the streams ended (the pods stopped)."""
        self.process.wait(timeout)
        self._reader.join(timeout)
        found = []
        for line in self.lines:
            prefix, _, rest = line.partition("] ")
            try:
                record: dict[str, Any] = json.loads(rest)
            except ValueError:
                continue
            found.append((prefix.split("/")[1], str(record.get("msg", ""))))
        return found

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join(10)
        assert self.process.stdout is not None
        self.process.stdout.close()


def _agents(fleet: Cluster) -> dict[str, str]:
    """Node name -> name of the agent pod there that is not being deleted."""
    assert fleet.api is not None
    items = fleet.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={SELECTOR}")
    return {
        p["spec"]["nodeName"]: p["metadata"]["name"]
        for p in items["items"]
        if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")
    }


def _registered_everywhere(fleet: Cluster) -> bool:
    """Whether the agent on every node logged that its kubelet registered the DRA driver
    (the fleet's pods have no probes to tell it: their metrics port is off)."""
    said = f"registered {DRIVER} with the kubelet"
    agents = _agents(fleet)
    for pod in agents.values():
        out = fleet.kubectl("-n", NAMESPACE, "logs", pod, check=False)
        if not any(said in line for line in out.splitlines()):
            return False
    return len(agents) == len(fleet.nodes)


def _successor(fleet: Cluster, node: str, old: str) -> str | None:
    """The agent pod on ``node`` that is not ``old``, once there is one."""
    now = _agents(fleet).get(node)
    return now if now not in (None, old) else None


def _no_agent_pods(fleet: Cluster) -> bool:
    assert fleet.api is not None
    path = f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={SELECTOR}"
    return not fleet.api.get(path)["items"]


def _files(node: Node) -> list[str]:
    """Every file in the node's /var/run/cdi (specs and their owner records)."""
    return sorted(p.name for p in node.cdi_run.iterdir())


def _slices_of_driver(fleet: Cluster) -> list[str]:
    assert fleet.api is not None
    selector = urllib.parse.quote(f"spec.driver={DRIVER}")
    items = fleet.api.get(f"{SLICES}?fieldSelector={selector}")["items"]
    return sorted(f"{s['spec'].get('nodeName')}:{s['metadata']['name']}" for s in items)


#: What each kubelet logs of the driver's registration and of its slices' wipe.
_KUBELET_DRA = ("DRA plugin", "Connection changed", "ResourceSlice", "driver-cleanup")


def _kubelet_dra_lines(fleet: Cluster) -> dict[str, list[str]]:
    """The lines each node's kubelet logged about DRA plugins and their slices (the last 30):
    why a kubelet did not wipe the slices of a driver that went."""
    found: dict[str, list[str]] = {}
    for node in fleet.nodes:
        assert node.kubelet is not None
        text = node.kubelet.log_path.read_text(errors="replace")
        lines = [line for line in text.splitlines() if any(k in line for k in _KUBELET_DRA)]
        found[node.name] = [line[:400] for line in lines[-30:]]
    return found


def _uninstall(fleet: Cluster, overlay: Path) -> list[tuple[str, str]]:
    """``kubectl delete -k overlay`` with the agents' last lines followed; (pod, message) of
    every line they logged from then on, once every agent pod is gone."""
    agents = _agents(fleet)
    assert len(agents) == len(fleet.nodes), agents
    logs = AgentLogs(fleet)
    try:
        logs.following(list(agents.values()))
        fleet.kubectl("delete", "-k", str(overlay))
        until_sync(lambda: _no_agent_pods(fleet), "every agent pod gone", within=120)
        return logs.messages()
    finally:
        logs.stop()


def _assert_uninstalled(fleet: Cluster, messages: list[tuple[str, str]]) -> None:
    said = {pod: m for pod, m in messages if m.startswith("uninstall: ")}
    # For the report (pytest -rA): which answer each agent got.
    print("uninstall lines:", json.dumps(said, indent=1))
    assert len(said) == len(fleet.nodes), messages[-30:]
    assert not [m for _, m in messages if m.startswith("spec files kept")], messages[-30:]
    for node in fleet.nodes:
        assert _files(node) == [], (node.name, _files(node))


@pytest.fixture
def clean_fleet(fleet: Cluster, agent_image: AgentImage) -> Iterator[Cluster]:
    """The fleet with the agent image on every node; whatever a failed test left is removed."""
    for node in fleet.nodes:
        fleet.import_image(agent_image.archive, node)
    _TEST_LOGS.append(("DaemonSet on three nodes (kubectl)", lambda: _diagnostics(fleet)))
    try:
        yield fleet
    finally:
        _TEST_LOGS.clear()
        for node in fleet.nodes:
            for leftover in node.cdi_run.glob("*"):
                leftover.unlink()


def test_device_plugin_daemonset_restart_keeps_specs_uninstall_removes_them(
    clean_fleet: Cluster, loops: LoopDevices, agent_image: AgentImage, tmp_path: Path
) -> None:
    fleet = clean_fleet
    assert fleet.api is not None
    with devices_per_node(fleet, loops) as devices:
        every = [d.name for theirs in devices.values() for d in theirs]
        overlay = write_fleet_overlay(
            tmp_path / "overlay",
            agent_image.name,
            loop_fpga_config(every, dfl_path=False),
            fleet.api.port,
        )
        try:
            fleet.kubectl("apply", "-k", str(overlay))
            _wait_every_node(fleet, 2)
            for node in fleet.nodes:
                assert {SPEC, f".{SPEC}{OWNER_SUFFIX}"} <= set(_files(node)), _files(node)

            # A restart: the pod goes, the DaemonSet stays; the spec is never removed.
            first = fleet.nodes[0]
            old = _agents(fleet)[first.name]
            inode = (first.cdi_run / SPEC).stat().st_ino
            logs = AgentLogs(fleet, old)
            try:
                logs.following([old])
                fleet.kubectl("-n", NAMESPACE, "delete", "pod", old)
                said = [m for _, m in logs.messages()]
            finally:
                logs.stop()
            assert [m for m in said if m.startswith("spec files kept")] == [
                f"{KEPT}: a restart or an update"
            ], said
            new = until_sync(
                lambda: _successor(fleet, first.name, old),
                f"a new agent pod on {first.name}",
                within=60,
            )
            assert new is not None
            until_sync(
                lambda: (
                    f"registered {RESOURCE} with the kubelet"
                    in fleet.kubectl("-n", NAMESPACE, "logs", new, check=False)
                ),
                f"{new} registered {RESOURCE}",
                within=60,
            )
            assert (first.cdi_run / SPEC).stat().st_ino == inode

            _assert_uninstalled(fleet, _uninstall(fleet, overlay))
        finally:
            fleet.kubectl("delete", "--ignore-not-found", "-k", str(overlay))


def test_dra_daemonset_uninstall_leaves_no_spec_and_no_slice(
    clean_fleet: Cluster, loops: LoopDevices, agent_image: AgentImage, tmp_path: Path
) -> None:
    fleet = clean_fleet
    api = fleet.api
    assert api is not None
    claims = Claims(api, Pods(api))
    with devices_per_node(fleet, loops) as devices:
        every = [d.name for theirs in devices.values() for d in theirs]
        overlay = write_fleet_dra_overlay(
            tmp_path / "overlay",
            agent_image.name,
            loop_fpga_config(every, dfl_path=False),
            api.port,
        )
        try:
            fleet.kubectl("apply", "-k", str(overlay))
            for node in fleet.nodes:
                wanted = {f"{RESOURCE}=fpga-{d.number}" for d in devices[node.name]}

                def published(found: dict[str, Any], wanted: set[str] = wanted) -> bool:
                    names = {device_attribute(d, DRIVER, "cdiName") for d in found.values()}
                    return {n for n in names if n.startswith(f"{RESOURCE}=")} == wanted

                claims.wait_devices(DRIVER, published, node.name, timeout=120, node=node.name)
                assert SPEC in _files(node), _files(node)
            # Slices are published before the kubelet registers the driver (its plugin watcher
            # looks every second): an agent gone before that was never registered, so its
            # kubelet has nothing to unregister and never wipes its slices.
            until_sync(
                lambda: _registered_everywhere(fleet),
                "the driver registered on every node",
                within=120,
                every=0.5,  # a kubectl per pod and look
            )

            _assert_uninstalled(fleet, _uninstall(fleet, overlay))
            # Deleted by the agents where the API server still let them, else by each
            # kubelet 30 s after the driver went (see the module docstring).
            try:
                until_sync(
                    lambda: not _slices_of_driver(fleet),
                    f"no ResourceSlice of {DRIVER} left",
                    within=120,
                    observe=lambda: _slices_of_driver(fleet),
                )
            except AssertionError:
                print("kubelets on DRA:", json.dumps(_kubelet_dra_lines(fleet), indent=1))
                raise
        finally:
            fleet.kubectl("delete", "--ignore-not-found", "-k", str(overlay))
            for node in fleet.nodes:
                claims.delete_slices(DRIVER, node.name)
