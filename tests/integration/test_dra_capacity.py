"""Issue 36 item 3 through the agent as ``cdi-gen run`` wires it: a shared DRA class is
published once by capacity where the stand-in API server keeps ``allowMultipleAllocations``
(and its shares prepared with their share IDs), as slots where it drops the field; the choice
is asked once, with a dry run that stores nothing, and said once in the log."""

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
from tests.agentrun import dra_settings
from tests.fakes.apiserver import FakeApiServer, Obj
from tests.fakes.drakubelet import FakeDraKubelet
from tests.fakes.source import PipeSource

pytestmark = pytest.mark.timeout(60)

DRIVER = "example.com"
NODE = "node-1"
CONFIG = {
    "vendor": DRIVER,
    "classes": [
        {
            "name": "loop",
            "match": {"subsystem": "block", "kernel": "loop0"},
            "api": "dra",
            "sharing": {"replicas": 2},
        }
    ],
}
BY_CAPACITY = "shared devices published by capacity"
AS_SLOTS = "shared devices published as N slots: the API server drops allowMultipleAllocations"


def _devices(api: FakeApiServer) -> dict[str, Obj]:
    return {
        d["name"]: d
        for s in api.slices.values()
        if s["spec"]["driver"] == DRIVER
        for d in s["spec"].get("devices") or ()
    }


@asynccontextmanager
async def _agent(short_dir: Path, api: FakeApiServer) -> AsyncIterator[Agent]:
    api.nodes[NODE] = str(uuid.uuid4())
    source = PipeSource.from_data("export-db-vm.txt", only={"loop0"})
    settings = dra_settings(short_dir, api.kubeconfig(short_dir), NODE)
    agent = Agent(parse_config(CONFIG, "test.yaml"), Settings(**settings), source=source)
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.started.wait(), 10)
        yield agent
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)
        source.release()


def _claim(name: str, uid: str, *shares: tuple[str, str]) -> Obj:
    results = [
        {"request": request, "driver": DRIVER, "pool": NODE, "device": "loop-loop0", "shareID": s}
        for request, s in shares
    ]
    return {
        "kind": "ResourceClaim",
        "apiVersion": "resource.k8s.io/v1",
        "metadata": {"namespace": "default", "name": name, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results}}},
    }


async def test_a_shared_device_is_published_once_and_each_share_prepared(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "cdi_gen.dra.node")
    first, second, third = (str(uuid.uuid4()) for _ in range(3))
    api = FakeApiServer()
    async with api, FakeDraKubelet(short_dir / "reg") as kubelet, _agent(short_dir, api):
        connection = await kubelet.next_registration(within=10)
        await api.until(lambda: set(_devices(api)) == {"loop-loop0"})
        device = _devices(api)["loop-loop0"]
        assert device["allowMultipleAllocations"] is True
        assert device["capacity"]["shares"]["value"] == "2"
        assert not any(s["spec"].get("sharedCounters") for s in api.slices.values())
        # The dry run stored nothing: the only slices are the pool's.
        assert all(
            s["metadata"]["name"].startswith(f"{NODE}-{DRIVER}-") for s in api.slices.values()
        )
        assert not any("-capacity-" in name for name in api.slices)

        # Two shares in one claim, one in another: none holds the device against the others.
        api.claims["default", "c1"] = _claim("c1", "u1", ("a", first), ("b", second))
        api.claims["default", "c2"] = _claim("c2", "u2", ("a", third))
        answer = await connection.prepare([("default", "c1", "u1"), ("default", "c2", "u2")])
        got = {
            uid: [(d.device_name, d.share_id, list(d.cdi_device_ids)) for d in a.devices]
            for uid, a in answer.claims.items()
        }
        assert {uid: a.error for uid, a in answer.claims.items()} == {"u1": "", "u2": ""}
        # Each share the class's one CDI device; each request's first device also its own
        # device-metadata mount.
        cdi = "example.com/loop=loop0-0"

        def meta(uid: str, n: int) -> str:
            return f"example.com/loop=claim-{uid}-{n}-metadata"

        assert got == {
            "u1": [
                ("loop-loop0", first, [cdi, meta("u1", 0)]),
                ("loop-loop0", second, [cdi, meta("u1", 1)]),
            ],
            "u2": [("loop-loop0", third, [cdi, meta("u2", 0)])],
        }
    assert [r.getMessage() for r in caplog.records].count(BY_CAPACITY) == 1
    assert AS_SLOTS not in caplog.text


async def test_an_api_server_without_the_field_gets_slots(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "cdi_gen.dra.node")
    api = FakeApiServer()
    api.consumable_capacity = False
    async with api, FakeDraKubelet(short_dir / "reg") as kubelet, _agent(short_dir, api):
        await kubelet.next_registration(within=10)
        slots = {"loop-loop0-0", "loop-loop0-1"}
        await api.until(lambda: set(_devices(api)) == slots)
        assert all(d["consumesCounters"] for d in _devices(api).values())
        assert not any("allowMultipleAllocations" in d for d in _devices(api).values())
    assert [r.getMessage() for r in caplog.records].count(AS_SLOTS) == 1
    assert BY_CAPACITY not in caplog.text
