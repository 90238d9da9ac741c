"""The scheduler's throughput with composite pools on the simulated fleet (issue 56).

    python benchmarks/fleet_composite.py [--nodes N] [--churn SECONDS] [--rounds R]

Not part of ``make bench``: minutes. The fleet of ``fleet.py`` (the current lane's control
plane with client QPS 100, kwok faking N Nodes) and its workload (pods with a one-device claim
fill 90 % of 8 x N, then churn at 5 pods/s), each node's pool in one of two shapes in turn:

- **composite**: 100 disks with 8 partitions each as a composite class (``group.offer:
  both``) publishes them: 900 devices, each whole consuming its 8 partitions' counters, 100
  counter sets, 28 slices; built by ``cdi-gen slices`` from recorded udev data of such disks;
- **parts alone**: the same 800 partitions without wholes or counters (what the agent
  publishes where the API server drops counters), 128 to a slice;
- **uncounted** (a diagnostic, never published: the wholes would be free beside their parts):
  the composite slices with their counters stripped, 900 devices in the same 15 slices.

The claims ask for a partition (the class selects ``part``), so the same pods land on pools
that differ only by the wholes and their counters: the ratio of the two throughputs (paired
within each round, the order alternating) is the counters' cost in the scheduler's allocator,
held against ``fleet.py``'s goal for ours / example (≥ 0.95); beside it, the scheduler's CPU
per fill pod, which a shared machine moves less. Composite / uncounted separates the counters'
own cost from that of the wholes and the smaller slices a pool with counters is cut into.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _cluster import components, missing  # noqa: E402
from _table import Row, print_table  # noqa: E402
from cluster.api import Api, Obj  # noqa: E402
from cluster.cluster import Cluster  # noqa: E402
from cluster.lane import CURRENT  # noqa: E402
from fleet import (  # noqa: E402
    CREATORS,
    FILL,
    NAMESPACE,
    SLICES,
    Figures,
    _create_nodes,
    _delete_slices,
    node_name,
    workload,
)
from fleet_kwok import kwok  # noqa: E402
from fleet_publisher import GPUS  # noqa: E402

COMPOSITE, ALONE, UNCOUNTED = "composite", "alone", "uncounted"
SHAPES = (COMPOSITE, ALONE, UNCOUNTED)
DRIVERS = {shape: f"{shape}.cdi-gen.io" for shape in SHAPES}
DISKS, PARTS = 100, 8
#: Devices per slice of the parts alone (no counters: the API's limit for plain slices).
PLAIN_PER_SLICE = 128


def _records(path: Path) -> Path:
    """``udevadm info --export-db`` text of DISKS loop disks with PARTS partitions each."""
    lines: list[str] = []
    for d in range(DISKS):
        disk = f"loop{600 + d}"
        base = f"/devices/virtual/block/{disk}"
        lines += [f"P: {base}", f"N: {disk}", "U: block", f"E: DEVPATH={base}",
                  "E: SUBSYSTEM=block", f"E: DEVNAME=/dev/{disk}", "E: DEVTYPE=disk",
                  "E: MAJOR=7", f"E: MINOR={600 + d}", ""]  # fmt: skip
        for p in range(1, PARTS + 1):
            part = f"{disk}p{p}"
            lines += [f"P: {base}/{part}", f"N: {part}", "U: block",
                      f"E: DEVPATH={base}/{part}", "E: SUBSYSTEM=block",
                      f"E: DEVNAME=/dev/{part}", "E: DEVTYPE=partition", "E: MAJOR=259",
                      f"E: MINOR={d * PARTS + p}", f"E: PARTN={p}", ""]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def composite_slices(work: Path, driver: str) -> list[Obj]:
    """One node's composite pool as ``cdi-gen slices`` builds it (node ``fleet-000``)."""
    config = work / "composite.yaml"
    disk = {
        "name": "disk",
        "match": [{"subsystem": "block", "kernel": "loop[0-9]*"}],
        "group": {"by": "parent", "subsystem": "block", "offer": "both"},
        "deviceName": "{group}",
    }
    config.write_text(yaml.safe_dump({"vendor": driver, "classes": [disk]}))
    out = subprocess.run(
        [sys.executable, "-m", "cdi_gen", "slices", "--config", str(config),
         "--records", str(_records(work / "disks.txt")), "--node", node_name(0),
         "--driver", driver],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    slices: list[Obj] = list(yaml.safe_load_all(out.stdout))
    return slices


def parts_alone(slices: list[Obj], driver: str) -> list[Obj]:
    """The partitions of ``slices`` without wholes or counters, as plain slices."""
    parts = []
    for s in slices:
        for d in s["spec"].get("devices") or ():
            if d["attributes"]["part"]["bool"]:
                parts.append({k: v for k, v in d.items() if k != "consumesCounters"})
    chunks = [parts[i : i + PLAIN_PER_SLICE] for i in range(0, len(parts), PLAIN_PER_SLICE)]
    spec = {"driver": driver, "nodeName": node_name(0), "pool": {"name": node_name(0)}}
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {},
             "spec": {**copy.deepcopy(spec), "devices": c}} for c in chunks]  # fmt: skip


def uncounted(slices: list[Obj]) -> list[Obj]:
    """``slices`` without their counters: the counter sets' slices go, the devices stay."""
    out = []
    for template in slices:
        if template["spec"].get("devices"):
            s = copy.deepcopy(template)
            for d in s["spec"]["devices"]:
                d.pop("consumesCounters", None)
            out.append(s)
    return out


def for_node(slices: list[Obj], shape: str, node: str, uid: str) -> list[Obj]:
    """``slices`` as ``node``'s pool: names, nodeName, pool and owner."""
    out = []
    for index, template in enumerate(slices):
        s = copy.deepcopy(template)
        s["metadata"] = {
            "name": f"{node}-{shape}-{index}",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}],
        }
        s["spec"]["nodeName"] = node
        s["spec"]["pool"] = {"name": node, "generation": 1, "resourceSliceCount": len(slices)}
        out.append(s)
    return out


@contextmanager
def published(cluster: Cluster, shape: str, slices: list[Obj], nodes: int) -> Iterator[None]:
    api = cluster.api
    assert api is not None
    uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in api.get("/api/v1/nodes")["items"]}
    bodies = [b for i in range(nodes) for b in for_node(slices, shape, node_name(i),
                                                         uids[node_name(i)])]  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(lambda b: api.create(SLICES, b), bodies))
    try:
        yield
    finally:
        _delete_slices(cluster, DRIVERS[shape])


def _setup_classes(api: Api) -> None:
    """A DeviceClass and a claim template per shape, as fleet.py's, selecting partitions."""
    for shape, driver in DRIVERS.items():
        cel = f'device.driver == "{driver}" && device.attributes["{driver}"].part'
        api.create(
            "/apis/resource.k8s.io/v1/deviceclasses",
            {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
             "metadata": {"name": f"fleet-{shape}"},
             "spec": {"selectors": [{"cel": {"expression": cel}}]}},
        )  # fmt: skip
        request = {"name": "gpu", "exactly": {"deviceClassName": f"fleet-{shape}"}}
        api.create(
            f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": f"fleet-{shape}"},
             "spec": {"metadata": {"labels": {"fleet": shape}},
                      "spec": {"devices": {"requests": [request]}}}},
        )  # fmt: skip


def run(args: argparse.Namespace) -> list[Row]:
    why = missing()
    if why is not None:
        return [("fleet composite", why, "—")]
    wall = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="cdi-gen-fleet-composite-"))
    try:
        shapes = {COMPOSITE: composite_slices(work, DRIVERS[COMPOSITE])}
        shapes[ALONE] = parts_alone(composite_slices(work, DRIVERS[ALONE]), DRIVERS[ALONE])
        shapes[UNCOUNTED] = uncounted(composite_slices(work, DRIVERS[UNCOUNTED]))
    finally:
        shutil.rmtree(work)
    binaries, etcd, runtime_root = components()
    cluster = Cluster(binaries, etcd, runtime_root, CURRENT, node_count=0, client_qps=100)
    figures = {shape: Figures() for shape in SHAPES}
    try:
        cluster.start()
        api = cluster.api
        assert api is not None
        controller = kwok(cluster.admin_kubeconfig, cluster.work, cluster.logs)
        cluster.components["kwok"] = controller
        controller.start()
        _create_nodes(api, args.nodes)
        _setup_classes(api)
        for round_ in range(args.rounds):
            # Each shape in another place of the order each round.
            for shape in SHAPES[round_ % 3 :] + SHAPES[: round_ % 3]:
                with published(cluster, shape, shapes[shape], args.nodes):
                    workload(cluster, shape, args.nodes, args.churn, figures[shape])
    finally:
        if "kwok" in cluster.components:
            cluster.components["kwok"].stop()
        problems = cluster.stop()
        cluster.remove()
        if problems:
            print("teardown left: " + "; ".join(problems), file=sys.stderr)
    return _rows(args, shapes, figures, time.monotonic() - wall)


def _rows(
    args: argparse.Namespace,
    shapes: dict[str, list[Obj]],
    figures: dict[str, Figures],
    wall: float,
) -> list[Row]:
    rows: list[Row] = [
        (f"fleet: {args.nodes} kwok nodes, {DISKS} disks x {PARTS} partitions each, "
         f"{args.rounds} round(s)",
         f"fill {int(args.nodes * GPUS * FILL)} partition claims, churn {args.churn:g} s", "—"),
    ]  # fmt: skip
    for shape in SHAPES:
        slices, f = shapes[shape], figures[shape]
        devices = sum(len(s["spec"].get("devices") or ()) for s in slices)
        sets = sum(len(s["spec"].get("sharedCounters") or ()) for s in slices)
        sched = f.cpu_per_pod["kube-scheduler"]
        rows += [
            (f"{shape}: per node slices; devices; counter sets",
             f"{len(slices)}; {devices}; {sets}", "—"),
            (f"{shape}: fill throughput (pods/s, each round)",
             " / ".join(f"{t:.1f}" for t in f.throughput), "—"),
            (f"{shape}: churn at 5/s: scheduled pods/s",
             " / ".join(f"{t:.1f}" for t in f.churn_rate), "5"),
            (f"{shape}: scheduler CPU per fill pod (each round)",
             " / ".join(f"{1e3 * c:.1f}" for c in sched) + " ms", "—"),
        ]  # fmt: skip
    mine = figures[COMPOSITE]
    for other, goal in ((ALONE, "≥ 0.95"), (UNCOUNTED, "informative")):
        theirs = figures[other]
        pairs = [a / b for a, b in zip(mine.throughput, theirs.throughput, strict=True)]
        cpu = statistics.median(mine.cpu_per_pod["kube-scheduler"]) / statistics.median(
            theirs.cpu_per_pod["kube-scheduler"]
        )
        rows += [
            (f"ratio composite / {other}: fill throughput, median of rounds",
             f"{statistics.median(pairs):.2f} ({' / '.join(f'{r:.2f}' for r in pairs)})", goal),
            (f"ratio composite / {other}: scheduler CPU per fill pod", f"{cpu:.2f}x",
             "informative"),
        ]  # fmt: skip
    rows.append(("benchmark wall time", f"{wall:.0f} s", "—"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=25, help="kwok nodes (default 25)")
    parser.add_argument("--churn", type=float, default=20, help="churn seconds (default 20)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the shapes (default 2)")
    print_table("fleet composite", run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
