"""``whenBack`` in the running agent, with the real kernel: a loop device a "container" reads
(a real process in its own mount namespace and cgroups, tests/heldcontainer.py) is re-plugged
(its backing file detached, then attached to another loop number: a new minor), and the agent
finds the holder through a fake kubelet pod-resources socket and a fake CRI socket (real gRPC
servers on unix sockets) and follows, restarts or keeps.

The device-plugin class runs in the real agent on kernel uevents; the DRA class in a
:class:`~cdi_gen.agent.runner.ClassRunner` fed by the real discovery of the class from this
machine's devices (a DRA driver needs an API server, and what is tested here is not it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from cdi_gen.agent.agent import Agent
from cdi_gen.agent.comebacks import Comeback, Comebacks
from cdi_gen.agent.holders import DeviceKeys, wall_start
from cdi_gen.agent.privileges import Privileges
from cdi_gen.agent.runner import ClassRunner
from cdi_gen.agent.whenback import BackPolicy, class_policy
from cdi_gen.config.edits import NodeOptions
from cdi_gen.config.loader import parse_config
from cdi_gen.containernode.linux import process_start
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.dra.driver.poolentries import device_name
from cdi_gen.metrics import Metrics
from cdi_gen.model import AdvertisedDevice, ClassChange, DiscoveredDevice, NodeInfo
from cdi_gen.retry import Tools
from cdi_gen.sources.udev import enumerate_records
from tests.agentrun import running_agent
from tests.fakes.cri import FakeCri, containerd_info, runtime_spec, silent_socket
from tests.fakes.kubelet import FakeKubelet
from tests.fakes.podresources import FakePodResources, claim, container, plugin_devices, pod
from tests.heldcontainer import CONTENT, PATH, Container
from tests.loopdev import LoopDevice, LoopDevices
from tests.waiting import until

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(90)]

VENDOR = "example.com"
READ = CONTENT[:20].decode()


@pytest.fixture
def backing() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="cg"))
    disk = folder / f"wb-{uuid.uuid4().hex[:10]}.img"
    disk.write_bytes(CONTENT)
    try:
        yield disk
    finally:
        shutil.rmtree(folder)


@pytest.fixture
def attached(loops: LoopDevices, backing: Path) -> LoopDevice:
    device = loops.add()
    loops.attach(device, backing)
    return device


def class_config(
    backing: Path,
    when_back: str,
    api: str = "devicePlugin",
    replicas: int = 1,
    path: str | None = PATH,
) -> dict[str, Any]:
    """One class of the loop devices backed by files of ``backing``'s folder, named after
    the file (the same name whatever loop number it is attached to), at ``path`` (None: at
    the host's path, the kernel's name)."""
    node: dict[str, Any] = {"fileMode": "0660", "gid": 6}
    if path is not None:
        node["path"] = path
    return {
        "vendor": VENDOR,
        "classes": [
            {
                "name": "held",
                "api": api,
                "match": {
                    "subsystem": "block",
                    "kernel": "loop*",
                    "attributes": {"loop/backing_file": f"{backing.parent}/*"},
                },
                "deviceName": "{attribute[loop/backing_file]|basename|name}",
                "node": node,
                "whenBack": when_back,
                "sharing": {"replicas": replicas},
            }
        ],
    }


def device_of(backing: Path) -> str:
    return backing.name


class Node:
    """The fake kubelet's pod-resources and the fake runtime's CRI, on one folder."""

    def __init__(self, folder: Path) -> None:
        self.pod_resources = folder / "pr.sock"
        self.cri_socket = folder / "cri.sock"
        self.kubelet = FakePodResources(self.pod_resources, [])
        self.cri = FakeCri(self.cri_socket, "containerd", "v2.3.7")
        self.containers: dict[str, Container] = {}

    def add(
        self,
        name: str,
        held: Container,
        *,
        devices: Any = (),
        claims: Any = (),
        started_at: int | None = None,
        pid: int | None = None,
    ) -> None:
        """Pod ``name`` whose container ``c`` is ``held`` (its process, cgroup and rules)."""
        self.kubelet.pods.append(pod("ns", name, container("c", devices, claims)))
        self.cri.add_sandbox(f"sb-{name}", "ns", name, uid=f"uid-{name}")
        # As CDI injection leaves it: the node at its path with the numbers of the container's
        # creation (a later follow changes the container, never its spec).
        created = {"path": PATH, "type": "b", "major": 7, "minor": held.oci_rules[1]["minor"]}
        spec = runtime_spec(held.cgroup, held.oci_rules, [created])
        process = held.process.pid if pid is None else pid
        start = (
            wall_start(process_start(held.process.pid) or 0) if started_at is None else started_at
        )
        self.cri.add_container(
            f"id-{name}", f"sb-{name}", "c", containerd_info(f"sb-{name}", process, spec),
            started_at=start + 1,
        )  # fmt: skip
        self.containers[name] = held


@asynccontextmanager
async def fake_node(folder: Path) -> AsyncIterator[Node]:
    node = Node(folder)
    with node.kubelet, node.cri:
        yield node


def reattached(loops: LoopDevices, old: LoopDevice, backing: Path) -> LoopDevice:
    """The re-plug: the backing file detached from ``old`` and attached to a new device."""
    loops.detach(old)
    new = loops.add()
    loops.attach(new, backing)
    assert new.number != old.number
    return new


@asynccontextmanager
async def agent_on(
    short_dir: Path,
    backing: Path,
    when_back: str,
    node: Node,
    *,
    replicas: int = 1,
    path: str | None = PATH,
) -> AsyncIterator[tuple[Agent, asyncio.Task[None]]]:
    """The real agent on kernel uevents, its class ``whenBack`` ``when_back``, the device
    discovered."""
    async with (
        FakeKubelet(short_dir / "dp"),
        running_agent(
            short_dir,
            class_config(backing, when_back, replicas=replicas, path=path),
            pod_resources_socket=node.pod_resources,
            cri_socket=[node.cri_socket],
        ) as (agent, task),
    ):
        # A shared device is in the runner as its slots.
        names = {device_of(backing), f"{device_of(backing)}-0"}
        await until(
            lambda: names & {d.name for d in agent.runners["held"].devices},
            "the device discovered",
        )
        yield agent, task


def _lines(caplog: pytest.LogCaptureFixture, *words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if all(w in r.getMessage() for w in words)]


async def test_follow_gives_the_holder_the_device_again_and_touches_no_other(
    short_dir: Path,
    loops: LoopDevices,
    backing: Path,
    attached: LoopDevice,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    holder, other = Container(attached.number), Container(attached.number)
    try:
        async with fake_node(short_dir) as node:
            name = device_of(backing)
            node.add("app", holder, devices=[plugin_devices(f"{VENDOR}/held", name)])
            node.add("bystander", other, devices=[plugin_devices(f"{VENDOR}/held", "other")])
            rdev = f"out = os.stat({PATH!r}).st_rdev"
            untouched = (other.listed(), other.programs(), other.run(rdev))
            async with agent_on(short_dir, backing, "follow", node) as (agent, task):
                assert holder.read() == READ
                new = reattached(loops, attached, backing)
                await until(lambda: holder.read() == READ, "the holder reads the device again")
                assert holder.run(rdev) == os.makedev(7, new.number)
                [line] = await until(
                    lambda: _lines(caplog, "came back", "ns/app/c"), "the holder's line"
                )
                assert ": done" in line, line
                # Again: the runtime's spec still names the first numbers, the container the
                # second; the follow starts from what the container has.
                newer = reattached(loops, new, backing)
                lines = await until(
                    lambda: (x := _lines(caplog, "came back", "ns/app/c"))[1:] and x,
                    "the holder's second line",
                )
                assert ": done" in lines[1], lines[1]
                assert holder.read() == READ
                assert holder.run(rdev) == os.makedev(7, newer.number)
                assert (other.listed(), other.programs(), other.run(rdev)) == untouched
                assert not _lines(caplog, "came back", "bystander")
                assert not task.done() and not node.cri.stopped
                metrics = agent.metrics.registry.get_sample_value(
                    "cdi_gen_when_back_total",
                    {"resource": f"{VENDOR}/held", "policy": "follow", "outcome": "done"},
                )
                assert metrics == 2
    finally:
        holder.stop()
        other.stop()


async def test_a_shared_device_is_followed_for_the_holder_of_one_slot(
    short_dir: Path,
    loops: LoopDevices,
    backing: Path,
    attached: LoopDevice,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A device shared in slots comes back once (not once per slot), and a container holding
    one of its slots is its holder."""
    caplog.set_level(logging.INFO)
    holder = Container(attached.number)
    try:
        async with fake_node(short_dir) as node:
            slot = f"{device_of(backing)}-1"
            node.add("app", holder, devices=[plugin_devices(f"{VENDOR}/held", slot)])
            async with agent_on(short_dir, backing, "follow", node, replicas=2):
                reattached(loops, attached, backing)
                await until(lambda: holder.read() == READ, "the holder reads the device again")
                [line] = await until(
                    lambda: _lines(caplog, "came back", "ns/app/c"), "the holder's line"
                )
                assert ": done" in line, line
    finally:
        holder.stop()


async def test_keep_leaves_the_holder_without_its_device(
    short_dir: Path,
    loops: LoopDevices,
    backing: Path,
    attached: LoopDevice,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Today's behaviour, so that the follow test can fail: the holder's node still names
    the old numbers, and reads nothing."""
    caplog.set_level(logging.INFO)
    holder = Container(attached.number)
    try:
        async with fake_node(short_dir) as node:
            node.add("app", holder, devices=[plugin_devices(f"{VENDOR}/held", device_of(backing))])
            async with agent_on(short_dir, backing, "keep", node) as (agent, _):
                assert holder.read() == READ
                new = reattached(loops, attached, backing)
                runner = agent.runners["held"]
                await until(
                    lambda: (
                        runner.spec_ok
                        and [d.nodes[0].minor for d in runner.devices] == [new.number]
                    ),
                    "the device in the spec at its new number",
                )
                assert holder.read() == ""
                assert node.kubelet.requests.empty() and node.cri.requests.empty()
    finally:
        holder.stop()


async def test_restart_stops_exactly_the_holding_container(
    short_dir: Path,
    loops: LoopDevices,
    backing: Path,
    attached: LoopDevice,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    holder, other = Container(attached.number), Container(attached.number)
    try:
        async with fake_node(short_dir) as node:
            name = device_of(backing)
            node.add("app", holder, devices=[plugin_devices(f"{VENDOR}/held", name)])
            node.add("bystander", other, devices=[plugin_devices(f"{VENDOR}/held", "other")])
            async with agent_on(short_dir, backing, "restart", node):
                reattached(loops, attached, backing)
                await until(lambda: node.cri.stopped, "a StopContainer")
                assert node.cri.stopped == [("id-app", 2)]
                [line] = await until(
                    lambda: _lines(caplog, "came back", "ns/app/c"), "the holder's line"
                )
                assert ": restarted: stopped through the CRI" in line, line
    finally:
        holder.stop()
        other.stop()


@pytest.mark.parametrize("when_back", ["restart", "follow"])
async def test_a_device_back_at_another_path_restarts_its_holder(
    short_dir: Path,
    loops: LoopDevices,
    backing: Path,
    attached: LoopDevice,
    caplog: pytest.LogCaptureFixture,
    *,
    when_back: str,
) -> None:
    """A class without node.path puts the device at the host's path, which names the kernel's
    numbering (/dev/loopN here; /dev/bus/usb/BBB/DDD, /dev/ttyUSBn for USB): it comes back at
    another path. Still a comeback: restart stops the holder, and follow, which cannot give a
    node at another path in place, runs as restart saying why."""
    caplog.set_level(logging.INFO)
    holder = Container(attached.number)
    try:
        async with fake_node(short_dir) as node:
            node.add("app", holder, devices=[plugin_devices(f"{VENDOR}/held", device_of(backing))])
            async with agent_on(short_dir, backing, when_back, node, path=None):
                new = reattached(loops, attached, backing)
                [line] = await until(
                    lambda: _lines(caplog, "came back", "ns/app/c"), "the holder's line"
                )
                assert node.cri.stopped == [("id-app", 2)]
                assert ": restarted: " in line, line
                if when_back == "follow":
                    assert (
                        f"whenBack follow runs as restart: {attached.path} came back as "
                        f"{new.path}" in line
                    ), line
    finally:
        holder.stop()


async def test_hostile_holders_each_get_their_line_and_the_agent_serves_on(
    short_dir: Path,
    loops: LoopDevices,
    backing: Path,
    attached: LoopDevice,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On one re-plug: a holder that exited is skipped, a PID the runtime's container no
    longer has (its process started after the container) is refused, a link planted at the
    path is refused and left; the good holder is followed all the same."""
    caplog.set_level(logging.INFO)
    good, linked, gone, reused = (Container(attached.number) for _ in range(4))
    try:
        async with fake_node(short_dir) as node:
            held = [plugin_devices(f"{VENDOR}/held", device_of(backing))]
            node.add("good", good, devices=held)
            node.add("linked", linked, devices=held)
            node.add("gone", gone, devices=held)
            node.add("reused", reused, devices=held, started_at=time.time_ns() - 3600 * 10**9)
            linked.run(f"os.unlink({PATH!r}); os.symlink('/etc/passwd', {PATH!r})")
            gone.stop()
            async with agent_on(short_dir, backing, "follow", node) as (_agent, task):
                reattached(loops, attached, backing)

                def four() -> list[str] | None:
                    found = _lines(caplog, "came back", "container ns/")
                    return found if len(found) == 4 else None

                lines = await until(four, "one line per holder")
                by_pod = {pod_name: [x for x in lines if f"ns/{pod_name}/c" in x] for pod_name in
                          ("good", "linked", "gone", "reused")}  # fmt: skip
                assert ": done" in by_pod["good"][0]
                assert ": refused" in by_pod["linked"][0], by_pod["linked"]
                assert "symbolic link" in by_pod["linked"][0], by_pod["linked"]
                assert ": skipped" in by_pod["gone"][0] and "exited" in by_pod["gone"][0]
                assert ": refused" in by_pod["reused"][0], by_pod["reused"]
                assert "another process" in by_pod["reused"][0], by_pod["reused"]
                assert all("\n" not in x for x in lines)
                assert good.read() == READ
                assert linked.run(f"out = os.readlink({PATH!r})") == "/etc/passwd"
                assert reused.read() == ""
                assert not task.done()
    finally:
        for held_container in (good, linked, reused):
            held_container.stop()


class _Sink:
    """A DRA class's sink that only records: the driver itself is not what is tested."""

    def publish(self, config: Any, devices: Any, discovered: Any) -> bool:
        return False

    async def withdrawn(self) -> None:
        return None


async def test_follow_through_dra_finds_the_holder_by_its_claim(
    short_dir: Path,
    loops: LoopDevices,
    backing: Path,
    attached: LoopDevice,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    config = parse_config(class_config(backing, "follow", api="dra"), "test.yaml")
    [cls] = config.classes
    discovery = Discovery(config)
    tasks: list[asyncio.Task[None]] = []
    tools = Tools(Metrics(), 1.0, lambda work, name: tasks.append(asyncio.create_task(work)))
    holder, other = Container(attached.number), Container(attached.number)
    name = device_of(backing)
    try:
        async with fake_node(short_dir) as node:
            pool_name = device_name("held", name, ["held"])
            node.add("app", holder, claims=[claim(
                "ns", "cl", (VENDOR, "node-a", pool_name, [f"{VENDOR}/held={name}"])
            )])  # fmt: skip
            node.add("bystander", other, claims=[claim(
                "ns", "cl2", (VENDOR, "node-a", "held-other", [f"{VENDOR}/held=other"])
            )])  # fmt: skip
            privileges = Privileges.now(node.pod_resources, [node.cri_socket])
            assert privileges.follow_lacks == ()
            back = class_policy(
                cls, VENDOR, privileges, node.pod_resources,
                driver=(VENDOR, "node-a", ["held"]), metrics=tools.metrics,
            )  # fmt: skip
            runner = ClassRunner(
                cls, VENDOR, short_dir / "cdi", None, tools, sink=_Sink(), back=back
            )

            async def fed(minor: int | None) -> bool:
                """The class's devices fed to the runner; whether the device is at
                ``minor`` (None: gone)."""
                records = enumerate_records(
                    subsystems=discovery.subsystems,
                    interest=discovery.interest,
                    wants=discovery.wants,
                )
                for change in discovery.replace(records):
                    await runner.apply(change, None)
                # A DRA class whose devices come back keeps a gone one, marked gone (tainted
                # in its slice).
                minors = {d.nodes[0].minor for d in runner.devices if d.name == name and not d.gone}
                return minors == ({minor} if minor is not None else set())

            await until(lambda: fed(attached.number), "the device discovered")
            loops.detach(attached)
            await until(lambda: fed(None), "the device gone")
            assert [d.gone for d in runner.devices if d.name == name] == [True]
            new = loops.add()
            loops.attach(new, backing)
            await until(lambda: fed(new.number), "the device back at its new number")
            await asyncio.gather(*tasks)
            assert holder.read() == READ
            [line] = _lines(caplog, "came back", "ns/app/c")
            assert ": done" in line, line
            assert not _lines(caplog, "came back", "bystander")
            assert isinstance(runner.advertised[0], AdvertisedDevice)
    finally:
        holder.stop()
        other.stop()
        for task in tasks:
            task.cancel()


def _comeback(name: str, old: int, new: int) -> Comeback:
    def device(minor: int) -> DiscoveredDevice:
        node = NodeInfo(f"/dev/loop{minor}", PATH, 7, minor, "b", f"/sys/block/loop{minor}")
        return DiscoveredDevice(name, "held", "/sys/x", (node,), None, True, (), {})

    comebacks = Comebacks()
    comebacks.of(ClassChange("held", (device(old),), added=(name,)))
    found = comebacks.of(ClassChange("held", (device(new),), changed=(name,)))
    return found[0] if found else Comeback(name, device(new), ())


def _policy(folder: Path, pod_resources: Path, metrics: Metrics, bound: float = 10.0) -> BackPolicy:
    keys = DeviceKeys(f"{VENDOR}/held", ("disk",))
    return BackPolicy(
        f"{VENDOR}/held", "follow", NodeOptions(), lambda name: keys,
        pod_resources=pod_resources, cri=folder / "cri.sock", metrics=metrics, bound=bound,
    )  # fmt: skip


async def test_a_silent_kubelet_is_one_line_within_the_bound(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A pod-resources socket that accepts and never answers costs the lookup's bound: one
    line, counted, and the policy's own bound (shorter here) is one line too."""
    metrics = Metrics()
    with silent_socket(short_dir / "pr.sock") as silent:
        started = time.monotonic()
        assert await _policy(short_dir, silent, metrics).handle(_comeback("disk", 1, 9)) == []
        assert time.monotonic() - started < 2
        [line] = _lines(caplog, "came back: its holders could not be found")
        assert "no answer to PodResourcesLister/List within 0.5 s" in line, line
        short = _policy(short_dir, silent, metrics, bound=0.1)
        assert await short.handle(_comeback("disk", 1, 9)) == []
        [line] = _lines(caplog, "took over 0.1 s")
    sample = metrics.registry.get_sample_value
    labels = {"resource": f"{VENDOR}/held", "policy": "follow"}
    assert sample("cdi_gen_when_back_total", {**labels, "outcome": "lookup-failed"}) >= 1
    assert sample("cdi_gen_when_back_total", {**labels, "outcome": "timeout"}) == 1


async def test_the_same_numbers_need_no_follow(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with fake_node(short_dir) as node:
        policy = _policy(short_dir, node.pod_resources, Metrics())
        assert await policy.handle(_comeback("disk", 3, 3)) == []
        assert node.kubelet.requests.empty() and node.cri.requests.empty()
    [line] = _lines(caplog, "came back with the same numbers")
    assert "nothing changes in its containers" in line
