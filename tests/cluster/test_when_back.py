"""Devices that come back (``whenBack``) on a real node: a pod's container reads a loop device
at ``/dev/held`` every 0.1 s and logs each read; the loop device is re-plugged (its backing file
detached, then attached to another loop number: a new minor, the old device still there, so
the kernel cannot hand the old numbers out again); then

- ``follow``: the same container, not restarted, reads at the same path again;
- ``restart``: the container is restarted (its restart count goes up) and reads again;
- ``keep``: the container keeps failing (today's behaviour, so that the others can fail).

Each lane (containerd 2.3, containerd 1.7, CRI-O) follows through the device plugin and through
DRA, and restarts once; ``keep`` runs once, and so does a ``follow`` class without
``node.path``, whose device comes back at another path (``/dev/loopN``) and is restarted.
The agent runs on the host as root, given the lane's kubelet pod-resources socket and CRI
socket. ``follow``'s time to readable (re-attach → the first good read the container logs,
by the runtime's log timestamps) and ``restart``'s time to a running container (re-attach →
the new container's first good read) are printed and recorded as test properties
(docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import datetime
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from loopdev import LoopDevice, LoopDevices

from cdi_gen.devcgroup.cgroupv2 import ProgramCgroup
from tests.waiting import until_sync

from .agent import VENDOR, NodeAgent
from .claims import Claims, claim_consumer, generated_device_classes
from .cluster import Cluster
from .conftest import AgentFactory, DraAgentFactory, wait_capacity
from .lane import Lane
from .pods import NAMESPACE, Pods, consumer

CLASS = "held"
RESOURCE = f"{VENDOR}/{CLASS}"
PATH = "/dev/held"
#: The backing file's first bytes, which a good read returns.
MARK = "cdi-gen-when-back-ok"
#: Each read of the device at ``{path}`` logged as ``READ ok`` or ``READ fail``, every 0.1 s.
_SCRIPT = """\
trap 'exit 0' TERM
while true; do
  if [ "$(head -c {size} {path} 2>/dev/null)" = "{mark}" ]; then
    echo "READ ok"
  else
    echo "READ fail"
  fi
  sleep 0.1 & wait
done
"""
#: Where a class without ``node.path`` puts the device: the host's path, ``/dev/loopN``
#: (the container has no other loop device).
HOST_PATH = "/dev/loop[0-9]*"


def config(backing: Path, when_back: str, path: str | None = PATH) -> str:
    """One class of the loop devices backed by files of ``backing``'s folder, named after
    the file (the same name whatever loop number it is attached to), at ``path`` (None: at
    the host's path, which names the loop number)."""
    cls = {
        "name": CLASS,
        "match": {
            "subsystem": "block",
            "kernel": "loop*",
            "attributes": {"loop/backing_file": f"{backing.parent}/*"},
        },
        "deviceName": "{attribute[loop/backing_file]|basename|name}",
        "node": {"fileMode": "0660"} | ({} if path is None else {"path": path}),
        "whenBack": when_back,
    }
    return json.dumps({"vendor": VENDOR, "classes": [cls]}, indent=2) + "\n"


def reader(pod: dict[str, Any], path: str = PATH) -> dict[str, Any]:
    """The consumer ``pod`` made a reader of ``path``, restarted whenever it stops."""
    pod["spec"]["restartPolicy"] = "Always"
    (container,) = pod["spec"]["containers"]
    script = _SCRIPT.format(size=len(MARK), path=path, mark=MARK)
    container["command"] = ["sh", "-c", script]
    return pod


@dataclass(frozen=True)
class Read:
    at: float  # the runtime's timestamp of the log line, seconds since the epoch
    ok: bool


def reads(pods: Pods, name: str) -> list[Read]:
    """The reads the pod's current container logged, with the runtime's timestamps."""
    text = pods.api.text(f"{pods.path(name)}/log?container=app&timestamps=true")
    out = []
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        if rest.startswith("READ "):
            out.append(Read(_epoch(stamp), rest == "READ ok"))
    return out


def _epoch(stamp: str) -> float:
    # RFC 3339 with nanoseconds; Python takes microseconds.
    head, _, frac = stamp.rstrip("Z").partition(".")
    when = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.UTC)
    return when.timestamp() + float(f"0.{frac or '0'}")


def wait_reads(
    pods: Pods, name: str, ok: bool, after: float, *, count: int = 3, timeout: float = 30
) -> list[Read]:
    """Wait until the container has logged ``count`` reads in a row with outcome ``ok``,
    all after ``after``; the reads after ``after``."""

    def seen() -> list[Read]:
        return [r for r in reads(pods, name) if r.at > after]

    def done() -> list[Read] | None:
        now = seen()
        tail = now[-count:]
        return now if len(tail) == count and all(r.ok == ok for r in tail) else None

    return until_sync(
        done,
        f"pod {name}: {count} reads in a row {'ok' if ok else 'failing'}",
        timeout,
        every=0.1,
        observe=lambda: ["ok" if r.ok else "fail" for r in seen()[-10:]],
    )


def readable_again(pods: Pods, name: str, attached: float) -> float:
    """When the container read the device again after a re-plug: its first good read logged
    after the attach (to within the reads' 0.1 s pace; the detach, a new loop device and the
    attach take a few milliseconds, so no read begun before the detach lands after it).
    Waits for three good reads in a row first."""
    seen = wait_reads(pods, name, ok=True, after=attached)
    return next(r.at for r in seen if r.ok)


DEVICES = Path("/sys/fs/cgroup/devices")
UNIFIED = Path("/sys/fs/cgroup/unified")


def cgroup_folders(container_id: str) -> dict[Path, Path]:
    """The container's folder in the host's v1 devices hierarchy and in its v2 hierarchy
    (where the runtime made one), found by the container's ID in the folder's name (both
    runtimes name a container's cgroup after its ID, with cgroupfs or systemd)."""
    short = container_id.partition("://")[2]
    found = {}
    for root in (DEVICES, UNIFIED):
        hits = [p for p in root.glob(f"**/*{short}*") if p.is_dir()]
        if hits:
            found[root] = min(hits, key=lambda p: len(p.parts))
    assert DEVICES in found, f"container {short}: no folder under {DEVICES}"
    return found


@dataclass
class Plug:
    """The held device: a loop device over a small file of this test's folder."""

    loops: LoopDevices
    backing: Path
    device: LoopDevice
    #: The numbers before and after the last re-plug.
    numbers: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))

    def replug(self) -> float:
        """Detach the file and attach it to another loop number (the old device stays, so
        the new one has another minor); the wall-clock time of the attach."""
        old = self.device
        self.loops.detach(old)
        new = self.loops.add()
        self.loops.attach(new, self.backing)
        attached = time.time()
        assert new.number != old.number
        self.numbers = (old.rdev(), new.rdev())
        self.device = new
        return attached


@pytest.fixture
def plug(loops: LoopDevices) -> Iterator[Plug]:
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="cgwb"))
    backing = folder / f"wb-{uuid.uuid4().hex[:10]}.img"
    backing.write_bytes(MARK.encode() + b"\n" * 4076)
    device = loops.add()
    loops.attach(device, backing)
    try:
        yield Plug(loops, backing, device)
    finally:
        loops.cleanup()
        shutil.rmtree(folder)


def when_back_args(cluster: Cluster) -> tuple[str, ...]:
    """The lane's kubelet pod-resources socket and CRI socket, as seen from the host."""
    assert cluster.runtime is not None
    return (
        "--pod-resources-socket", str(cluster.kubelet_dir / "pod-resources" / "kubelet.sock"),
        "--cri-socket", str(cluster.runtime.socket),
    )  # fmt: skip


@dataclass
class Scenario:
    cluster: Cluster
    plug: Plug
    pods: Pods
    node_agent: AgentFactory
    dra_agent: DraAgentFactory
    claims: Claims
    tmp_path: Path

    def serve(self, when_back: str, api: str, path: str | None = PATH) -> tuple[NodeAgent, str]:
        """The agent serving the class through ``api``, and a reader pod holding the device
        at ``path`` (None: at the host's) and reading it."""
        text = config(self.plug.backing, when_back, path)
        read = HOST_PATH if path is None else path
        args = when_back_args(self.cluster)
        name = f"reader-{api.lower()}"
        if api == "devicePlugin":
            agent = self.node_agent(text, args)
            wait_capacity(self.cluster, RESOURCE, 1)
            self.pods.add(reader(consumer(name, {RESOURCE: 1}), read))
        else:
            agent = self.dra_agent(text, args=args)
            path = self.tmp_path / "dra-classes.yaml"
            path.write_text(text)
            (device_class,) = generated_device_classes(path)
            self.claims.ensure_device_class(device_class)
            self.claims.wait_devices(VENDOR, bool, "the held device published")
            self.claims.template("held", device_class["metadata"]["name"])
            self.pods.add(reader(claim_consumer(name, template="held"), read))
        self.pods.wait_running(name)
        wait_reads(self.pods, name, ok=True, after=0)
        return agent, name


@pytest.fixture
def scenario(
    *,
    cluster: Cluster,
    plug: Plug,
    pods: Pods,
    node_agent: AgentFactory,
    dra_agent: DraAgentFactory,
    claims: Claims,
    tmp_path: Path,
) -> Scenario:
    return Scenario(cluster, plug, pods, node_agent, dra_agent, claims, tmp_path)


def _lines(agent: NodeAgent, *words: str) -> list[str]:
    return [line for line in agent.log().splitlines() if all(w in line for w in words)]


def _record(record_property: object, name: str, value: float) -> None:
    if callable(record_property):
        record_property(name, round(value, 3))


@pytest.mark.lanes("current", "oldest", "crio")
@pytest.mark.parametrize("api", ["devicePlugin", "dra"])
def test_follow_reads_again_in_the_same_container(
    scenario: Scenario, lane: Lane, api: str, record_property: object
) -> None:
    """Three re-plugs in a row: the runtime's spec still names the numbers the container was
    created with, the container those it was last given."""
    agent, pod = scenario.serve("follow", api)
    before = scenario.pods.restarts(pod)
    seconds = []
    for n in range(1, REPLUGS + 1):
        attached = scenario.plug.replug()
        seconds.append(readable_again(scenario.pods, pod, attached) - attached)
        lines = until_lines(agent, n, "came back", f"{NAMESPACE}/{pod}/app")
        assert ": done" in lines[-1], agent.log()[-3000:]
        assert_followed(before[1], *scenario.plug.numbers)
    print(lines[-1])
    figures = ", ".join(f"{x:.3f}" for x in seconds)
    print(f"{lane.name} {api}: re-attach -> readable in the container: {figures} s")
    _record(record_property, "follow_readable_seconds_max", max(seconds))
    assert scenario.pods.restarts(pod) == before, "follow restarted the container"
    folders = cgroup_folders(before[1])
    programs = {}
    if UNIFIED in folders:
        with ProgramCgroup(str(folders[UNIFIED])) as cgroup:
            programs = {"v2 device programs": len(cgroup.attached())}
    print(f"{lane.name} {api}: the container's cgroups: {folders} {programs}")


#: Re-plugs per follow test.
REPLUGS = 3


def until_lines(agent: NodeAgent, count: int, *words: str) -> list[str]:
    """The agent's log lines with ``words``, once there are ``count`` of them."""
    return until_sync(
        lambda: (found := _lines(agent, *words))[count - 1 :] and found,
        f"{count} agent lines with {words}",
        observe=lambda: _lines(agent, *words),
    )


def assert_followed(container_id: str, old: tuple[int, int], new: tuple[int, int]) -> None:
    """The container's v1 devices cgroup allows the new numbers and no longer the old."""
    listed = (cgroup_folders(container_id)[DEVICES] / "devices.list").read_text().split("\n")
    assert not [x for x in listed if x.startswith(f"b {old[0]}:{old[1]} ")], listed
    assert [x for x in listed if x.startswith(f"b {new[0]}:{new[1]} ")], listed


#: The way of serving that restarts on each lane (the other follows there).
RESTART_API = {"current": "devicePlugin", "oldest": "dra", "crio": "dra"}


@pytest.mark.lanes("current", "oldest", "crio")
def test_restart_gives_a_new_container_that_reads(
    scenario: Scenario, lane: Lane, record_property: object
) -> None:
    api = RESTART_API[lane.name]
    agent, pod = scenario.serve("restart", api)
    count, first = scenario.pods.restarts(pod)
    attached = scenario.plug.replug()
    scenario.pods.api.wait_for(
        scenario.pods.path(pod),
        lambda p: _restart_count(p) > count and _running(p),
        60,
        f"pod {pod} restarted and running",
    )
    seen = wait_reads(scenario.pods, pod, ok=True, after=attached)
    first_ok = next(r.at for r in seen if r.ok)
    print(
        f"{lane.name} {api}: re-attach -> restarted container reading: {first_ok - attached:.3f} s"
    )
    _record(record_property, "restart_readable_seconds", first_ok - attached)
    assert scenario.pods.restarts(pod)[1] != first
    line = next(iter(_lines(agent, "came back", f"{NAMESPACE}/{pod}/app")), "")
    print(line)
    assert ": restarted" in line, agent.log()[-3000:]


def _restart_count(pod: dict[str, Any] | None) -> int:
    statuses = (pod or {}).get("status", {}).get("containerStatuses", [{}])
    return int(statuses[0].get("restartCount", 0))


def _running(pod: dict[str, Any] | None) -> bool:
    statuses = (pod or {}).get("status", {}).get("containerStatuses", [{}])
    return "running" in statuses[0].get("state", {})


def test_keep_leaves_the_container_failing(scenario: Scenario) -> None:
    agent, pod = scenario.serve("keep", "devicePlugin")
    attached = scenario.plug.replug()
    # Failing reads for 3 s after the spec names the new device: nothing gives it back.
    wait_reads(scenario.pods, pod, ok=False, after=attached, count=30)
    assert scenario.pods.restarts(pod)[0] == 0
    assert not _lines(agent, "came back", f"{NAMESPACE}/{pod}/app")


def test_follow_of_a_device_back_at_another_path_restarts(scenario: Scenario) -> None:
    """A class without node.path puts the device at the host's path, /dev/loopN: it comes
    back at another path, which follow cannot give in place, so its holder is restarted, and
    the new container reads the device at its new path."""
    agent, pod = scenario.serve("follow", "devicePlugin", path=None)
    count, _ = scenario.pods.restarts(pod)
    attached = scenario.plug.replug()
    scenario.pods.api.wait_for(
        scenario.pods.path(pod),
        lambda p: _restart_count(p) > count and _running(p),
        60,
        f"pod {pod} restarted and running",
    )
    wait_reads(scenario.pods, pod, ok=True, after=attached)
    [line] = _lines(agent, "came back", f"{NAMESPACE}/{pod}/app")
    print(line)
    assert ": restarted: whenBack follow runs as restart: /dev/loop" in line, line
