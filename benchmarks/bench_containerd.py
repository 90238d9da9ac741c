"""Hotplug to a running container through containerd 1.7, and where the time goes.

One cycle is the node path of a new device, each step timed as the kubelet would see it:
LOOP_CTL_ADD (the kernel's add uevent) -> ``cdi-gen run`` writes the spec -> the device is in
ListAndWatch at the (fake, real-gRPC) kubelet -> Allocate answers -> RunPodSandbox ->
CreateContainer with the CDI names unchanged -> StartContainer returns (running). The container
checks that the node is there and keeps running, so a missing device fails the benchmark.

Uses the e2e machinery of tests/e2e/containerd (Debian 13's containerd 1.7, private config) and
loop numbers 300-399 so that other tests' loop devices (200-299) never rewrite its spec.

    python benchmarks/bench_containerd.py [--quick]
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO / "tests"), str(REPO / "tests/e2e")]
from _table import Row, percentile, print_table  # noqa: E402
from containerd._cri import api_pb2 as cri_pb  # noqa: E402
from containerd.agent import RESOURCE, RunningAgent, run_agent  # noqa: E402
from containerd.conftest import Pods  # noqa: E402
from containerd.daemon import Containerd, remove_work, work_folder  # noqa: E402
from containerd.fetch import fetch  # noqa: E402
from containerd.image import IMAGE_NAME, build_archive  # noqa: E402

LOOP_CTL_ADD = 0x4C80
LOOP_CTL_REMOVE = 0x4C81
LOW, HIGH = 300, 399
STEPS = (
    "kernel add → spec written",
    "spec written → ListAndWatch",
    "ListAndWatch → Allocate answered",
    "Allocate → RunPodSandbox",
    "RunPodSandbox → CreateContainer",
    "CreateContainer → StartContainer",
)


def _loop_control(request: int, number: int) -> None:
    fd = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, request, number)
    finally:
        os.close(fd)


def _free_loop(used: set[int]) -> int:
    for n in range(LOW, HIGH + 1):
        if n not in used and not os.path.exists(f"/sys/block/loop{n}"):
            return n
    raise RuntimeError(f"no free loop number in {LOW}-{HIGH}")


def _remove_loop(number: int) -> None:
    deadline = time.monotonic() + 5
    while True:
        try:
            _loop_control(LOOP_CTL_REMOVE, number)
            return
        except OSError as exc:
            if exc.errno in (errno.ENODEV, errno.ENXIO):
                return
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _spec_mtime_ns(spec_dir: Path, name: str) -> int:
    """When the spec file that names ``name`` was last written (the agent's atomic rename)."""
    for path in spec_dir.iterdir():
        if path.suffix in (".json", ".yaml") and name in path.read_text():
            return path.stat().st_mtime_ns
    raise AssertionError(f"no spec in {spec_dir} names {name}")


@dataclass
class Cycle:
    steps_ms: list[float]

    @property
    def total_ms(self) -> float:
        return sum(self.steps_ms)


async def _cycle(agent: RunningAgent, pods: Pods, spec_dir: Path, used: set[int]) -> Cycle:
    number = _free_loop(used)
    name = f"loop{number}"
    wall0 = time.time_ns()
    t0 = time.perf_counter()
    _loop_control(LOOP_CTL_ADD, number)
    used.add(number)
    try:
        await agent.wait_for_devices(present=[name])
        t_law = time.perf_counter()
        spec_s = (_spec_mtime_ns(spec_dir, name) - wall0) / 1e9
        response = await agent.allocate(name)
        t_alloc = time.perf_counter()
        pod = await asyncio.to_thread(pods.new, f"bench-{number}")
        t_pod = time.perf_counter()
        script = f"test -b /dev/{name} || exit 3; exec sleep inf"
        cid = await asyncio.to_thread(
            pods.cri.create_container,
            pod,
            "consumer",
            IMAGE_NAME,
            ["/bin/sh", "-c", script],
            cdi_devices=[d.name for d in response.cdi_devices],
        )
        t_create = time.perf_counter()
        await asyncio.to_thread(pods.cri.start_container, cid)
        t_start = time.perf_counter()
        if [d.name for d in response.cdi_devices] != [f"{RESOURCE}={name}"]:
            raise AssertionError(f"Allocate answered {response}")
        await asyncio.sleep(0.05)
        status = await asyncio.to_thread(pods.cri.status, cid)
        if status.state != cri_pb.CONTAINER_RUNNING:
            raise AssertionError(f"container without /dev/{name}: {status}")
    finally:
        await asyncio.to_thread(pods.remove_all)
        await asyncio.to_thread(_remove_loop, number)
        used.discard(number)
    await agent.wait_for_devices(absent=[name])
    law_s = t_law - t0
    return Cycle(
        [
            1e3 * spec_s,
            1e3 * (law_s - spec_s),
            1e3 * (t_alloc - t_law),
            1e3 * (t_pod - t_alloc),
            1e3 * (t_create - t_pod),
            1e3 * (t_start - t_create),
        ]
    )


async def _bench(cycles: int) -> list[Row]:
    dist = fetch()
    work = work_folder()
    etc, run = work / "cdi/etc", work / "cdi/run"
    etc.mkdir(parents=True)
    run.mkdir(parents=True)
    daemon = Containerd(dist, work, [etc, run], IMAGE_NAME)
    used: set[int] = set()
    try:
        await asyncio.to_thread(daemon.start)
        await asyncio.to_thread(daemon.import_image, build_archive(work / "busybox.tar"))
        pods = Pods(daemon)
        (work / "agent").mkdir()
        async with run_agent(work / "agent", [etc, run], ["loop3[0-9][0-9]"]) as agent:
            await _cycle(agent, pods, run, used)  # warm-up: first sandbox, first spec file
            results = [await _cycle(agent, pods, run, used) for _ in range(cycles)]
    finally:
        for number in used:
            _remove_loop(number)
        await asyncio.to_thread(daemon.stop)
        remove_work(work)
    totals = [c.total_ms for c in results]
    p50 = statistics.median(totals)
    rows: list[Row] = [
        (f"hotplug → container running, p50 of {cycles}", f"{p50:.1f} ms", "—"),
        (f"hotplug → container running, p99 of {cycles}", f"{percentile(totals, 99):.1f} ms", "—"),
    ]
    to_law = [c.steps_ms[0] + c.steps_ms[1] for c in results]
    rows.append(
        (
            f"kernel add → ListAndWatch, p99 of {cycles}",
            f"{percentile(to_law, 99):.1f} ms",
            "≤ 50 ms (issue 5)",
        )
    )
    for i, step in enumerate(STEPS):
        step_p50 = statistics.median(c.steps_ms[i] for c in results)
        share = statistics.median(100 * c.steps_ms[i] / c.total_ms for c in results)
        rows.append((f"  {step}, p50 (share)", f"{step_p50:.1f} ms ({share:.0f} %)", "—"))
    return rows


def run(quick: bool = False) -> list[Row]:
    """Measure; return rows of (metric, measured value, target)."""
    if os.geteuid() != 0:
        return [("hotplug → container running", "not measured: needs root", "—")]
    return asyncio.run(_bench(5 if quick else 20))


if __name__ == "__main__":
    print_table("containerd", run("--quick" in sys.argv))
