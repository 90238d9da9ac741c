"""Network interfaces against the real kernel: veth pairs this test creates (names cgn<pid>...,
deleted after) found by enumeration and by uevents, written as specs with ``netDevices`` by
the agent's path (kernel source → Discovery → writer) and by ``cdi-gen render``; an interface
removed is a device gone from the spec. One moved into a network namespace (``ip netns``, as
runc moves it into a pod's) is not: it stays in the spec until it comes back to the host, or
is destroyed with the namespace."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2
from cdi_gen.cdi.codec import dump_document
from cdi_gen.cdi.specnames import spec_filename
from cdi_gen.cdi.validation import check_document
from cdi_gen.cdi.writer import sync_spec
from cdi_gen.cli.main import main
from cdi_gen.config.loader import parse_config
from cdi_gen.config.models import AgentConfig
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.model import AdvertisedDevice
from cdi_gen.sources.udev import UdevWatcher
from tests.agentrun import running_agent
from tests.fakes.kubelet import FakeKubelet
from tests.waiting import until

pytestmark = pytest.mark.kernel

TIMEOUT = 5.0
#: A runtime that moves interfaces (this machine's may not).
RUNTIME = "containerd@2.3.7,runc@1.4.0"
#: Test-owned names, unique per process (at most 15 bytes: IFNAMSIZ).
PREFIX = f"cgn{os.getpid() % 100000}"


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True)


def _ip(*args: str) -> None:
    _run("ip", "link", *args)


@pytest.fixture
def veths() -> Iterator[list[str]]:
    """Creates veth pairs ``<PREFIX>h<i>``/``<PREFIX>p<i>`` on demand (append i); deletes
    the ones still there after the test."""
    made: list[str] = []
    yield made
    for host in made:
        subprocess.run(["ip", "link", "del", host], capture_output=True, check=False)


def _add(veths: list[str], i: int) -> str:
    host = f"{PREFIX}h{i}"
    _ip("add", host, "type", "veth", "peer", "name", f"{PREFIX}p{i}")
    veths.append(host)
    return host


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace ``<PREFIX>ns`` (what a pod's sandbox holds), deleted after."""
    name = f"{PREFIX}ns"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    yield name
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def _config(**options: Any) -> dict[str, Any]:
    return {
        "vendor": "example.com",
        "classes": [
            {
                "name": "veth",
                # The host ends only: the peers stay on the host to talk to the pod.
                "match": {"subsystem": "net", "kernel": f"{PREFIX}h*"},
                "deviceName": "{kernel}",
                "netDevice": {"name": "net-{number}"},
                **options,
            }
        ],
    }


def _spec(spec_dir: Path) -> dict[str, Any] | None:
    try:
        doc: dict[str, Any] = orjson.loads(
            (spec_dir / spec_filename("example.com", "veth")).read_bytes()
        )
    except FileNotFoundError:
        return None
    return doc


def _nets(spec_dir: Path) -> list[dict[str, str]]:
    doc = _spec(spec_dir)
    if doc is None:
        return []
    return [n for d in doc["devices"] for n in d["containerEdits"]["netDevices"]]


class _Applied:
    """What the miniature agent loop did: the watcher, discovery, and every action applied."""

    def __init__(self, watcher: UdevWatcher, discovery: Discovery) -> None:
        self.watcher = watcher
        self.discovery = discovery
        self.actions: list[tuple[str, str | None]] = []


@contextlib.asynccontextmanager
async def _follow(config: AgentConfig, spec_dir: Path) -> AsyncIterator[_Applied]:
    """The agent's loop in miniature: kernel uevents → Discovery → spec folder."""
    discovery = Discovery(config)
    watcher = UdevWatcher(
        source="kernel",
        subsystems=discovery.subsystems,
        interest=discovery.interest,
        wants=discovery.wants,
    )

    def sync() -> None:
        doc = discovery.class_spec("veth").document
        sync_spec(spec_dir, "example.com", "veth", None if doc is None else dump_document(doc))

    applied = _Applied(watcher, discovery)

    async def run() -> None:
        async for batch in watcher.batches():
            changes = (discovery.replace if batch.full else discovery.apply)(batch.records)
            if changes:
                sync()
            applied.actions += [(r.sys_name, r.action) for r in batch.records]

    discovery.replace(watcher.start())
    sync()
    task = asyncio.create_task(run())
    try:
        yield applied
    finally:
        watcher.close()
        await asyncio.wait_for(task, TIMEOUT)


async def test_veth_host_ends_follow_the_kernel(veths: list[str], tmp_path: Path) -> None:
    first = _add(veths, 0)  # present before start: found by the enumeration
    async with _follow(parse_config(_config(), "test"), tmp_path):
        doc = _spec(tmp_path)
        assert doc is not None and doc["cdiVersion"] == "1.1.0"
        assert check_document(doc) == []
        assert doc["devices"] == [
            {
                "name": first,
                "containerEdits": {"netDevices": [{"hostInterfaceName": first, "name": "net-0"}]},
            }
        ]
        second = _add(veths, 1)
        want = [
            {"hostInterfaceName": first, "name": "net-0"},
            {"hostInterfaceName": second, "name": "net-1"},
        ]
        await until(lambda: _nets(tmp_path) == want, f"{second} in the spec", TIMEOUT)
        _ip("del", first)  # deleting one end deletes the pair
        await until(lambda: _nets(tmp_path) == want[1:], f"{first} gone from the spec", TIMEOUT)
        _ip("del", second)
        await until(lambda: _spec(tmp_path) is None, "the spec removed with the last", TIMEOUT)


def test_render_writes_net_devices_for_the_real_interface(
    veths: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = _add(veths, 0)
    config = tmp_path / "config.json"
    config.write_bytes(orjson.dumps(_config()))
    with pytest.raises(SystemExit) as info:
        main(
            [
                "render", "--config", str(config), "--class", "veth",
                "--runtime", RUNTIME,
            ]
        )  # fmt: skip
    out, err = capsys.readouterr()
    assert info.value.code in (0, None), err
    doc = orjson.loads(out)
    assert doc["cdiVersion"] == "1.1.0"
    assert doc["devices"] == [
        {
            "name": host,
            "containerEdits": {"netDevices": [{"hostInterfaceName": host, "name": "net-0"}]},
        }
    ]


def _host_end(name: str) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "containerEdits": {"netDevices": [{"hostInterfaceName": name, "name": "net-0"}]},
        }
    ]


async def test_interface_in_a_netns_stays_published_until_back_or_destroyed(
    veths: list[str], netns: str, tmp_path: Path
) -> None:
    """The kernel tells the host only ``remove`` when an interface moves into another network
    namespace: the device stays in the spec as it was (a pod holds it), comes back when the
    interface does (under its pod name, renamed back, as here), and is withdrawn when a
    virtual interface is destroyed with the namespace, although the class keeps gone devices
    (``whenGone: unhealthy``): it was not unplugged."""
    host = _add(veths, 0)
    want, path = _host_end(host), f"/sys/devices/virtual/net/{host}"
    async with _follow(parse_config(_config(whenGone="unhealthy"), "test"), tmp_path) as seen:
        assert _spec(tmp_path)["devices"] == want  # type: ignore[index]
        _ip("set", host, "netns", netns, "name", "net-0")  # as runc moves it into a pod
        left = {(host, "away"), (host, "remove")}
        await until(lambda: left & set(seen.actions), f"{host} seen leaving", TIMEOUT)
        assert _spec(tmp_path)["devices"] == want  # type: ignore[index]
        # Published as it was: healthy, not kept as gone.
        assert seen.discovery.advertised("veth") == (AdvertisedDevice(host, physical=path),)
        assert (host, "away") in seen.actions
        _run("ip", "-n", netns, "link", "set", "net-0", "netns", "1", "name", host)
        # The host sees it added as net-0, then renamed (a move): the record of the rename.
        await until(lambda: (host, "move") in seen.actions, f"{host} back on the host", TIMEOUT)
        assert not seen.watcher.nets.away
        assert _spec(tmp_path)["devices"] == want  # type: ignore[index]
        _ip("set", host, "netns", netns)
        await until(lambda: seen.actions.count((host, "away")) == 2, f"{host} away again", TIMEOUT)
        # The pod ends: its namespace goes, and the veth (both ends) with it.
        _run("ip", "netns", "del", netns)
        await until(
            lambda: _spec(tmp_path) is None, f"{host} withdrawn with its namespace", TIMEOUT
        )
        assert (host, "ended") in seen.actions


async def test_interface_deleted_on_the_host_is_gone(veths: list[str], tmp_path: Path) -> None:
    """An interface deleted on the host is not taken for one that moved: ``whenGone`` keeps it."""
    host = _add(veths, 0)
    async with _follow(parse_config(_config(whenGone="unhealthy"), "test"), tmp_path) as seen:
        _ip("del", host)
        await until(lambda: (host, "remove") in seen.actions, f"{host} removed", TIMEOUT)
        assert (host, "away") not in seen.actions
        gone = AdvertisedDevice(
            host, healthy=False, physical=f"/sys/devices/virtual/net/{host}", gone=True
        )
        assert seen.discovery.advertised("veth") == (gone,)
        assert not seen.watcher.nets.away


async def test_device_plugin_allocates_the_interface_and_keeps_it_while_in_a_pod(
    veths: list[str], netns: str, short_dir: Path
) -> None:
    """The whole agent (kernel uevents, a device plugin, the fake kubelet): Allocate answers
    the interface's CDI name and nothing else; while the interface is in a namespace it
    stays advertised, healthy, with no new ListAndWatch message; destroyed with the
    namespace, it is withdrawn."""
    host = _add(veths, 0)
    async with (
        FakeKubelet(short_dir / "dp") as kubelet,
        running_agent(short_dir, _config(), runtime=(RUNTIME,)) as (agent, _),
    ):
        plugin = await kubelet.next_registration(within=10)
        assert plugin.request.resource_name == "example.com/veth"
        listed = await plugin.next_devices(within=5)
        assert {i: d.health for i, d in listed.items()} == {host: "Healthy"}
        response = await plugin.stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[host])]
            )
        )
        (container,) = response.container_responses
        assert [d.name for d in container.cdi_devices] == [f"example.com/veth={host}"]
        assert not container.devices and not container.mounts and not container.envs

        away = agent.metrics.udev_events.labels("away")
        _ip("set", host, "netns", netns, "name", "net-0")  # as runc does at container start
        await until(lambda: away._value.get() == 1, f"{host} seen leaving", TIMEOUT)
        assert plugin.updates.empty()  # nothing withdrawn, nothing marked unhealthy
        assert _nets(short_dir / "cdi") == [{"hostInterfaceName": host, "name": "net-0"}]

        _run("ip", "netns", "del", netns)  # the pod ends; the veth goes with its namespace
        assert await plugin.next_devices(within=TIMEOUT) == {}
        await until(lambda: _spec(short_dir / "cdi") is None, "the spec removed", TIMEOUT)
