"""The agent's footprint against floors measured in the same run: memory, start-up, idle CPU.

    python benchmarks/bench_footprint.py [--quick]

The floor (``_floor.py``) is a Python process that imports what the design needs (grpcio,
protobuf, pydantic's BaseModel, orjson, click, pyudev, prometheus-client, the device plugin
protos), serves five grpc servers and the metrics HTTP server, and does nothing else; the DRA
floor adds the API server client (lightkube, httpx2) and the DRA protos. Informative rows show
each floor also *using* what it loaded (``_floor.py ... used``: one pydantic model built, and
for DRA the API client made), with the agent against that too. Every agent runs in a
process of its own (``_recorded.py``: the real agent, udev replaced by recorded devices)
against the fakes of the suite in this process, and is read from /proc once it serves all its
devices:

- device-plugin agent, 5 classes of 200 devices, every plugin registered with a fake kubelet
  and its ListAndWatch holding its 200 devices: VmRSS against the floor's; informative, the
  same agent once each class answered one Allocate (the first reads the spec folders and
  builds the spec models), and the same with one device a class (what does not grow with
  the devices);
- DRA agent, the same devices, until the fake API server's ResourceSlices list all 1,000:
  VmRSS against the DRA floor's; the fake serves HTTPS under a CA of its own, which the
  agent's kubeconfig names, as a pod's service account does;
- ``cdi-gen render --vendor example.com --class fpga`` wall time (p50), against
  ``cdi-gen --help``; the installed script, with bytecode, as an operator runs it;
- ``cdi-gen run`` spawned → its first RegisterRequest at a fake kubelet (p50), beside the
  floor's spawn → serving;
- idle CPU: one class of 64 devices, its plugin registered and its ListAndWatch open, CPU
  seconds (user + system, every thread) over a quiet window, per minute; the floor's over
  the same window beside it; informative, the agent's by kind of thread (its event loop,
  grpc's Python server threads, grpc core's own), which says what wakes it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from _recorded import CLASSES, PER_CLASS
from _table import Row, cli_env, percentile

from tests.processes import terminate  # importable once _table put the repository on sys.path

if TYPE_CHECKING:
    from tests.fakes.kubelet import ConnectedPlugin, FakeKubelet

HERE = Path(__file__).resolve().parent

IDLE_DEVICES = 64
MEMORY_TARGET = 1.15
RENDER_TARGET_MS = 150
REGISTER_TARGET_MS = 150
IDLE_TARGET = 0.05  # CPU seconds per minute

START_CONFIG = """
vendor: example.com
classes:
  - name: loop
    match: {subsystem: block, kernel: "loop[5-9][0-9][0-9]"}
"""


def _status(pid: int) -> float:
    """VmRSS of ``pid`` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


#: What the threads of an agent are, by who made them (see :func:`_threads`).
THREAD_KINDS = ("event loop", "Python threads", "grpc core")


def _threads(pid: int) -> dict[str, float]:
    """CPU seconds ``pid`` used so far, its live threads summed by kind: the main thread
    (the agent's event loop), the other threads Python made (grpc's server threads: the one
    polling a server's completion queue, the pool's), and the threads grpc's core made (named
    by it: its timer, event-engine and lifeguard threads).

    From each thread's schedstat (nanoseconds on a CPU), not /proc/PID/stat's utime and
    stime: those count clock ticks of 10 ms, so a 15 s window could not tell 0.04 CPU-s/min
    from 0.08 (one tick from two), which is the range the idle target sits in.
    """
    python = Path(f"/proc/{pid}/comm").read_text()  # Python leaves its threads this name
    totals = dict.fromkeys(THREAD_KINDS, 0.0)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
            comm = (task / "comm").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended between the listing and the read
        kind = "event loop" if task.name == str(pid) else "Python threads"
        totals[kind if comm == python else "grpc core"] += ns / 1e9
    return totals


def _cpu(pid: int) -> float:
    """CPU seconds ``pid`` used so far, every live thread summed (:func:`_threads`)."""
    return sum(_threads(pid).values())


class Child:
    """A benchmark process: ``python SCRIPT ARGS``, stderr to a log, stopped with SIGTERM."""

    def __init__(self, script: str, *args: str, log: Path) -> None:
        self.log = log
        self._err = log.open("w")
        self.start = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            env=cli_env(),
            text=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.log.name} exited:\n{self.log.read_text()[-3000:]}")

    def wait_ready(self) -> float:
        """Wait for ``ready`` on stdout; the ms since spawn."""
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            self.alive()
            raise RuntimeError(f"{self.log.name} did not start")
        return (time.perf_counter() - self.start) * 1e3

    def stop(self) -> None:
        terminate(self.process, 15)
        self._err.close()


async def _within(what: str, child: Child, wait: Awaitable[object], seconds: float) -> None:
    try:
        await asyncio.wait_for(wait, seconds)
    except TimeoutError:
        child.alive()
        raise RuntimeError(f"{what}: not within {seconds}s") from None


def _agent(tmp: Path, settings: Mapping[str, object], api: str, classes: int, per: int) -> Child:
    return Child(
        "_recorded.py",
        json.dumps(settings),
        api,
        str(classes),
        str(per),
        log=tmp / f"agent-{api}-{classes * per}.log",
    )


@dataclass
class _Served:
    """A device-plugin agent serving a fake kubelet: each plugin and the IDs it listed."""

    child: Child
    kubelet: FakeKubelet
    work: Path
    plugins: list[tuple[ConnectedPlugin, list[str]]]

    async def stop(self) -> None:
        self.child.stop()
        await self.kubelet.stop()
        shutil.rmtree(self.work, ignore_errors=True)


async def _device_plugins(tmp: Path, classes: int, per: int) -> _Served:
    """A device-plugin agent registered with a fake kubelet, every device listed."""
    from tests.fakes.kubelet import FakeKubelet

    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="cgf"))
    kubelet = FakeKubelet(work / "dp")
    await kubelet.start()
    settings = {
        "spec_dir": str(work / "cdi"),
        "device_plugin_dir": str(work / "dp"),
        "metrics_address": "127.0.0.1:0",
    }
    child = _agent(tmp, settings, "devicePlugin", classes, per)
    served = _Served(child, kubelet, work, [])

    async def listed() -> None:
        for _ in range(classes):
            plugin = await kubelet.next_registration(within=60)
            ids: list[str] = []
            while len(ids) < per:
                ids = sorted(await plugin.next_devices(within=60))
            served.plugins.append((plugin, ids))

    await _within("device plugins", child, listed(), 60)
    return served


async def _memory_device_plugins(tmp: Path, per: int = PER_CLASS) -> tuple[float, float]:
    """VmRSS serving, and again once each class answered one Allocate: the first Allocate
    reads the spec folders, which builds the spec models."""
    from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2

    served = await _device_plugins(tmp, CLASSES, per)
    try:
        await asyncio.sleep(1)  # settle: what it holds while serving, not while building
        serving = _status(served.child.pid)
        for plugin, ids in served.plugins:
            request = api_pb2.ContainerAllocateRequest(devices_ids=ids[:1])
            await plugin.stub.Allocate(api_pb2.AllocateRequest(container_requests=[request]))
        await asyncio.sleep(1)
        return serving, _status(served.child.pid)
    finally:
        await served.stop()


async def _memory_dra(tmp: Path) -> tuple[float, int]:
    import uuid

    from tests.fakes.apiserver import FakeApiServer
    from tests.fakes.drakubelet import FakeDraKubelet

    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="cgf"))
    node = "node-1"
    # HTTPS under a CA of its own, as in a pod: the client loads that one CA, not the
    # system's bundle (4 MiB) that a plain-HTTP kubeconfig would make it load.
    async with (
        FakeApiServer(tls=work / "pki") as api,
        FakeDraKubelet(work / "reg", poll_interval=0.2),
    ):
        api.nodes[node] = str(uuid.uuid4())
        settings = {
            "spec_dir": str(work / "cdi"),
            "device_plugin_dir": str(work / "dp"),
            "plugins_registry_dir": str(work / "reg"),
            "kubelet_plugins_dir": str(work / "plugins"),
            "state_dir": str(work / "state"),
            "kubeconfig": str(api.kubeconfig(work)),
            "node_name": node,
            "metrics_address": "127.0.0.1:0",
        }
        child = _agent(tmp, settings, "dra", CLASSES, PER_CLASS)

        def published() -> int:
            return sum(len(s["spec"].get("devices") or []) for s in api.slices.values())

        try:
            await _within(
                "DRA slices",
                child,
                api.until(lambda: published() >= CLASSES * PER_CLASS, within=60),
                61,
            )
            await asyncio.sleep(1)
            return _status(child.pid), len(api.slices)
        finally:
            child.stop()
            shutil.rmtree(work, ignore_errors=True)


async def _idle(tmp: Path, floor: Child, seconds: float) -> tuple[dict[str, float], float]:
    """CPU seconds per minute of an agent with one class of IDLE_DEVICES devices and a
    kubelet connected, by kind of thread (:func:`_threads`), and of ``floor`` over the same
    window."""
    served = await _device_plugins(tmp, 1, IDLE_DEVICES)
    child = served.child
    try:
        await asyncio.sleep(2)  # past start-up
        agent0, floor0 = _threads(child.pid), _cpu(floor.pid)
        await asyncio.sleep(seconds)
        agent1, floor1 = _threads(child.pid), _cpu(floor.pid)
        child.alive()
        scale = 60 / seconds
        by_kind = {kind: (agent1[kind] - agent0[kind]) * scale for kind in THREAD_KINDS}
        return by_kind, (floor1 - floor0) * scale
    finally:
        await served.stop()


def _cdi_gen() -> list[str]:
    """The installed ``cdi-gen`` script beside this interpreter, else ``python -m cdi_gen``."""
    script = Path(sys.executable).with_name("cdi-gen")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cdi_gen"]


def _cli(args: list[str], rounds: int) -> list[float]:
    """Wall ms of ``cdi-gen ARGS``, ``rounds`` times after one untimed run."""
    command = _cdi_gen()
    env = cli_env()
    samples = []
    for i in range(rounds + 1):
        start = time.perf_counter()
        subprocess.run([*command, *args], capture_output=True, env=env, check=False)
        if i:  # the first one writes the bytecode
            samples.append((time.perf_counter() - start) * 1e3)
    return samples


async def _startup(rounds: int) -> list[float]:
    from tests.fakes.kubelet import FakeKubelet

    samples = []
    for _ in range(rounds + 1):
        tmp = Path(tempfile.mkdtemp(dir="/tmp", prefix="cgb"))
        try:
            (tmp / "config.yaml").write_text(START_CONFIG)
            async with FakeKubelet(tmp / "dp") as kubelet:
                start = time.perf_counter()
                proc = await asyncio.create_subprocess_exec(
                    *_cdi_gen(),
                    "run",
                    "--config",
                    str(tmp / "config.yaml"),
                    "--spec-dir",
                    str(tmp / "cdi"),
                    "--device-plugin-dir",
                    str(tmp / "dp"),
                    "--udev-source",
                    "kernel",
                    "--metrics-address",
                    "",
                    stderr=asyncio.subprocess.DEVNULL,
                    env=cli_env(),
                )
                try:
                    await kubelet.next_registration(within=20)
                    samples.append((time.perf_counter() - start) * 1e3)
                finally:
                    proc.terminate()
                    await proc.wait()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return samples[1:]  # the first one may write bytecode


def _floors(tmp: Path, rounds: int) -> tuple[list[Child], list[float]]:
    """The floors, serving (their sockets in ``tmp``): device plugins, DRA, and each using
    what it loaded; the device-plugin floor's spawn → serving times (ms) over ``rounds``
    fresh starts."""
    starts = []
    for i in range(rounds):
        folder = tmp / f"start{i}"
        folder.mkdir()
        child = Child("_floor.py", str(folder), log=tmp / f"floor{i}.log")
        starts.append(child.wait_ready())
        child.stop()
    floors = []
    for name, args in (
        ("floor", ()),
        ("dra-floor", ("dra",)),
        ("used-floor", ("used",)),
        ("used-dra-floor", ("dra", "used")),
    ):
        (tmp / name).mkdir()
        if args == ("dra", "used"):
            from tests.pki import Authority

            Authority(tmp / name)  # its ca.crt, which the floor's client trusts
        child = Child("_floor.py", str(tmp / name), *args, log=tmp / f"{name}.log")
        child.wait_ready()
        floors.append(child)
    return floors, starts


def _ratio(value: float, floor: float) -> str:
    return f"{value / floor:.2f}x floor"


def measure(quick: bool) -> list[Row]:
    tmp = Path(tempfile.mkdtemp(dir="/tmp", prefix="cgfoot"))
    floors, floor_starts = _floors(tmp, 2 if quick else 5)
    floor = floors[0]
    try:
        time.sleep(1)
        floor_rss, dra_floor_rss, used_rss, used_dra_rss = (_status(f.pid) for f in floors)
        rss, allocated_rss = asyncio.run(_memory_device_plugins(tmp))
        # One device a class: what the agent costs whatever its devices.
        few_rss, _ = asyncio.run(_memory_device_plugins(tmp, 1))
        dra_rss, slices = asyncio.run(_memory_dra(tmp))
        idle_by_kind, floor_idle = asyncio.run(_idle(tmp, floor, 15 if quick else 60))
    finally:
        for child in floors:
            child.stop()
    rounds = 3 if quick else 10
    help_ms = _cli(["--help"], rounds)
    render_ms = _cli(["render", "--vendor", "example.com", "--class", "fpga"], rounds)
    register = asyncio.run(_startup(2 if quick else 5))
    shutil.rmtree(tmp, ignore_errors=True)
    devices = f"{CLASSES * PER_CLASS:,}"
    help50, render50 = percentile(help_ms, 50), percentile(render_ms, 50)
    start50, register50 = percentile(floor_starts, 50), percentile(register, 50)
    idle = sum(idle_by_kind.values())
    return [
        ("floor: RSS, imports + 5 grpc servers + metrics HTTP", f"{floor_rss:.1f} MiB", "floor"),
        (
            f"device-plugin agent RSS, {CLASSES} classes, {devices} devices",
            f"{rss:.1f} MiB ({_ratio(rss, floor_rss)})",
            f"<= {MEMORY_TARGET:g}x floor",
        ),
        (
            "  the same agent once each class answered one Allocate",
            f"{allocated_rss:.1f} MiB ({_ratio(allocated_rss, floor_rss)})",
            "informative",
        ),
        (
            f"  the same agent with {CLASSES} devices, one a class",
            f"{few_rss:.1f} MiB ({_ratio(few_rss, floor_rss)})",
            "informative",
        ),
        ("DRA floor: + API server client, DRA protos", f"{dra_floor_rss:.1f} MiB", "floor"),
        (
            f"DRA agent RSS, {devices} devices in {slices} slices",
            f"{dra_rss:.1f} MiB ({_ratio(dra_rss, dra_floor_rss)})",
            f"<= {MEMORY_TARGET:g}x floor",
        ),
        (
            "  floor + one pydantic model built: RSS / agent vs it",
            f"{used_rss:.1f} MiB / {rss / used_rss:.2f}x",
            "informative",
        ),
        (
            "  DRA floor + a model + an API client made: RSS / DRA agent vs it",
            f"{used_dra_rss:.1f} MiB / {dra_rss / used_dra_rss:.2f}x",
            "informative",
        ),
        ("floor: cdi-gen --help, p50", f"{help50:.0f} ms", "floor"),
        (
            "cdi-gen render --vendor example.com --class fpga, p50",
            f"{render50:.0f} ms ({_ratio(render50, help50)})",
            f"<= {RENDER_TARGET_MS} ms",
        ),
        ("floor: spawn -> serving, p50", f"{start50:.0f} ms", "floor"),
        (
            "cdi-gen run: spawn -> first Register, p50 / max",
            f"{register50:.0f} / {max(register):.0f} ms ({_ratio(register50, start50)})",
            f"<= {REGISTER_TARGET_MS} ms",
        ),
        ("floor: idle CPU", f"{floor_idle:.3f} CPU-s/min", "floor"),
        (
            f"idle CPU, {IDLE_DEVICES} devices, kubelet connected",
            f"{idle:.3f} CPU-s/min",
            f"<= {IDLE_TARGET:g} CPU-s/min",
        ),
        (
            f"  by thread: {' / '.join(THREAD_KINDS)}",
            " / ".join(f"{idle_by_kind[kind]:.3f}" for kind in THREAD_KINDS),
            "informative",
        ),
    ]


def run(quick: bool = False) -> list[Row]:
    return measure(quick)


if __name__ == "__main__":
    from _table import print_table

    print_table("footprint", run("--quick" in sys.argv))
