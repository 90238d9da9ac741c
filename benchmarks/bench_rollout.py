"""NodePrepareResources failures while the DRA driver is replaced, on a real single-node cluster
(tests/cluster, current lane): what a rolling update costs the pods that start meanwhile.

Pods with a claim (a ResourceClaimTemplate of one loop device) start one after another, each
deleted once Running, while the agent is replaced as the DaemonSet would replace it:

- before: one instance per node (today's socket names, ``maxUnavailable: 1``): the old agent
  is stopped (SIGTERM), then the new one started. Until it registers the kubelet has no driver
  and a prepare fails (the kubelet retries it);
- after: the new agent starts beside the old one with a pod UID of its own (``--pod-uid``, as
  ``maxSurge: 1, maxUnavailable: 0`` runs it), and the old one is stopped once the new one is
  registered; it hands over and removes only its own sockets.

Counted: the kubelet's ``FailedPrepareDynamicResources`` events of those pods (each event's
``count``), and the pods that started. The agents run as host processes (``cdi-gen run``, as
tests/cluster/agent.py runs them), so the figure is the driver's, not the DaemonSet
controller's pace. Loop numbers 500-599.

    python benchmarks/bench_rollout.py [--quick]
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _cluster import LOOP_HIGH, LOOP_LOW, bench_cluster, missing  # noqa: E402
from _table import Row, print_table  # noqa: E402
from cluster.agent import DRIVER, NodeAgent, class_config, dra_args  # noqa: E402
from cluster.claims import Claims  # noqa: E402
from cluster.cluster import Cluster  # noqa: E402
from cluster.pods import NAMESPACE, Pods  # noqa: E402
from loopdev import LoopDevices  # noqa: E402

DEVICE_CLASS = "fpga.example.com"


def _failures(cluster: Cluster, pod: str) -> int:
    assert cluster.api is not None
    selector = f"involvedObject.name={pod},reason=FailedPrepareDynamicResources"
    events = cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector={selector}")
    return sum(int(e.get("count") or 1) for e in events["items"])


def _wait_file(path: Path, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {path} not there within {timeout:.0f} s")
        time.sleep(0.02)


class _Starter(threading.Thread):
    """Pods with a claim, one after another, each deleted once Running, until ``after`` of
    them started once ``swapped`` is set; the prepare failures of each counted."""

    def __init__(self, cluster: Cluster, claims: Claims, tag: str, after: int) -> None:
        super().__init__(name="pods")
        self.cluster, self.claims, self.tag, self.after = cluster, claims, tag, after
        self.swapped = threading.Event()
        self.started: list[str] = []
        self.failed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        pods = self.claims.pods
        try:
            after = 0
            while after < self.after:
                name = f"rollout-{self.tag}-{len(self.started)}"
                self.claims.pod_with_template(name, "rollout")
                pods.wait_running(name, timeout=180)
                self.started.append(name)
                self.failed += _failures(self.cluster, name)
                pods.delete(name, timeout=180)
                after += self.swapped.is_set()
        except BaseException as exc:  # raised by the caller
            self.error = exc


def _claims(cluster: Cluster) -> Claims:
    assert cluster.api is not None
    claims = Claims(cluster.api, Pods(cluster.api))
    claims.device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    )
    claims.template("rollout", DEVICE_CLASS)
    return claims


def _rollout(cluster: Cluster, work: Path, *, surge: bool, pods_after: int) -> tuple[int, int]:
    """(prepare failures, pods started) while one agent replaces another."""
    loops = LoopDevices(LOOP_LOW, LOOP_HIGH)
    device = loops.add()
    config = work / "bench-rollout.yaml"
    config.write_text(class_config("fpga", [device.name]))
    tag = "surge" if surge else "replace"
    state = work / f"rollout-state-{tag}"

    def agent(uid: str) -> NodeAgent:
        args = dra_args(cluster, state) + (("--pod-uid", uid) if surge else ())
        return NodeAgent(cluster, config, work / f"rollout-{tag}-{uid}.log", args)

    def registered(uid: str) -> Path:
        if surge:
            return cluster.kubelet_plugins_dir / DRIVER / f"{DRIVER}-{uid}-reg.sock.registered"
        return cluster.plugins_registry_dir / f"{DRIVER}-reg.sock"

    claims = _claims(cluster)
    old, new = agent("old"), agent("new")
    starter = _Starter(cluster, claims, tag, pods_after)
    old.start()
    try:
        _wait_file(registered("old"), "the old agent registered")
        starter.start()
        while len(starter.started) < 2 and starter.is_alive():
            time.sleep(0.05)
        if surge:  # beside it, then the old one stops
            new.start()
            _wait_file(registered("new"), "the new agent registered")
            old.stop()
        else:  # the old one stops, then the new one starts
            old.stop()
            new.start()
            _wait_file(registered("new"), "the new agent registered")
        starter.swapped.set()
        starter.join(600)
        if starter.error is not None:
            raise starter.error
    finally:
        claims.pods.delete_all()
        claims.delete_all()
        old.stop()
        new.stop()
        claims.delete_slices(DRIVER)
        loops.cleanup()
        for spec in cluster.cdi_run.glob("*"):
            spec.unlink()
    return starter.failed, len(starter.started)


def run(quick: bool = False) -> list[Row]:
    """Measure; return rows of (metric, measured value, target)."""
    why = missing()
    if why is not None:
        return [("rollout", why, "—")]
    pods_after = 3 if quick else 10
    rows: list[Row] = []
    with bench_cluster() as cluster:
        for surge, label in ((False, "before: stop, then start (maxUnavailable 1)"),
                             (True, "after: start beside, hand over (maxSurge 1)")):  # fmt: skip
            failures, started = _rollout(cluster, cluster.work, surge=surge, pods_after=pods_after)
            target = "0" if surge else "—"
            rows.append((f"{label}: prepare failures, {started} pods", str(failures), target))
    return rows


if __name__ == "__main__":
    print_table("rollout", run("--quick" in sys.argv))
