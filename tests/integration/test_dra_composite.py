"""Issue 56 through the agent as ``cdi-gen run`` wires it: a composite class (a disk and its
partitions, ``group.offer: both``) published whole and in parts with counters where the
stand-in API server keeps them, its parts alone where it drops them (asked once by a dry run,
or seen dropped by a write); hot-plug keeps the counters true; the node never prepares a
whole beside one of its parts."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from cdi_gen.agent.agent import Agent
from cdi_gen.config.loader import parse_config
from cdi_gen.config.settings import Settings
from cdi_gen.model import DeviceRecord, ParentRecord
from tests.agentrun import dra_settings
from tests.fakes.apiserver import FakeApiServer, Obj
from tests.fakes.drakubelet import FakeDraKubelet
from tests.fakes.source import PipeSource
from tests.waiting import until

pytestmark = pytest.mark.timeout(60)

DRIVER = "example.com"
NODE = "node-1"
CONFIG = {
    "vendor": DRIVER,
    "classes": [
        {
            "name": "disk",
            "match": {"subsystem": "block", "kernel": "loop7*"},
            "group": {"by": "parent", "subsystem": "block", "offer": "both"},
            "deviceName": "{group}",
            "api": "dra",
        }
    ],
}
WHOLE = "disk-loop700"
ALONE = "composite classes published as their parts alone"


def _disk() -> DeviceRecord:
    return DeviceRecord(
        sys_path="/sys/devices/virtual/block/loop700",
        subsystem="block",
        sys_name="loop700",
        sys_number="700",
        devnode="/dev/loop700",
        devtype="disk",
        major=7,
        minor=700,
    )


def _part(p: int) -> DeviceRecord:
    disk = _disk()
    return DeviceRecord(
        sys_path=f"{disk.sys_path}/loop700p{p}",
        subsystem="block",
        sys_name=f"loop700p{p}",
        sys_number=str(p),
        devnode=f"/dev/loop700p{p}",
        devtype="partition",
        major=259,
        minor=p,
        parents=(ParentRecord(disk.sys_path, disk.sys_name, subsystem="block", devtype="disk"),),
    )


def _ours(api: FakeApiServer) -> list[Obj]:
    return [s for s in api.slices.values() if s["spec"]["driver"] == DRIVER]


def _devices(api: FakeApiServer) -> dict[str, Obj]:
    return {d["name"]: d for s in _ours(api) for d in s["spec"].get("devices") or ()}


def _counters(api: FakeApiServer) -> dict[str, set[str]]:
    return {
        cs["name"]: set(cs["counters"])
        for s in _ours(api)
        for cs in s["spec"].get("sharedCounters") or ()
    }


def _whole_counts(api: FakeApiServer) -> set[str]:
    """The counters the whole consumes, if it is published."""
    whole = _devices(api).get(WHOLE) or {}
    return {c for use in whole.get("consumesCounters") or () for c in use["counters"]}


@asynccontextmanager
async def _agent(
    short_dir: Path, api: FakeApiServer, parts: int
) -> AsyncIterator[tuple[Agent, PipeSource]]:
    api.nodes[NODE] = str(uuid.uuid4())
    source = PipeSource([_disk(), *(_part(p) for p in range(1, parts + 1))])
    settings = dra_settings(short_dir, api.kubeconfig(short_dir), NODE)
    agent = Agent(parse_config(CONFIG, "test.yaml"), Settings(**settings), source=source)
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.started.wait(), 10)
        yield agent, source
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)
        source.release()


def _claim(name: str, device: str) -> Obj:
    result = {"request": "disk", "driver": DRIVER, "pool": NODE, "device": device}
    return {
        "kind": "ResourceClaim",
        "apiVersion": "resource.k8s.io/v1",
        "metadata": {"namespace": "default", "name": name, "uid": f"u-{name}"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


async def test_the_whole_and_its_parts_with_counters_and_held_apart_on_the_node(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "cdi_gen.dra.node")
    api = FakeApiServer()
    async with (
        api,
        FakeDraKubelet(short_dir / "reg") as kubelet,
        _agent(short_dir, api, parts=2) as (agent, _),
    ):
        connection = await kubelet.next_registration(within=10)
        parts = {"disk-loop700p1", "disk-loop700p2"}
        await api.until(lambda: set(_devices(api)) == {WHOLE, *parts})
        assert _whole_counts(api) == parts
        assert list(_counters(api).values()) == [parts]
        assert "composite classes published whole and in parts, with counters" in caplog.text
        # The dry run stored nothing.
        assert not any("-counters-" in name for name in api.slices)

        # A part prepared: the whole is refused on the node (in use through the part),
        # the other part is not.
        for name, device in (("p1", "disk-loop700p1"), ("w", WHOLE), ("p2", "disk-loop700p2")):
            api.claims["default", name] = _claim(name, device)
        first = await connection.prepare([("default", "p1", "u-p1")])
        assert first.claims["u-p1"].error == ""
        assert first.claims["u-p1"].devices[0].cdi_device_ids[0] == ("example.com/disk=loop700p1")
        refused = await connection.prepare([("default", "w", "u-w")])
        assert "in use by claim default/p1" in refused.claims["u-w"].error
        assert "through disk-loop700p1" in refused.claims["u-w"].error
        second = await connection.prepare([("default", "p2", "u-p2")])
        assert second.claims["u-p2"].error == ""

        await until(lambda: agent.ready()[0], "the agent ready", observe=agent.ready)
        assert "parts alone" not in agent.ready()[1]


async def test_the_counters_follow_partitions_that_come_and_go(short_dir: Path) -> None:
    api = FakeApiServer()
    async with api, FakeDraKubelet(short_dir / "reg"), _agent(short_dir, api, 2) as (_, source):
        parts = {"disk-loop700p1", "disk-loop700p2"}
        await api.until(lambda: _whole_counts(api) == parts)
        source.add(_part(3))
        await api.until(lambda: _whole_counts(api) == {*parts, "disk-loop700p3"})
        source.remove(_part(2))
        await api.until(lambda: _whole_counts(api) == {"disk-loop700p1", "disk-loop700p3"})
        assert set(_devices(api)) == {WHOLE, "disk-loop700p1", "disk-loop700p3"}
        # The counter set is a slice of its own, written in its turn.
        await api.until(
            lambda: list(_counters(api).values()) == [{"disk-loop700p1", "disk-loop700p3"}]
        )
        # Every partition gone: the whole alone, with no counters left.
        source.remove(_part(1))
        source.remove(_part(3))
        await api.until(lambda: set(_devices(api)) == {WHOLE} and not _counters(api))
        assert "consumesCounters" not in _devices(api)[WHOLE]


async def test_without_counters_the_parts_alone_are_published_and_said_once(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "cdi_gen.dra.node")
    api = FakeApiServer()
    api.partitionable_devices = False
    async with api, FakeDraKubelet(short_dir / "reg"), _agent(short_dir, api, 2) as (agent, _):
        await api.until(lambda: set(_devices(api)) == {"disk-loop700p1", "disk-loop700p2"})
        # Never, at any write, the whole beside its parts.
        assert all(
            WHOLE not in {d["name"] for d in s["spec"].get("devices") or ()}
            for _, s, _ in api._history
        )
        assert caplog.text.count(ALONE) == 1
        assert "drops sharedCounters" in caplog.text
        await until(lambda: agent.ready()[0], "the agent ready", observe=agent.ready)
        assert "degraded: example.com/disk (parts alone, no whole" in agent.ready()[1]


async def test_counters_dropped_by_a_write_leave_the_parts_alone(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "cdi_gen.dra.node")
    api = FakeApiServer()
    async with (
        api,
        FakeDraKubelet(short_dir / "reg"),
        _agent(short_dir, api, parts=1) as (agent, source),
    ):
        await api.until(lambda: set(_devices(api)) == {WHOLE, "disk-loop700p1"})
        # The gate turned off under the running agent: the next write loses the counters.
        api.partitionable_devices = False
        source.add(_part(2))
        await api.until(lambda: set(_devices(api)) == {"disk-loop700p1", "disk-loop700p2"})
        assert "the API server dropped the counters of a slice" in caplog.text
        assert caplog.text.count(ALONE) == 1
        await until(lambda: agent.ready()[0], "the agent ready", observe=agent.ready)
        assert "parts alone" in agent.ready()[1]


async def test_a_claim_on_a_part_whose_disk_left_is_unprepared_as_any_gone_device(
    short_dir: Path,
) -> None:
    api = FakeApiServer()
    async with (
        api,
        FakeDraKubelet(short_dir / "reg") as kubelet,
        _agent(short_dir, api, parts=2) as (_, source),
    ):
        connection = await kubelet.next_registration(within=10)
        await api.until(lambda: WHOLE in _devices(api))
        api.claims["default", "p1"] = _claim("p1", "disk-loop700p1")
        answer = await connection.prepare([("default", "p1", "u-p1")])
        assert answer.claims["u-p1"].error == ""
        # The disk goes, its partitions with it (children first, as the kernel sends them).
        for record in (_part(1), _part(2), _disk()):
            source.remove(record)
        await api.until(lambda: not _devices(api) and not _counters(api))
        # Asked again, the prepared claim is answered from the checkpoint; unprepared, its
        # files go, as for any device that left.
        again = await connection.prepare([("default", "p1", "u-p1")])
        assert again.claims["u-p1"].error == ""
        assert list((short_dir / "cdi").glob("*u-p1*"))
        done = await connection.unprepare([("default", "p1", "u-p1")])
        assert done.claims["u-p1"].error == ""
        assert not list((short_dir / "cdi").glob("*u-p1*"))


async def test_a_held_part_that_leaves_stays_tainted_until_its_claim_is_unprepared(
    short_dir: Path,
) -> None:
    """A partition gone while its claim is prepared keeps its counter, which the whole still
    consumes: the scheduler never offers the whole beside a part a running claim holds. It
    leaves with the claim's unprepare."""
    api = FakeApiServer()
    async with (
        api,
        FakeDraKubelet(short_dir / "reg") as kubelet,
        _agent(short_dir, api, parts=2) as (_, source),
    ):
        connection = await kubelet.next_registration(within=10)
        parts = {"disk-loop700p1", "disk-loop700p2"}
        await api.until(lambda: _whole_counts(api) == parts)
        api.claims["default", "p1"] = _claim("p1", "disk-loop700p1")
        answer = await connection.prepare([("default", "p1", "u-p1")])
        assert answer.claims["u-p1"].error == ""

        source.remove(_part(1))  # the partition deleted, its claim still prepared
        source.remove(_part(2))  # and one nobody holds
        await api.until(lambda: "disk-loop700p2" not in _devices(api))
        held = _devices(api)["disk-loop700p1"]
        assert held["taints"] == [{"key": f"{DRIVER}/gone", "effect": "NoSchedule"}]
        assert _whole_counts(api) == {"disk-loop700p1"}
        # The counter set is a slice of its own, written in its turn.
        await api.until(lambda: list(_counters(api).values()) == [{"disk-loop700p1"}])

        done = await connection.unprepare([("default", "p1", "u-p1")])
        assert done.claims["u-p1"].error == ""
        await api.until(lambda: set(_devices(api)) == {WHOLE} and not _counters(api))
        assert "consumesCounters" not in _devices(api)[WHOLE]
