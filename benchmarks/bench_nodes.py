"""DRA slices per lane and three nodes, on real clusters (tests/cluster), side by side.

- kernel add → device in the node's ResourceSlice, in each lane (current: Kubernetes 1.37.2 +
  containerd 2.3.7; oldest: 1.35.4 + containerd 1.7.24 with its DRA gates; crio: 1.36.3 +
  CRI-O 1.36.3): ``cdi-gen run
  --api dra`` on a single-node cluster, LOOP_CTL_ADD of a device of its class until the API
  server lists it in the node's slices (polled every 10 ms, as the allocatable figure of the
  ``cluster`` area is). Unlike Node allocatable, which the kubelet publishes on its status
  tick, a slice is written by the agent itself: no tick bounds it.
- three nodes (current lane, ``Cluster(node_count=3)``, two devices per node): the seven-pod
  seed lab from ``kubectl apply -k`` of the shipped DaemonSet (the fleet overlays of
  tests/cluster/daemonset.py, agent image from deploy/Containerfile) to six pods Running and
  the seventh reported unschedulable (polled every 0.2 s), with device plugins and with DRA.

Loop numbers 500-599, as in the ``cluster`` area.

    python benchmarks/bench_nodes.py [--quick]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _cluster import LOOP_HIGH, LOOP_LOW, bench_cluster, components, missing  # noqa: E402
from _table import Row, percentile, print_table  # noqa: E402
from cluster.agent import DRIVER, NodeAgent, class_config, dra_args  # noqa: E402
from cluster.claims import Claims, device_attribute  # noqa: E402
from cluster.cluster import Cluster, running_cluster  # noqa: E402
from cluster.daemonset import (  # noqa: E402
    NAMESPACE,
    SELECTOR,
    loop_fpga_config,
    write_fleet_dra_overlay,
    write_fleet_overlay,
)
from cluster.fleet import devices_per_node  # noqa: E402
from cluster.image import ensure_agent_image  # noqa: E402
from cluster.lane import CURRENT, LANES, Lane  # noqa: E402
from cluster.pods import Pods  # noqa: E402
from loopdev import LoopDevices  # noqa: E402

RESOURCE = "example.com/fpga"
#: The shipped DeviceClass of the fpga class (deploy/kubernetes/dra/deviceclasses.yaml).
FPGA_CLASS = "fpga.example.com"


def _fpga_names(claims: Claims, node: str) -> set[str]:
    names = {device_attribute(d, DRIVER, "cdiName") for d in claims.devices(DRIVER, node).values()}
    return {n for n in names if str(n).startswith(f"{RESOURCE}=")}


def _wait_slice(claims: Claims, node: str, want: set[str], timeout: float = 30) -> float:
    """Seconds until the node's slices list exactly ``want`` of the fpga class, polled every
    10 ms (the API server's answer, as the scheduler reads it)."""
    start = time.monotonic()
    while _fpga_names(claims, node) != want:
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"slices of {node} never listed {sorted(want)}")
        time.sleep(0.01)
    return time.monotonic() - start


def _slice_path(lane: Lane, cycles: int) -> list[Row]:
    parts = components(lane)
    with bench_cluster(parts, lane) as cluster:
        assert cluster.api is not None
        claims = Claims(cluster.api, Pods(cluster.api))
        loops = LoopDevices(LOOP_LOW, LOOP_HIGH)
        number = loops.reserve().number
        work = cluster.work
        config = work / "bench-dra.yaml"
        config.write_text(class_config("fpga", [f"loop{number}"]))
        agent = NodeAgent(
            cluster, config, work / "bench-dra.log", dra_args(cluster, work / "dra-state")
        )
        agent.start()
        name = f"{RESOURCE}=fpga-{number}"
        samples: list[float] = []
        try:
            # One cycle unmeasured: the agent starts, its plugin serves and publishes.
            loops.add(number)
            _wait_slice(claims, cluster.node_name, {name}, 60)
            loops.remove(number)
            _wait_slice(claims, cluster.node_name, set())
            for _ in range(cycles):
                loops.add(number)
                samples.append(1e3 * _wait_slice(claims, cluster.node_name, {name}))
                loops.remove(number)
                _wait_slice(claims, cluster.node_name, set())
        finally:
            loops.cleanup()
            agent.stop()
            claims.delete_slices(DRIVER, cluster.node_name)
    what = f"{lane.name} (Kubernetes {parts[0].version})"
    return [
        (f"kernel add → device in the node's ResourceSlice, {what}, p50 of {cycles}",
         f"{statistics.median(samples):.0f} ms", "no status tick (allocatable: ≤ 1000 ms)"),
        (f"kernel add → device in the node's ResourceSlice, {what}, p99 of {cycles}",
         f"{percentile(samples, 99):.0f} ms", "—"),
    ]  # fmt: skip


def _offered(fleet: Cluster, claims: Claims, dra: bool) -> bool:
    """Whether every node offers its two devices (its slices, or its Node's allocatable)."""
    if dra:
        return all(len(_fpga_names(claims, n.name)) == 2 for n in fleet.nodes)
    return all(fleet.allocatable(RESOURCE, n.name) == (2, 2) for n in fleet.nodes)


def _seed_lab(
    fleet: Cluster, overlay: Path, dra: bool, pods_first: bool = True
) -> tuple[float, float]:
    """Seconds from ``kubectl apply -k overlay`` (the seven consumer pods created right
    after it) until every node offers its two devices (polled every 0.2 s on a thread of its
    own), and until six pods run (the seventh unschedulable); everything removed again
    afterwards. Without ``pods_first`` the pods are created once the devices are offered,
    and the second figure counts from then."""
    assert fleet.api is not None
    pods = Pods(fleet.api)
    claims = Claims(fleet.api, pods)
    names = [f"bench-{'dra' if dra else 'dp'}-{i}" for i in range(7)]
    offered: list[float] = []
    start = time.monotonic()

    def watch_offers() -> None:
        while not _offered(fleet, claims, dra) and time.monotonic() - start < 300:
            time.sleep(0.2)
        offered.append(time.monotonic() - start)

    watcher = threading.Thread(target=watch_offers, daemon=True)
    try:
        fleet.kubectl("apply", "-k", str(overlay))
        watcher.start()
        if not pods_first:
            watcher.join(300)
            start = time.monotonic()
        if dra:
            claims.template("fpga", FPGA_CLASS)
        for name in names:
            if dra:
                claims.pod_with_template(name, "fpga")
            else:
                pods.create(name, {RESOURCE: 1})
        pods.wait_split(names, running=6, timeout=300)
        running = time.monotonic() - start
        watcher.join(300)
        return offered[0], running
    finally:
        pods.delete_all()
        claims.delete_all()
        fleet.kubectl("delete", "--wait", "--cascade=foreground", "--ignore-not-found", "-k",
                      str(overlay))  # fmt: skip
        deadline = time.monotonic() + 120
        path = f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={SELECTOR}"
        while fleet.api.get(path)["items"] and time.monotonic() < deadline:
            time.sleep(0.2)
        for node in fleet.nodes:
            claims.delete_slices(DRIVER, node.name)
            for spec in node.cdi_run.glob("*"):
                spec.unlink()


def _three_nodes() -> list[Row]:
    image = ensure_agent_image()
    binaries, etcd, containerd = components(CURRENT)
    loops = LoopDevices(LOOP_LOW, LOOP_HIGH)
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="cgb"))
    try:
        with running_cluster(binaries, etcd, containerd, CURRENT, nodes=3) as fleet:
            assert fleet.api is not None
            started = fleet.timings["total"]
            for node in fleet.nodes:
                fleet.import_image(image.archive, node)
            with devices_per_node(fleet, loops) as devices:
                config: dict[str, Any] = loop_fpga_config(
                    [d.name for theirs in devices.values() for d in theirs], dfl_path=False
                )
                dp = _seed_lab(
                    fleet, write_fleet_overlay(work / "dp", image.name, config, fleet.api.port),
                    dra=False,
                )  # fmt: skip
                dra_overlay = write_fleet_dra_overlay(
                    work / "dra", image.name, config, fleet.api.port
                )
                dra = _seed_lab(fleet, dra_overlay, dra=True)
                _, dra_later = _seed_lab(fleet, dra_overlay, dra=True, pods_first=False)
    finally:
        loops.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    rows: list[Row] = [("3 nodes: warm start-up → three Nodes Ready", f"{started:.1f} s", "—")]
    for what, (offered, running) in (("device plugins", dp), ("DRA", dra)):
        rows += [
            (f"3 nodes, {what}: seed lab, apply -k → 6 of 7 pods Running", f"{running:.1f} s",
             "—"),
            ("  of which apply -k → every node offers its 2 devices", f"{offered:.1f} s", ""),
        ]  # fmt: skip
    rows.append(
        ("3 nodes, DRA: the 7 pods created once every node offers → 6 Running",
         f"{dra_later:.1f} s", "—")
    )  # fmt: skip
    return rows


def run(quick: bool = False) -> list[Row]:
    """Measure; return rows of (metric, measured value, target)."""
    why = missing()
    if why is not None:
        return [("nodes", why, "—")]
    cycles = 5 if quick else 20
    rows: list[Row] = []
    for lane in LANES.values():
        rows += _slice_path(lane, cycles)
    return rows + _three_nodes()


if __name__ == "__main__":
    print_table("nodes", run("--quick" in sys.argv))
