"""A held DRA device that leaves the node and comes back, through the agent as `cdi-gen run`
wires it: the real agent, DRA driver, lightkube client and kubelet plugin on unix sockets,
against the stand-in API server and kubelet.

While the device is away it stays in the slice tainted ``<driver>/gone`` (for a class whose
``whenBack`` is ``restart`` or ``follow``, whatever ``whenGone`` says); the claim holding it
gets a ``Present`` condition, and the pod using the claim Events, that say it left, came back
and what the agent did (the :meth:`~cdi_gen.dra.node.DraDriver.announce` hook).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

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
POD_UID = "5f0c5b8e-4a55-4d3a-9c55-0123456789ab"


def _config(**extra: str) -> dict[str, Any]:
    loop = {"subsystem": "block", "kernel": "loop[0-9]"}
    return {"vendor": DRIVER, "classes": [{"name": "loop", "match": loop, "api": "dra", **extra}]}


@asynccontextmanager
async def _agent(
    short_dir: Path, api: FakeApiServer, config: dict[str, Any]
) -> AsyncIterator[tuple[Agent, PipeSource]]:
    source = PipeSource.from_data("export-db-vm.txt", only={"loop0", "loop1"})
    settings = dra_settings(short_dir, api.kubeconfig(short_dir), NODE)
    agent = Agent(parse_config(config, "test.yaml"), Settings(**settings), source=source)
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.started.wait(), 10)
        yield agent, source
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)
        source.release()


def _claim(uid: str, pods: bool = True) -> Obj:
    reserved = [{"resource": "pods", "name": "app-0", "uid": POD_UID}] if pods else []
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default", "uid": uid},
        "spec": {},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": DRIVER, "pool": NODE, "device": "loop-loop0"}
                    ]
                }
            },
            "reservedFor": reserved,
        },
    }


def _slice_device(api: FakeApiServer, name: str) -> Obj | None:
    for obj in api.slices.values():
        for device in (obj.get("spec") or {}).get("devices") or ():
            if device["name"] == name:
                return dict(device)
    return None


def _entry(api: FakeApiServer) -> Obj:
    found = api.claims[("default", "c")]["status"].get("devices") or [{}]
    return dict(found[0])


def _present(api: FakeApiServer) -> Obj | None:
    conditions = _entry(api).get("conditions") or ()
    return next((c for c in conditions if c["type"] == "Present"), None)


def _events(api: FakeApiServer, reason: str) -> list[Obj]:
    return [e for e in api.events.values() if e["reason"] == reason]


@pytest.mark.parametrize(
    ("extra", "effect"),
    [
        ({"whenBack": "follow"}, "NoSchedule"),
        ({"whenBack": "restart", "whenGone": "taint"}, "NoExecute"),
    ],
)
async def test_a_held_device_that_leaves_stays_tainted_and_its_claim_and_pod_are_told(
    short_dir: Path, extra: dict[str, str], effect: str
) -> None:
    uid = str(uuid.uuid4())
    async with FakeApiServer() as api, FakeDraKubelet(short_dir / "reg") as kubelet:
        api.nodes[NODE] = str(uuid.uuid4())
        api.claims[("default", "c")] = _claim(uid)
        async with _agent(short_dir, api, _config(**extra)) as (agent, source):
            connection = await kubelet.next_registration(within=10)
            await api.until(lambda: _slice_device(api, "loop-loop0") is not None)
            answer = (await connection.prepare([("default", "c", uid)])).claims[uid]
            assert answer.error == ""
            await api.until(lambda: bool(_entry(api).get("conditions")))
            ready_since = _entry(api)["conditions"][0]["lastTransitionTime"]
            assert _present(api) is None, "nothing said while the device never left"

            [loop0] = [r for r in source.initial if r.sys_name == "loop0"]
            source.remove(loop0)
            taint = {"key": f"{DRIVER}/gone", "effect": effect}
            await api.until(
                lambda: (_slice_device(api, "loop-loop0") or {}).get("taints") == [taint]
            )
            await api.until(lambda: (_present(api) or {}).get("status") == "False")
            present = _present(api)
            assert present is not None and present["reason"] == "DeviceGone"
            assert f"tainted {DRIVER}/gone:{effect}" in present["message"]
            # Ready is as it was: the claim is still prepared.
            ready = _entry(api)["conditions"][0]
            assert (ready["type"], ready["status"], ready["lastTransitionTime"]) == (
                "Ready",
                "True",
                ready_since,
            )
            await api.until(lambda: bool(_events(api, "DeviceGone")))
            [left] = _events(api, "DeviceGone")
            assert left["type"] == "Warning"
            assert left["regarding"] == {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": "default",
                "name": "app-0",
                "uid": POD_UID,
            }
            assert left["reportingController"] == DRIVER
            assert "device loop-loop0 of driver example.com left node node-1" in left["note"]

            source.add(loop0)
            await api.until(lambda: "taints" not in (_slice_device(api, "loop-loop0") or {}))
            await api.until(lambda: (_present(api) or {}).get("status") == "True")
            assert _present(api)["reason"] == "DeviceBack"  # type: ignore[index]
            await api.until(lambda: bool(_events(api, "DeviceBack")))
            assert _events(api, "DeviceBack")[0]["type"] == "Normal"

            # The hook the agent calls with what it did about the device, from its thread.
            assert agent.dra is not None
            line = "device 'loop0' came back: container 'default/app-0/app': done"
            await asyncio.to_thread(
                agent.dra.announce, "loop", "loop0", extra["whenBack"], [line], failed=False
            )
            reason = "DeviceFollowed" if extra["whenBack"] == "follow" else "DeviceRestarted"
            await api.until(lambda: bool(_events(api, reason)))
            [did] = _events(api, reason)
            assert did["type"] == "Normal" and line in did["note"]
            await api.until(lambda: line in (_present(api) or {}).get("message", ""))


async def test_without_a_pod_the_claim_gets_the_events_and_a_failure_is_a_warning(
    short_dir: Path,
) -> None:
    uid = str(uuid.uuid4())
    async with FakeApiServer() as api, FakeDraKubelet(short_dir / "reg") as kubelet:
        api.nodes[NODE] = str(uuid.uuid4())
        api.claims[("default", "c")] = _claim(uid, pods=False)
        async with _agent(short_dir, api, _config(whenBack="follow")) as (agent, source):
            connection = await kubelet.next_registration(within=10)
            await api.until(lambda: _slice_device(api, "loop-loop0") is not None)
            assert (await connection.prepare([("default", "c", uid)])).claims[uid].error == ""
            [loop0] = [r for r in source.initial if r.sys_name == "loop0"]
            source.remove(loop0)
            await api.until(lambda: (_slice_device(api, "loop-loop0") or {}).get("taints"))
            source.add(loop0)
            await api.until(lambda: bool(_events(api, "DeviceBack")))
            assert agent.dra is not None
            why = "device 'loop0' came back: container 'default/app-0/app': refused: a link"
            agent.dra.announce("loop", "loop0", "follow", [why], failed=True)
            await api.until(lambda: bool(_events(api, "DeviceFollowFailed")))
            [failed] = _events(api, "DeviceFollowFailed")
            assert failed["type"] == "Warning" and why in failed["note"]
            assert failed["regarding"]["kind"] == "ResourceClaim"
            assert failed["regarding"]["uid"] == uid
            # A device no claim holds is told nothing.
            [loop1] = [r for r in source.initial if r.sys_name == "loop1"]
            source.remove(loop1)
            await api.until(lambda: (_slice_device(api, "loop-loop1") or {}).get("taints"))
            assert all("loop-loop1" not in e["note"] for e in api.events.values())
