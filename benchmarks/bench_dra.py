"""The DRA driver on a real single-node cluster (tests/cluster): what the API server sees.

- kernel add → ResourceSlice lists the device: LOOP_CTL_ADD of a loop device the running
  ``cdi-gen run --api dra`` serves, until the node's slice of the driver lists it; kernel
  remove (LOOP_CTL_REMOVE) → the device gone from it. Seen through one watch of the node's
  ResourceSlices (not polled): each event is stamped when it arrives, so the figure has no
  polling step in it. The device's own uevents are stamped too (a netlink listener beside
  the agent's), which splits each figure into the kernel's part and the agent's: the
  LOOP_CTL_REMOVE ioctl announces the removal some 30 ms after it starts. The floor,
  measured in alternation in the same run: the API server's own round trip for the same
  change, a ResourceSlice of another driver replaced directly (one PUT over a kept-alive
  connection, generation bumped, holding a copy of the agent's device) and seen back through
  the same watch. The ratio is what cdi-gen adds: the uevent, the spec write, the pool, the
  slice build and its client.
- resident memory with 1,000 devices published: the agent on 1,000 recorded devices in 5
  classes (``_recorded.py``, udev replaced by the records, all else real) in DRA mode against
  the API server, its VmRSS/VmHWM read from /proc one second after the last of the 1,000
  devices appeared in the node's slices (counted through the watch). The floor is the same
  devices through device plugins registered with the same kubelet, read one second after the
  Node's allocatable adds up to 1,000 (polled every 10 ms: it comes with the kubelet's status
  tick, so that start-up time is bounded by the tick).

Loop numbers 500-599, so the cluster tests (400-499) and other suites never meet these.

    python benchmarks/bench_dra.py [--quick]
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _cluster import LOOP_HIGH, LOOP_LOW, bench_cluster, missing, wait_allocatable  # noqa: E402
from _recorded import CLASSES, PER_CLASS, config_data  # noqa: E402
from _table import Row, cli_env, percentile, print_table  # noqa: E402
from cluster.agent import VENDOR, NodeAgent, class_config, dra_args  # noqa: E402
from cluster.api import Api, ApiError, Obj  # noqa: E402
from cluster.claims import SLICES, slice_devices  # noqa: E402
from cluster.cluster import NODE_STATUS_SECONDS, Cluster  # noqa: E402
from loopdev import LoopDevices  # noqa: E402
from processes import terminate  # noqa: E402

#: One driver name per figure, so that slices a stopped agent leaves behind (the kubelet
#: removes them only later) never count in the next figure.
HOTPLUG_DRIVER = f"hotplug.{VENDOR}"
FLOOR_DRIVER = f"floor.{VENDOR}"
MEMORY_DRIVER = f"memory.{VENDOR}"
#: Longest one watched change may take before the run fails (seconds).
CHANGE_TIMEOUT = 30.0
#: linux/netlink.h: the kernel's uevent broadcast.
NETLINK_KOBJECT_UEVENT = 15


@dataclass(frozen=True)
class Seen:
    """The state of one driver's slices right after a watch event."""

    stamp: float  # time.monotonic() when the event arrived
    driver: str
    devices: frozenset[str]  # names in the pool's newest generation
    slices: int  # slices of that generation


class SliceWatch:
    """One watch of the node's ResourceSlices, read by a thread that stamps every event.

    Waiters look through the history from a mark taken before their action, so an event that
    arrives before they start waiting is not missed. A watch the API server ends is resumed
    from the last resourceVersion (no replay of existing slices).
    """

    def __init__(self, api: Api, node: str) -> None:
        self._api = api
        self._selector = f"spec.nodeName={node}"
        self._slices: dict[str, Obj] = {}
        self._history: list[Seen] = []
        self._cond = threading.Condition()
        self._error: str | None = None
        self._stopped = False
        self._version = ""
        self._thread = threading.Thread(target=self._run, name="slice watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        # The thread ends when the API server closes the connection (the cluster stops).
        self._stopped = True

    def _run(self) -> None:
        while not self._stopped:
            params = {"fieldSelector": self._selector}
            if self._version:
                params["resourceVersion"] = self._version
            try:
                for event in self._api.watch(SLICES, 3600, **params):
                    self._event(event, time.monotonic())
            except (OSError, ValueError, ApiError) as exc:
                if not self._stopped:
                    self._fail(f"slice watch failed: {exc}")
                return

    def _event(self, event: Obj, stamp: float) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            self._fail(f"slice watch error: {json.dumps(obj)[:300]}")
            return
        if kind == "BOOKMARK":
            return
        meta = obj.get("metadata") or {}
        self._version = meta.get("resourceVersion", self._version)
        with self._cond:
            if kind == "DELETED":
                self._slices.pop(meta["name"], None)
            else:
                self._slices[meta["name"]] = obj
            driver = obj["spec"]["driver"]
            mine = [s for s in self._slices.values() if s["spec"]["driver"] == driver]
            newest = max((s["spec"]["pool"]["generation"] for s in mine), default=0)
            self._history.append(
                Seen(
                    stamp,
                    driver,
                    frozenset(slice_devices(mine)),
                    sum(s["spec"]["pool"]["generation"] == newest for s in mine),
                )
            )
            self._cond.notify_all()

    def _fail(self, message: str) -> None:
        with self._cond:
            self._error = message
            self._cond.notify_all()

    def mark(self) -> int:
        """A point in the history: :meth:`wait` looks only at events after it."""
        with self._cond:
            return len(self._history)

    def devices(self, driver: str) -> dict[str, Obj]:
        """``driver``'s devices in its newest generation, as the API server has them."""
        with self._cond:
            return slice_devices(s for s in self._slices.values() if s["spec"]["driver"] == driver)

    def wait(
        self,
        driver: str,
        predicate: Callable[[frozenset[str]], bool],
        mark: int,
        what: str,
        *,
        alive: Callable[[], str | None] = lambda: None,
        timeout: float = CHANGE_TIMEOUT,
    ) -> Seen:
        """The first event after ``mark`` after which ``driver``'s device names satisfy
        ``predicate``; fail after ``timeout`` or when ``alive()`` says what died."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for seen in self._history[mark:]:
                    if seen.driver == driver and predicate(seen.devices):
                        return seen
                mark = len(self._history)
                if self._error is not None:
                    raise RuntimeError(f"{what}: {self._error}")
                dead = alive()
                if dead is not None:
                    raise RuntimeError(f"{what}: {dead}")
                left = deadline - time.monotonic()
                if left <= 0:
                    last = next(
                        (s.devices for s in reversed(self._history) if s.driver == driver), None
                    )
                    raise TimeoutError(
                        f"{what}: not within {timeout:.0f} s; {driver} last published "
                        f"{sorted(last)[:10] if last is not None else 'nothing'}"
                    )
                self._cond.wait(min(left, 0.5))


class Uevents:
    """The kernel's uevents of one block device, stamped on arrival by a thread reading the
    uevent netlink group: where the kernel's part of a hotplug ends and the agent's begins
    (the agent reads the same group, so the stamps are taken as early as it can see them)."""

    def __init__(self, name: str) -> None:
        self._name = name.encode()
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._sock.bind((0, 1))  # group 1: the kernel's own messages
        self._sock.settimeout(0.2)
        self._seen: list[tuple[str, float]] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="uevents", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            stamp = time.monotonic()
            # "ACTION@DEVPATH\0KEY=VALUE\0...": the block device's own event, not its queue's
            # or its bdi's.
            action, _, devpath = data.split(b"\0", 1)[0].partition(b"@")
            if devpath.endswith(b"/block/" + self._name):
                with self._cond:
                    self._seen.append((action.decode(), stamp))
                    self._cond.notify_all()

    def first(self, action: str, after: float, timeout: float = 5.0) -> float:
        """The stamp of the first ``action`` uevent that arrived after ``after``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for seen, stamp in self._seen:
                    if seen == action and stamp > after:
                        return stamp
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {action} uevent of {self._name.decode()}")
                self._cond.wait(left)

    def close(self) -> None:
        self._stopped = True
        self._thread.join(2)
        self._sock.close()


class FloorSlice:
    """A ResourceSlice of another driver on the same node, replaced directly: the API
    server's own round trip for the change the agent makes.

    Over one kept-alive HTTPS connection, as the agent's client keeps its own: a TLS
    handshake per write would be a cost of the floor's client, not of the API server.
    """

    def __init__(self, cluster: Cluster) -> None:
        assert cluster.api is not None
        context = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
        context.load_cert_chain(str(cluster.pki / "admin.crt"), str(cluster.pki / "admin.key"))
        self._conn = http.client.HTTPSConnection(
            cluster.api.host, cluster.api.port, context=context, timeout=30
        )
        node = cluster.node_name
        self._generation = 1
        self._body = self._call(
            "POST",
            SLICES,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-floor"},
                "spec": {
                    "driver": FLOOR_DRIVER,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [],
                },
            },
        )

    def _call(self, method: str, path: str, body: Obj | None = None) -> Obj:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        self._conn.request(method, path, body=data, headers=headers)
        response = self._conn.getresponse()
        answer = response.read()
        if response.status >= 300:
            raise ApiError(method, path, response.status, answer.decode(errors="replace"))
        result: Obj = json.loads(answer)
        return result

    def replace(self, devices: list[Obj]) -> None:
        """One PUT, as the agent's publisher writes a changed slice (generation bumped)."""
        self._generation += 1
        body = json.loads(json.dumps(self._body))
        body["spec"]["pool"]["generation"] = self._generation
        body["spec"]["devices"] = devices
        self._body = self._call("PUT", f"{SLICES}/{body['metadata']['name']}", body)

    def delete(self) -> None:
        self._call("DELETE", f"{SLICES}/{self._body['metadata']['name']}")
        self._conn.close()


#: Targets, as ratios to the floors measured in the same run. From a device's uevent to the
#: API: the agent writes the spec (fsyncs) and then one slice write, one API round trip.
SLICE_TARGET = 4.0
#: DRA loads the API client and the DRA protos on top of what device plugins need.
MEMORY_TARGET = 1.5


def _alive(agent: NodeAgent) -> Callable[[], str | None]:
    def check() -> str | None:
        if agent.running():
            return None
        return f"the agent exited; its log ends:\n{agent.log()[-3000:]}"

    return check


def _p50_p99(samples: list[float]) -> str:
    return f"{statistics.median(samples):.1f} / {percentile(samples, 99):.1f} ms"


def _change(
    watch: SliceWatch,
    driver: str,
    act: Callable[[], object],
    present: bool,
    what: str,
    *,
    alive: Callable[[], str | None] = lambda: None,
) -> tuple[float, float, Seen]:
    """Do ``act``, then wait until ``driver`` publishes one device (``present``) or none:
    (when ``act`` started, when it returned, the event that showed the change)."""
    mark = watch.mark()
    start = time.monotonic()
    act()
    returned = time.monotonic()
    seen = watch.wait(
        driver, (lambda d: len(d) == 1) if present else (lambda d: not d), mark, what, alive=alive
    )
    return start, returned, seen


def _hotplug(cluster: Cluster, watch: SliceWatch, cycles: int) -> list[Row]:
    assert cluster.api is not None
    work = cluster.work
    loops = LoopDevices(LOOP_LOW, LOOP_HIGH)
    # One reserved number reused per cycle: the slice holds exactly one device or none.
    number = loops.reserve().number
    config = work / "bench-dra.yaml"
    config.write_text(class_config("fpga", [f"loop{number}"]))
    agent = NodeAgent(
        cluster,
        config,
        work / "bench-dra.log",
        extra_args=dra_args(cluster, work / "bench-dra-state", HOTPLUG_DRIVER),
    )
    alive = _alive(agent)
    floor = FloorSlice(cluster)
    ms: dict[str, list[float]] = {
        k: [] for k in ("add", "add uevent", "remove", "remove uevent", "ioctl", "floor")
    }
    uevents = Uevents(f"loop{number}")
    agent.start()
    try:
        # The first cycle warms up (the agent's first writes, the API server's caches) and
        # gives the device the floor slice carries: the same bytes through the same path.
        for cycle in range(cycles + 1):
            start, _, seen = _change(
                watch, HOTPLUG_DRIVER, partial(loops.add, number), True, "device in", alive=alive
            )
            if not cycle:
                device = next(iter(watch.devices(HOTPLUG_DRIVER).values()))
            else:
                ms["add"].append(1e3 * (seen.stamp - start))
                ms["add uevent"].append(1e3 * (seen.stamp - uevents.first("add", start)))
            start, returned, seen = _change(
                watch,
                HOTPLUG_DRIVER,
                partial(loops.remove, number),
                False,
                "device out",
                alive=alive,
            )
            if cycle:
                ms["remove"].append(1e3 * (seen.stamp - start))
                ms["remove uevent"].append(1e3 * (seen.stamp - uevents.first("remove", start)))
                ms["ioctl"].append(1e3 * (returned - start))
            for devices in ([device], []):
                start, _, seen = _change(
                    watch, FLOOR_DRIVER, partial(floor.replace, devices), bool(devices), "floor"
                )
                if cycle:
                    ms["floor"].append(1e3 * (seen.stamp - start))
    finally:
        uevents.close()
        loops.cleanup()
        agent.stop()
        with contextlib.suppress(ApiError, OSError, http.client.HTTPException):
            floor.delete()
    floor_p50 = statistics.median(ms["floor"])

    def ratio(samples: list[float]) -> str:
        return f"{_p50_p99(samples)} (p50 {statistics.median(samples) / floor_p50:.1f}x floor)"

    return [
        (f"floor: ResourceSlice replaced → watch event, p50 / p99 of {2 * cycles}",
         _p50_p99(ms["floor"]), "floor (API server round trip)"),
        (f"kernel add → ResourceSlice lists it, p50 / p99 of {cycles}", ratio(ms["add"]),
         "info (includes the kernel)"),
        ("  of which: its uevent → ResourceSlice lists it", ratio(ms["add uevent"]),
         f"p50 <= {SLICE_TARGET:g}x floor"),
        (f"kernel remove → gone from the slice, p50 / p99 of {cycles}", ratio(ms["remove"]),
         "info (includes the kernel)"),
        ("  of which: its uevent → gone from the slice", ratio(ms["remove uevent"]),
         f"p50 <= {SLICE_TARGET:g}x floor"),
        ("  LOOP_CTL_REMOVE ioctl returning, p50 (it ends after the uevent)",
         f"{statistics.median(ms['ioctl']):.1f} ms", "kernel"),
    ]  # fmt: skip


def _status(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of process ``pid`` in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


@dataclass
class Footprint:
    rss: float
    hwm: float
    seconds: float  # spawn → all devices published
    slices: int = 0


def _recorded_agent(
    cluster: Cluster, watch: SliceWatch, api: str, settle: float = 1.0
) -> Footprint:
    """Spawn the agent on the 1,000 recorded devices with every class through ``api``, wait
    until they are all published, read its memory ``settle`` seconds later, stop it."""
    work = cluster.work / f"memory-{api}"
    settings: dict[str, Any] = {
        "spec_dir": str(work / "cdi"),
        "device_plugin_dir": str(cluster.device_plugin_dir),
        "metrics_address": "",
        "log_level": "warning",
    }
    if api == "dra":
        settings |= {
            "dra_driver": MEMORY_DRIVER,
            "plugins_registry_dir": str(cluster.plugins_registry_dir),
            "kubelet_plugins_dir": str(cluster.kubelet_plugins_dir),
            "state_dir": str(work / "state"),
            "kubeconfig": str(cluster.admin_kubeconfig),
            "node_name": cluster.node_name,
        }
    work.mkdir(parents=True)
    total = CLASSES * PER_CLASS
    log_path = work / "agent.log"
    mark = watch.mark()
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "_recorded.py"), json.dumps(settings), api],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=cli_env(),
        )

    def alive() -> str | None:
        if proc.poll() is None:
            return None
        return f"the agent exited {proc.returncode}: {log_path.read_text()[-3000:]}"

    try:
        slices = 0
        if api == "dra":
            seen = watch.wait(
                MEMORY_DRIVER,
                lambda d: len(d) == total,
                mark,
                f"{total} devices",
                alive=alive,
                timeout=120,
            )
            seconds, slices = seen.stamp - start, seen.slices
        else:
            resources = [f"{VENDOR}/{c['name']}" for c in config_data()["classes"]]
            wait_allocatable(cluster, resources, total, 120)
            seconds = time.monotonic() - start
        time.sleep(settle)
        dead = alive()
        if dead is not None:
            raise RuntimeError(dead)
        rss, hwm = _status(proc.pid)
    finally:
        terminate(proc, 15)
    return Footprint(rss, hwm, seconds, slices)


def _memory(cluster: Cluster, watch: SliceWatch) -> list[Row]:
    total = CLASSES * PER_CLASS
    dra = _recorded_agent(cluster, watch, "dra")
    plugins = _recorded_agent(cluster, watch, "devicePlugin")
    return [
        (f"resident memory, device plugins, {total:,} devices (floor)",
         f"{plugins.rss:.1f} MiB (peak {plugins.hwm:.1f})", "floor"),
        (f"resident memory, DRA, {total:,} devices in {dra.slices} slices",
         f"{dra.rss:.1f} MiB (peak {dra.hwm:.1f}, {dra.rss / plugins.rss:.2f}x floor)",
         f"<= {MEMORY_TARGET:g}x floor"),
        (f"  start → {total:,} devices in the node's ResourceSlices (watch)",
         f"{dra.seconds:.2f} s", "—"),
        (f"  start → Node allocatable {total:,} (device plugins, polled)",
         f"{plugins.seconds:.2f} s", f"kubelet status tick {NODE_STATUS_SECONDS} s"),
    ]  # fmt: skip


def run(quick: bool = False) -> list[Row]:
    """Measure; return rows of (metric, measured value, target)."""
    why = missing()
    if why is not None:
        return [("dra", why, "—")]
    with bench_cluster() as cluster:
        assert cluster.api is not None
        watch = SliceWatch(cluster.api, cluster.node_name)
        try:
            rows = _hotplug(cluster, watch, 5 if quick else 30)
            rows += _memory(cluster, watch)
        finally:
            watch.stop()
    return rows


if __name__ == "__main__":
    print_table("dra", run("--quick" in sys.argv))
