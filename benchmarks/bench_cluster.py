"""The device path on a real single-node cluster of every lane (tests/cluster), side by side in
one run: what a user of the API sees.

- kernel add → Node allocatable updated in the API: LOOP_CTL_ADD of a device the running
  ``cdi-gen run`` serves, until ``status.allocatable`` shows it (polled every 10 ms). The kubelet
  publishes Node status on its ``nodeStatusUpdateFrequency`` tick (1 s in this cluster, 10 s by
  default), which bounds this figure; the tick is printed as the floor.
- pod created → Running, with one device vs without: the device path's added cost (Allocate,
  CDI injection) over the same pod without a limit, measured alternately in the same run.
- cluster start-up: the cold part is the build, recorded when the binaries entered the cache
  (go build of five commands; from an empty Go build cache it took 607 s on the 2-core
  development VM, far less when Go's own cache was warm), and the warm start (binaries cached)
  from nothing to a Ready Node, twice, with its steps.

Loop numbers 500-599, so the cluster tests (400-499) and other suites never meet these.

    python benchmarks/bench_cluster.py [--quick]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _cluster import LOOP_HIGH, LOOP_LOW, bench_cluster, components, missing  # noqa: E402
from _cluster import wait_allocatable as _allocatable  # noqa: E402
from _table import Row, percentile, print_table  # noqa: E402
from cluster.agent import NodeAgent, class_config  # noqa: E402
from cluster.cluster import NODE_STATUS_SECONDS, Cluster  # noqa: E402
from cluster.lane import LANES  # noqa: E402
from cluster.pods import Pods, phase  # noqa: E402
from loopdev import LoopDevices  # noqa: E402

RESOURCE = "example.com/fpga"


def _wait_allocatable(cluster: Cluster, count: int) -> float:
    """Seconds until the Node's allocatable is ``count``, polled every 10 ms."""
    return _allocatable(cluster, (RESOURCE,), count)


def _hotplug(cluster: Cluster, work: Path, cycles: int) -> list[Row]:
    loops = LoopDevices(LOOP_LOW, LOOP_HIGH)
    # One reserved number reused per cycle: the kubelet sees exactly one device come and go.
    number = loops.reserve().number
    config = work / "bench-agent.yaml"
    config.write_text(class_config("fpga", [f"loop{number}"]))
    agent = NodeAgent(cluster, config, work / "bench-agent.log")
    agent.start()
    samples: list[float] = []
    try:
        _wait_allocatable(cluster, 0)
        for _ in range(cycles):
            loops.add(number)
            samples.append(1e3 * _wait_allocatable(cluster, 1))
            loops.remove(number)
            _wait_allocatable(cluster, 0)
    finally:
        loops.cleanup()
        agent.stop()
    return [
        (f"kernel add → Node allocatable, p50 of {cycles}", f"{statistics.median(samples):.0f} ms",
         f"≤ {NODE_STATUS_SECONDS * 1000} ms (kubelet status tick)"),
        (f"kernel add → Node allocatable, p99 of {cycles}", f"{percentile(samples, 99):.0f} ms",
         f"≤ {NODE_STATUS_SECONDS * 1000} ms + jitter"),
    ]  # fmt: skip


def _pod_start(cluster: Cluster, work: Path, rounds: int) -> list[Row]:
    assert cluster.api is not None
    loops = LoopDevices(LOOP_LOW, LOOP_HIGH)
    device = loops.add()
    config = work / "bench-pods.yaml"
    config.write_text(class_config("fpga", [device.name]))
    agent = NodeAgent(cluster, config, work / "bench-pods.log")
    agent.start()
    pods = Pods(cluster.api)
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        _wait_allocatable(cluster, 1)
        for i in range(rounds + 1):  # the first round warms up (first sandbox of the image)
            for with_device in (False, True):
                name = f"bench-{'dev' if with_device else 'plain'}-{i}"
                start = time.monotonic()
                pods.create(name, {RESOURCE: 1} if with_device else {})
                while phase(pods.get(name)) != "Running":
                    if time.monotonic() - start > 60:
                        raise TimeoutError(f"pod {name} not Running")
                    time.sleep(0.01)
                if i:
                    times[with_device].append(1e3 * (time.monotonic() - start))
                pods.delete(name)
    finally:
        pods.delete_all()
        agent.stop()
        loops.cleanup()
        for spec in cluster.cdi_run.glob("*"):
            spec.unlink()
    plain, dev = statistics.median(times[False]), statistics.median(times[True])
    return [
        (f"pod created → Running, no device, p50 of {rounds}", f"{plain:.0f} ms", "floor"),
        (f"pod created → Running, one device, p50 of {rounds}", f"{dev:.0f} ms",
         f"{dev / plain:.2f}x the floor"),
    ]  # fmt: skip


def run(quick: bool = False) -> list[Row]:
    """Measure; return rows of (metric, measured value, target)."""
    why = missing()
    if why is not None:
        return [("cluster", why, "—")]
    rows: list[Row] = []
    # The device path in every lane, side by side in one run: the same agent and pods on each
    # Kubernetes and runtime pair users run.
    for lane in LANES.values():
        parts = components(lane)
        binaries = parts[0]
        runtime = f"{lane.runtime} {lane.runtime_release() or '1.7 (Debian)'}"
        rows.append((f"{lane.name} lane: Kubernetes {binaries.version}, {runtime}",
                     f"cold go build {binaries.cold_seconds:.0f} s (recorded)", "—"))  # fmt: skip
        with bench_cluster(parts, lane) as cluster:
            rows += [(f"  {metric}", value, target) for metric, value, target in
                     _hotplug(cluster, cluster.work, 5 if quick else 20)
                     + _pod_start(cluster, cluster.work, 2 if quick else 5)]  # fmt: skip
    parts = components()
    starts: list[float] = []
    for _ in range(2):
        with bench_cluster(parts) as cluster:
            starts.append(cluster.timings["total"])
            breakdown = dict(cluster.timings)
    rows += [
        ("warm cluster start-up (current lane) → Node Ready, 1st / 2nd",
         f"{starts[0]:.1f} s / {starts[1]:.1f} s", "—"),
    ]  # fmt: skip
    rows += [(f"  {step}", f"{seconds:.2f} s", "") for step, seconds in breakdown.items()
             if step != "total"]  # fmt: skip
    return rows


if __name__ == "__main__":
    print_table("cluster", run("--quick" in sys.argv))
