"""A simulated fleet: N fake nodes with a DRA pool each on the current lane's real control plane.

    python benchmarks/fleet.py [--nodes N] [--churn SECONDS] [--hotplug SECONDS]
                               [--compress K] [--rounds R] [--quick]
    make bench-fleet FLEET_ARGS="--nodes 50"

Not part of ``make bench``: a run takes minutes. The parts, all real but the kubelets:

- the control plane of the current lane (Kubernetes 1.37.2 API server, scheduler,
  controller-manager, etcd; ``tests/cluster``'s ``Cluster(node_count=0)``) with the scheduler's
  and controller-manager's client QPS at 100, as upstream scale tests run them;
- kwok (``fleet_kwok.py``, built from its pinned Go module) faking N Nodes (Ready, a Lease
  each) and their pods' lifecycle (Running once scheduled, removed once deleted);
- **ours**: per node a pool of 8 GPUs published by cdi-gen's own code (discovery → pool →
  slices → publisher, ``fleet_publisher.py``, one process for all nodes, fed recorded devices);
- **example**: the same fleet where each node's pool is one slice of 8 devices carrying a name
  and one attribute (dra-example-driver's shape), written by a minimal writer (one POST each).

The workload, per shape in turn (only that shape's slices in the API, a DeviceClass each): pods
with a claim from a ResourceClaimTemplate (one device) fill the fleet to 90 %, as fast as the
client creates them; then churn at 5 pods/s (the oldest pod deleted, a new one created) for a
fixed time. Measured through watches stamped on arrival: scheduling throughput (pods scheduled
÷ first pod created → last pod scheduled; the ratio of the shapes paired within each round),
claim created → ``status.allocation`` set, pod created → ``spec.nodeName`` set. Beside them,
steadier on a shared machine: the control plane's CPU per fill pod (from /proc) and the
scheduler's attempts per pod.

Then hotplug churn on our pools (pods in place): each node adds a ninth GPU and removes it
again once per minute, time compressed K times (default 10: a cycle every 6 s per node, the
nodes spread evenly over it, so 100 nodes make 33 events/s). Counted at our clients' transport:
requests and body bytes per event; at the API server: its ``apiserver_request_total`` and
``apiserver_watch_events_total`` for resourceslices (watch events per write = fan-out), its CPU
and memory from /proc, against a quiet window of the same length just before. Then the same
churn once each node's first GPU is unhealthy (its taint puts it in a slice of its own).
Last, the figures of 5,000 nodes x 64 devices on paper, from these and from one 64-GPU pool
built by our code and written once.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _cluster import components, missing  # noqa: E402
from _table import Row, percentile, print_table  # noqa: E402
from cluster.api import Api, Obj  # noqa: E402
from cluster.cluster import Cluster  # noqa: E402
from cluster.lane import CURRENT  # noqa: E402
from fleet_kwok import binary, kwok  # noqa: E402
from fleet_publisher import GPUS, pool_slices  # noqa: E402
from fleet_watch import (  # noqa: E402
    Stamps,
    allocated,
    cpu_seconds,
    metric_sums,
    rss_mib,
    scheduled,
)

OURS, EXAMPLE = "ours", "example"
DRIVERS = {OURS: "cdi-gen.io", EXAMPLE: "gpu.example.com"}
NAMESPACE = "default"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
#: Share of the fleet's devices the fill claims (clusterloader2's DRA test: 90 %).
FILL = 0.9
#: Pods created (and as many deleted) per second in the churn (the upstream test's rate).
CHURN_RATE = 5.0
#: Longest any wait of the run may take (seconds) before it fails naming what it waited for.
WAIT = 600.0
#: Client threads creating the fill's pods.
CREATORS = 8


def node_name(i: int) -> str:
    return f"fleet-{i:03d}"


def _wait(what: str, check: Callable[[], bool], timeout: float = WAIT) -> float:
    """Seconds until ``check()``; polls every 50 ms (the run's own progress, not a figure)."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - start


# ----- the fleet ----------------------------------------------------------------------------


def _create_nodes(api: Api, count: int) -> float:
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CREATORS) as pool:
        list(
            pool.map(
                lambda i: api.create(
                    "/api/v1/nodes",
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {
                            "name": node_name(i),
                            "labels": {"kubernetes.io/hostname": node_name(i), "type": "kwok"},
                            "annotations": {"kwok.x-k8s.io/node": "fake"},
                        },
                    },
                ),
                range(count),
            )
        )

    def ready() -> bool:
        items = api.get("/api/v1/nodes")["items"]
        return sum(1 for n in items if _node_ready(n)) == count

    _wait(f"{count} kwok Nodes Ready and untainted", ready)
    return time.monotonic() - start


def _node_ready(node: Obj) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    ok = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return ok and not node.get("spec", {}).get("taints")


def _setup_classes(api: Api) -> None:
    for shape, driver in DRIVERS.items():
        api.create(
            "/apis/resource.k8s.io/v1/deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": f"fleet-{shape}"},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
            },
        )
        api.create(
            f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": f"fleet-{shape}"},
                "spec": {
                    # Copied to every claim made from it: the watches select on it.
                    "metadata": {"labels": {"fleet": shape}},
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "gpu", "exactly": {"deviceClassName": f"fleet-{shape}"}}
                            ]
                        }
                    },
                },
            },
        )


def _pod(shape: str, name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"fleet": shape}},
        "spec": {
            "containers": [
                {
                    "name": "work",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"fleet-{shape}"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


# ----- the two shapes of pools ----------------------------------------------------------------


@contextmanager
def ours_published(cluster: Cluster, nodes: int) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """Our pools, published by fleet_publisher.py until the block ends; then its slices go.
    Yields the process and the requests its start took."""
    argv = [
        sys.executable, str(HERE / "fleet_publisher.py"), str(cluster.admin_kubeconfig),
        DRIVERS[OURS], *(node_name(i) for i in range(nodes)),
    ]  # fmt: skip
    log = open(cluster.logs / "fleet-publisher.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
    )
    try:
        ready = answer(proc)
        yield proc, sum(ready["requests"].values())
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        _delete_slices(cluster, DRIVERS[OURS])


def answer(proc: subprocess.Popen[str], command: str | None = None) -> dict[str, Any]:
    """Send ``command`` (if any) to the publisher process and read its one-line answer."""
    assert proc.stdin is not None and proc.stdout is not None
    if command is not None:
        proc.stdin.write(command + "\n")
        proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"fleet publisher ended (exit {proc.wait()}); see its log")
    result: dict[str, Any] = json.loads(line)
    return result


def example_slice(node: str, uid: str) -> Obj:
    """dra-example-driver's shape: one slice of 8 devices, a name and one attribute each."""
    driver = DRIVERS[EXAMPLE]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node}-{driver}",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}],
        },
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(GPUS)
            ],
        },
    }


@contextmanager
def example_published(cluster: Cluster, nodes: int) -> Iterator[None]:
    api = cluster.api
    assert api is not None
    uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in api.get("/api/v1/nodes")["items"]}
    with concurrent.futures.ThreadPoolExecutor(CREATORS) as pool:
        list(
            pool.map(
                lambda i: api.create(SLICES, example_slice(node_name(i), uids[node_name(i)])),
                range(nodes),
            )
        )
    try:
        yield
    finally:
        _delete_slices(cluster, DRIVERS[EXAMPLE])


def _delete_slices(cluster: Cluster, driver: str) -> None:
    api = cluster.api
    assert api is not None
    api.request("DELETE", f"{SLICES}?fieldSelector=spec.driver%3D{driver}")
    _wait(
        f"ResourceSlices of {driver} deleted",
        lambda: not api.get(f"{SLICES}?fieldSelector=spec.driver%3D{driver}")["items"],
    )


# ----- the workload ---------------------------------------------------------------------------


@dataclass
class Figures:
    """What one shape's workload measured (lists over rounds)."""

    throughput: list[float] = field(default_factory=list)
    fill_alloc: list[float] = field(default_factory=list)
    fill_sched: list[float] = field(default_factory=list)
    churn_alloc: list[float] = field(default_factory=list)
    churn_sched: list[float] = field(default_factory=list)
    churn_rate: list[float] = field(default_factory=list)
    #: CPU seconds per fill pod of each control-plane component: unlike the wall-clock
    #: figures, hardly moved by other load on a shared machine.
    cpu_per_pod: dict[str, list[float]] = field(default_factory=dict)
    #: The scheduler's attempts per fill pod, by result: a pod tried again shows here.
    attempts: dict[str, list[float]] = field(default_factory=dict)


#: The components whose CPU the fill is charged.
CPU_COMPONENTS = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")


def _attempts(cluster: Cluster) -> dict[str, float]:
    """The scheduler's attempts so far, by result (scheduled, unschedulable, error)."""
    name = "scheduler_schedule_attempts_total"
    sums = metric_sums(cluster.metrics("kube-scheduler"), (name,), "")
    return {k.split(":", 1)[1]: v for k, v in sums.items() if ":" in k}


def _cpu(cluster: Cluster) -> dict[str, float]:
    out = {}
    for name in CPU_COMPONENTS:
        process = cluster.components[name].process
        assert process is not None
        out[name] = cpu_seconds(process.pid)
    return out


def workload(
    cluster: Cluster, shape: str, nodes: int, churn_seconds: float, figures: Figures
) -> None:
    """Fill to 90 %, churn, then delete every pod of ``shape`` and wait for its claims to go."""
    api = cluster.api
    assert api is not None
    selector = f"fleet={shape}"
    pods = Stamps(api, PODS, scheduled, selector)
    claims = Stamps(api, CLAIMS, allocated, selector)
    try:
        _run_workload(
            cluster,
            shape,
            nodes=nodes,
            churn_seconds=churn_seconds,
            figures=figures,
            pods=pods,
            claims=claims,
        )
    finally:
        # One call per pod from a pool of threads: a deletecollection of hundreds of pods
        # with claims outlasts any sensible client timeout on a loaded machine.
        left = api.get(f"{PODS}?labelSelector=fleet%3D{shape}")["items"]
        with concurrent.futures.ThreadPoolExecutor(CREATORS) as pool:
            list(pool.map(lambda p: api.delete(f"{PODS}/{p['metadata']['name']}"), left))
        _wait(
            f"pods and claims of {shape} gone",
            lambda: (
                not api.get(f"{PODS}?labelSelector=fleet%3D{shape}")["items"]
                and not api.get(f"{CLAIMS}?labelSelector=fleet%3D{shape}")["items"]
            ),
        )
        pods.stop()
        claims.stop()


def _run_workload(
    cluster: Cluster,
    shape: str,
    *,
    nodes: int,
    churn_seconds: float,
    figures: Figures,
    pods: Stamps,
    claims: Stamps,
) -> None:
    api = cluster.api
    assert api is not None
    fill = int(nodes * GPUS * FILL)
    names = [f"{shape}-fill-{i}" for i in range(fill)]
    cpu = _cpu(cluster)
    attempts = _attempts(cluster)
    with concurrent.futures.ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(lambda n: api.create(PODS, _pod(shape, n)), names))
    fill_set = set(names)
    _wait(f"{fill} pods of {shape} scheduled", lambda: pods.count_done(fill_set) == fill)
    first = min(pods.seen[n] for n in names)
    last = max(pods.finished[n] for n in names)
    figures.throughput.append(fill / (last - first))
    for name, seconds in _cpu(cluster).items():
        figures.cpu_per_pod.setdefault(name, []).append((seconds - cpu[name]) / fill)
    for result, count in _attempts(cluster).items():
        figures.attempts.setdefault(result, []).append((count - attempts.get(result, 0)) / fill)
    figures.fill_sched += pods.latencies(fill_set)
    figures.fill_alloc += claims.latencies({n for n in claims.finished if "-fill-" in n})
    _check(pods, claims)

    # Churn: each tick deletes the oldest pod and creates one; the fleet stays at 90 %. The
    # calls go to a pool of threads, so a slow answer does not hold up the next tick.
    live = list(names)
    churned: list[str] = []
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CREATORS) as pool:
        calls = []
        while (now := time.monotonic()) - start < churn_seconds:
            due = start + len(churned) / CHURN_RATE
            if now < due:
                time.sleep(due - now)
            name = f"{shape}-churn-{len(churned)}"
            calls.append(pool.submit(api.delete, f"{PODS}/{live.pop(0)}"))
            calls.append(pool.submit(api.create, PODS, _pod(shape, name)))
            live.append(name)
            churned.append(name)
        for call in calls:
            call.result()
    churn_set = set(churned)
    _wait(
        f"{len(churned)} churn pods of {shape} scheduled",
        lambda: pods.count_done(churn_set) == len(churned),
    )
    last = max(pods.finished[n] for n in churned)
    figures.churn_rate.append(len(churned) / (last - min(pods.seen[n] for n in churned)))
    figures.churn_sched += pods.latencies(churn_set)
    figures.churn_alloc += claims.latencies({n for n in claims.finished if "-churn-" in n})
    _check(pods, claims)


def _check(*stamps: Stamps) -> None:
    for s in stamps:
        if s.error:
            raise RuntimeError(s.error)


# ----- hotplug churn --------------------------------------------------------------------------

_METRICS = ("apiserver_request_total", "apiserver_watch_events_total")


@dataclass
class Window:
    seconds: float
    cpu: float  # API server CPU seconds
    rss: float  # API server VmRSS at the end (MiB)
    metrics: dict[str, float]
    etcd_cpu: float


def _window(cluster: Cluster, run: Callable[[], Any]) -> tuple[Window, Any]:
    api = cluster.api
    assert api is not None
    server = cluster.components["kube-apiserver"].process
    etcd = cluster.components["etcd"].process
    assert server is not None and etcd is not None
    label = 'resource="resourceslices"'
    before = metric_sums(api.text("/metrics"), _METRICS, label)
    cpu, etcd_cpu, start = cpu_seconds(server.pid), cpu_seconds(etcd.pid), time.monotonic()
    result = run()
    seconds = time.monotonic() - start
    cpu, etcd_cpu = cpu_seconds(server.pid) - cpu, cpu_seconds(etcd.pid) - etcd_cpu
    after = metric_sums(api.text("/metrics"), _METRICS, label)
    delta = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}
    return Window(seconds, cpu, rss_mib(server.pid), delta, etcd_cpu), result


def hotplug(
    cluster: Cluster, proc: subprocess.Popen[str], seconds: float, compress: float
) -> tuple[list[Row], dict[str, float]]:
    """The hotplug churn's rows, and the figures the paper arithmetic uses."""
    cycle = 60.0 / compress
    quiet, _ = _window(cluster, lambda: time.sleep(seconds))
    busy, result = _window(cluster, lambda: answer(proc, f"hotplug {cycle} {seconds}"))
    events = result["events"]
    per = {verb: n / events for verb, n in sorted(result["requests"].items())}
    writes = sum(v for k, v in busy.metrics.items() if k.split(":")[-1] in ("POST", "PUT"))
    fanout = busy.metrics.get("apiserver_watch_events_total", 0.0) / writes if writes else 0.0
    server_requests = {
        k.split(":")[1]: v for k, v in busy.metrics.items() if k.startswith("apiserver_request")
    }
    lat = sorted(1e3 * x for x in result["latencies"])
    rate = events / result["seconds"]
    figures = {
        "fanout": fanout,
        "server_cpu_ms": 1e3 * (busy.cpu / busy.seconds - quiet.cpu / quiet.seconds) / rate,
        "requests": sum(per.values()),
    }
    return figures, [
        (f"hotplug events (1 add + 1 remove per node per {cycle:g} s = per minute ÷ "
         f"{compress:g})", f"{events} in {result['seconds']:.0f} s ({rate:.1f}/s)", "—"),
        ("  requests per event at our clients, by verb",
         ", ".join(f"{v} {n:.2f}" for v, n in per.items()), "1 write of 1 slice"),
        ("  body bytes sent per event", f"{result['body_bytes'] / events:,.0f} B", "one slice"),
        ("  API server's resourceslices requests, by verb",
         ", ".join(f"{v} {n:.0f}" for v, n in sorted(server_requests.items())), "—"),
        ("  watch events sent per slice write (fan-out)", f"{fanout:.2f}", "—"),
        ("  hotplug → published in the API, p50 / p99",
         f"{statistics.median(lat):.1f} / {percentile(lat, 99):.1f} ms", "—"),
        ("  publisher process CPU per event", f"{1e3 * result['cpu_seconds'] / events:.2f} ms",
         "—"),
        ("  API server CPU, quiet fleet → hotplug churn",
         f"{100 * quiet.cpu / quiet.seconds:.1f} % → {100 * busy.cpu / busy.seconds:.1f} % of a "
         f"core", "—"),
        ("  API server CPU per hotplug event (above quiet)",
         f"{1e3 * (busy.cpu / busy.seconds - quiet.cpu / quiet.seconds) / rate:.2f} ms", "—"),
        ("  API server VmRSS, quiet fleet → after churn", f"{quiet.rss:.0f} → {busy.rss:.0f} MiB",
         "—"),
        ("  etcd CPU, quiet fleet → hotplug churn",
         f"{100 * quiet.etcd_cpu / quiet.seconds:.1f} % → "
         f"{100 * busy.etcd_cpu / busy.seconds:.1f} % of a core", "—"),
    ]  # fmt: skip


def hotplug_split(
    cluster: Cluster, proc: subprocess.Popen[str], seconds: float, compress: float
) -> list[Row]:
    """The same hotplug churn once each node's first GPU is unhealthy: its taint puts it in a
    slice of its own, so every pool spans two slices while the events touch one of them."""
    answer(proc, "unhealthy")
    count = slice_sizes(cluster, DRIVERS[OURS])[0]
    result = answer(proc, f"hotplug {60.0 / compress} {seconds}")
    events = result["events"]
    per = {verb: n / events for verb, n in sorted(result["requests"].items())}
    return [
        (f"hotplug with one unhealthy GPU a node ({count} slices): requests per event",
         ", ".join(f"{v} {n:.2f}" for v, n in per.items()), "1 write of 1 slice"),
        ("  body bytes sent per event", f"{result['body_bytes'] / events:,.0f} B", "one slice"),
    ]  # fmt: skip


#: The fleet on paper: the Kubernetes scalability limit for nodes, 64 devices each.
PAPER_NODES, PAPER_DEVICES = 5000, 64
#: The apiserver's default compaction interval: old revisions of a slice live this long.
COMPACTION_SECONDS = 300


def paper(wide: tuple[int, int], hot: dict[str, float]) -> list[Row]:
    """5,000 nodes x 64 devices from the measured sizes and costs, at one hotplug per node
    per hour (one slice write each, as measured)."""
    json_bytes, stored = wide
    nodes = PAPER_NODES
    writes = nodes / 3600
    mib = 1 << 20
    fanout = hot["fanout"]
    kept = writes * COMPACTION_SECONDS
    return [
        (f"paper, {nodes:,} nodes x {PAPER_DEVICES} devices: ResourceSlices",
         f"{nodes:,} (one a node: ≤ 128 plain devices a slice)", "—"),
        ("  bytes in etcd (one slice measured: JSON / stored)",
         f"{nodes * stored / mib:.0f} MiB ({json_bytes:,} / {stored:,} B a slice)",
         "etcd quota 2 GiB default, 8 GiB max"),
        ("  one full LIST of slices (an informer's start)", f"{nodes * json_bytes / mib:.0f} MiB",
         "—"),
        ("  writes at 1 hotplug per node per hour",
         f"{writes:.2f}/s, {writes * stored / 1024:.1f} KiB/s to etcd", "—"),
        (f"  old revisions until compaction ({COMPACTION_SECONDS} s)",
         f"{kept:.0f} ({kept * stored / mib:.1f} MiB)",
         "—"),
        (f"  watch events out ({fanout:.1f} per write, measured)",
         f"{writes * fanout:.1f}/s, {writes * fanout * json_bytes / 1024:.0f} KiB/s", "—"),
        ("  API server CPU for them (measured per event)",
         f"{writes * hot['server_cpu_ms'] / 10:.2f} % of a core", "—"),
        ("  every agent restarting at once (rollout): requests",
         f"{nodes * hot['start_requests']:,.0f} ({hot['start_requests']:.0f} a node)", "—"),
    ]  # fmt: skip


# ----- sizes ----------------------------------------------------------------------------------


def etcd_bytes(cluster: Cluster, name: str) -> int:
    """Bytes of the stored value of ResourceSlice ``name`` in etcd (the API server's protobuf),
    read through etcd's JSON gateway."""
    url = f"http://127.0.0.1:{cluster.ports['etcd']}/v3/kv/range"

    def post(body: Obj) -> Obj:
        request = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as r:
            result: Obj = json.loads(r.read())
            return result

    b64 = base64.b64encode
    keys = post({"key": b64(b"/registry/").decode(), "range_end": b64(b"/registry0").decode(),
                 "keys_only": True, "limit": 100000})  # fmt: skip
    suffix = f"/resourceslices/{name}".encode()
    for kv in keys.get("kvs", []):
        key = base64.b64decode(kv["key"])
        if key.endswith(suffix):
            value = post({"key": kv["key"]})["kvs"][0]["value"]
            return len(base64.b64decode(value))
    raise LookupError(f"ResourceSlice {name} not found in etcd")


def slice_sizes(cluster: Cluster, driver: str) -> tuple[int, int, int]:
    """(slices, JSON bytes of one, etcd bytes of one) of ``driver``'s slices."""
    api = cluster.api
    assert api is not None
    items = api.get(f"{SLICES}?fieldSelector=spec.driver%3D{driver}")["items"]
    one = items[0]
    one["metadata"].pop("managedFields", None)
    return (
        len(items),
        len(json.dumps(one, separators=(",", ":"))),
        etcd_bytes(cluster, one["metadata"]["name"]),
    )


def wide_slice_bytes(cluster: Cluster, devices: int) -> tuple[int, int]:
    """(JSON bytes, etcd bytes) of one node's pool of ``devices`` GPUs as our code builds it
    (one slice up to 128 plain devices), written once for a node of the fleet and deleted."""
    api = cluster.api
    assert api is not None
    driver = "paper.cdi-gen.io"
    built = pool_slices(driver, node_name(0), devices)
    if len(built) != 1:
        raise RuntimeError(f"{devices} devices built {len(built)} slices, not one")
    api.create(SLICES, built[0])
    try:
        return slice_sizes(cluster, driver)[1:]
    finally:
        _delete_slices(cluster, driver)


# ----- the run --------------------------------------------------------------------------------


def _ms(samples: list[float]) -> str:
    ms = sorted(1e3 * s for s in samples)
    return f"{statistics.median(ms):.0f} / {percentile(ms, 99):.0f} ms"


def run(args: argparse.Namespace) -> list[Row]:
    why = missing()
    if why is not None:
        return [("fleet", why, "—")]
    wall = time.monotonic()
    kwok_path, kwok_cold = binary()
    binaries, etcd, runtime_root = components()
    rows: list[Row] = [
        (f"fleet: {args.nodes} kwok nodes, {GPUS} devices, {args.rounds} round(s)",
         f"fill {int(args.nodes * GPUS * FILL)} pods, churn {args.churn:g} s", "—"),
        (f"go build of kwok ({kwok_path.parent.parent.name}) when cached (recorded)",
         f"{kwok_cold:.0f} s", "once per pin"),
    ]  # fmt: skip
    cluster = Cluster(binaries, etcd, runtime_root, CURRENT, node_count=0, client_qps=100)
    figures = {OURS: Figures(), EXAMPLE: Figures()}
    try:
        cluster.start()
        api = cluster.api
        assert api is not None
        controller = kwok(cluster.admin_kubeconfig, cluster.work, cluster.logs)
        cluster.components["kwok"] = controller
        controller.start()
        rows.append(("control plane start (warm)", f"{cluster.timings['total']:.1f} s", "—"))
        rows.append(("kwok nodes created → all Ready", f"{_create_nodes(api, args.nodes):.1f} s",
                     "—"))  # fmt: skip
        _setup_classes(api)
        sizes: dict[str, tuple[int, int, int]] = {}
        hot: list[Row] = []
        hot_figures: dict[str, float] = {}
        for round_ in range(args.rounds):
            order = (OURS, EXAMPLE) if round_ % 2 == 0 else (EXAMPLE, OURS)
            for shape in order:
                if shape == OURS:
                    with ours_published(cluster, args.nodes) as (proc, start_requests):
                        sizes[OURS] = slice_sizes(cluster, DRIVERS[OURS])
                        workload(cluster, OURS, args.nodes, args.churn, figures[OURS])
                        if not hot:
                            hot_figures, hot = hotplug(cluster, proc, args.hotplug, args.compress)
                            hot_figures["start_requests"] = start_requests / args.nodes
                            hot += hotplug_split(cluster, proc, args.hotplug, args.compress)
                else:
                    with example_published(cluster, args.nodes):
                        sizes[EXAMPLE] = slice_sizes(cluster, DRIVERS[EXAMPLE])
                        workload(cluster, EXAMPLE, args.nodes, args.churn, figures[EXAMPLE])
        wide = wide_slice_bytes(cluster, PAPER_DEVICES)
        rows += _workload_rows(figures, sizes)
        rows += hot
        rows += paper(wide, hot_figures)
    finally:
        if "kwok" in cluster.components:
            # Not one of the cluster's own components: stopped before them.
            cluster.components["kwok"].stop()
        problems = cluster.stop()
        cluster.remove()
        if problems:
            print("teardown left: " + "; ".join(problems), file=sys.stderr)
    rows.append(("benchmark wall time", f"{time.monotonic() - wall:.0f} s", "—"))
    return rows


def _workload_rows(
    figures: dict[str, Figures], sizes: dict[str, tuple[int, int, int]]
) -> list[Row]:
    rows: list[Row] = []
    for shape in (OURS, EXAMPLE):
        f, (count, json_bytes, stored) = figures[shape], sizes[shape]
        rows += [
            (f"{shape}: slices; one slice as JSON / in etcd",
             f"{count}; {json_bytes:,} B / {stored:,} B", "—"),
            (f"{shape}: fill throughput (pods/s, each round)",
             " / ".join(f"{t:.1f}" for t in f.throughput), "—"),
            (f"{shape}: fill claim created → allocated, p50 / p99", _ms(f.fill_alloc), "—"),
            (f"{shape}: fill pod created → scheduled, p50 / p99", _ms(f.fill_sched), "—"),
            (f"{shape}: churn at {CHURN_RATE:g}/s: scheduled pods/s",
             " / ".join(f"{t:.1f}" for t in f.churn_rate), f"{CHURN_RATE:g}"),
            (f"{shape}: churn claim created → allocated, p50 / p99", _ms(f.churn_alloc), "—"),
            (f"{shape}: churn pod created → scheduled, p50 / p99", _ms(f.churn_sched), "—"),
        ]  # fmt: skip
    ours, example = figures[OURS], figures[EXAMPLE]
    for result in sorted(set(ours.attempts) | set(example.attempts)):
        mine, theirs = ours.attempts.get(result, [0.0]), example.attempts.get(result, [0.0])
        rows.append((
            f"scheduler attempts '{result}' per fill pod, ours / example (each round)",
            " / ".join(f"{a:.2f}" for a in mine) + " vs " + " / ".join(f"{b:.2f}" for b in theirs),
            "informative",
        ))  # fmt: skip
    for name in CPU_COMPONENTS:
        mine, theirs = ours.cpu_per_pod[name], example.cpu_per_pod[name]
        rows.append((
            f"{name} CPU per fill pod, ours / example (each round)",
            " / ".join(f"{1e3 * a:.1f}" for a in mine) + " ms vs "
            + " / ".join(f"{1e3 * b:.1f}" for b in theirs) + " ms"
            + f" ({statistics.median(mine) / statistics.median(theirs):.2f}x)",
            "informative",
        ))  # fmt: skip
    # Paired within each round (the two shapes back to back), then the median: the load of a
    # shared machine moves between rounds more than between the two halves of one.
    pairs = [a / b for a, b in zip(ours.throughput, example.throughput, strict=True)]
    through = statistics.median(pairs)
    p99 = percentile(ours.fill_alloc + ours.churn_alloc, 99) / percentile(
        example.fill_alloc + example.churn_alloc, 99
    )
    rows += [
        (
            "ratio ours / example: fill throughput, median of rounds",
            f"{through:.2f} ({' / '.join(f'{r:.2f}' for r in pairs)})",
            "≥ 0.95",
        ),
        ("ratio ours / example: claim allocation p99 (fill + churn)", f"{p99:.2f}", "≤ 1.1"),
    ]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=100, help="kwok nodes (default 100)")
    parser.add_argument("--churn", type=float, default=60, help="churn seconds (default 60)")
    parser.add_argument(
        "--hotplug",
        type=float,
        default=60,
        help="hotplug churn seconds, and as long a quiet window (default 60)",
    )
    parser.add_argument(
        "--compress",
        type=float,
        default=10,
        help="time compression of the hotplug cycle of 1 min (default 10)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of both shapes, the order alternating (default 1)",
    )
    parser.add_argument("--quick", action="store_true", help="25 nodes, 20 s phases")
    args = parser.parse_args()  # fmt: skip
    if args.quick:
        args.nodes, args.churn, args.hotplug = 25, 20.0, 20.0
    print_table("fleet", run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
