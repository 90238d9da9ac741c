"""Uninstall or restart: at exit the agent asks the API server about its DaemonSet
(:mod:`cdi_gen.dra.plugin.uninstall`), over real HTTP to the stand-in API server.

Gone (404), being deleted (``deletionTimestamp``) or our credentials refused (401: the
ServiceAccount went first) is an uninstall: the real agent then removes its spec files with
their owner records and, in DRA mode, its node's ResourceSlices (when the API server still
lets it). Anything else (403, 500, no answer, no DaemonSet named) keeps them and says why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from cdi_gen.agent.agent import Agent
from cdi_gen.config.loader import parse_config
from cdi_gen.config.settings import Settings
from cdi_gen.dra.plugin import uninstall
from tests.fakes.apiserver import DAEMONSETS, SLICES, Answer, FakeApiServer, Obj
from tests.fakes.source import PipeSource
from tests.waiting import until

pytestmark = pytest.mark.timeout(60)

NAMESPACE, NAME = "kube-system", "cdi-gen"
PATH = f"{DAEMONSETS}{NAMESPACE}/daemonsets/{NAME}"
DRIVER = "example.com"
NODE = "node-1"
SINCE = "2026-12-01T18:00:00Z"


def _daemonset(**meta: Any) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": str(uuid.uuid4()), **meta},
    }


def _status(code: int, reason: str) -> Answer:
    body = {"kind": "Status", "status": "Failure", "reason": reason, "code": code,
            "message": reason.lower()}  # fmt: skip
    return Answer(code, json.dumps(body).encode())


def _settings(api: FakeApiServer, folder: Path, **given: Any) -> Settings:
    values: dict[str, Any] = {
        "kubeconfig": api.kubeconfig(folder),
        "daemonset": NAME,
        "daemonset_namespace": NAMESPACE,
        **given,
    }
    return Settings(**values)


async def test_a_daemonset_still_there_is_a_restart(tmp_path: Path) -> None:
    async with FakeApiServer() as api:
        api.daemonsets[(NAMESPACE, NAME)] = _daemonset()
        verdict = await uninstall.Owner(_settings(api, tmp_path)).ask()
    assert not verdict.uninstall
    assert verdict.why == f"DaemonSet {NAMESPACE}/{NAME} is still there: a restart or an update"


@pytest.mark.parametrize(
    ("state", "why"),
    [
        ("gone", f"DaemonSet {NAMESPACE}/{NAME} is gone"),
        ("deleting", f"DaemonSet {NAMESPACE}/{NAME} is being deleted (since '{SINCE}')"),
        ("unauthorized", "our credentials were refused (401): the agent's ServiceAccount is gone"),
    ],
)  # fmt: skip
async def test_uninstall_is_told(tmp_path: Path, state: str, why: str) -> None:
    async with FakeApiServer() as api:
        if state == "deleting":
            api.daemonsets[(NAMESPACE, NAME)] = _daemonset(deletionTimestamp=SINCE)
        elif state == "unauthorized":
            api.daemonsets[(NAMESPACE, NAME)] = _daemonset()
            api.answers[("GET", PATH)] = _status(401, "Unauthorized")
        verdict = await uninstall.Owner(_settings(api, tmp_path)).ask()
        assert ("GET", PATH) in [(m, p) for m, p, _ in api.requests]
    assert verdict.uninstall
    assert why in verdict.why, verdict.why


@pytest.mark.parametrize(
    ("code", "reason"), [(403, "Forbidden"), (500, "InternalError"), (429, "TooManyRequests")]
)
async def test_any_other_answer_keeps_the_specs(tmp_path: Path, code: int, reason: str) -> None:
    async with FakeApiServer() as api:
        api.answers[("GET", PATH)] = _status(code, reason)
        verdict = await uninstall.Owner(_settings(api, tmp_path)).ask()
    assert not verdict.uninstall
    assert verdict.why.startswith(
        f"cannot tell whether DaemonSet {NAMESPACE}/{NAME} is being uninstalled: "
    ), verdict.why
    assert f"HTTP {code} {reason}" in verdict.why, verdict.why


async def test_a_403_after_a_read_at_start_is_an_uninstall(tmp_path: Path) -> None:
    """The API server keeps a token's authentication 10 s: an agent that used its token just
    before its ServiceAccount and RBAC went is refused (403), not unauthenticated (401)."""
    async with FakeApiServer() as api:
        api.daemonsets[(NAMESPACE, NAME)] = _daemonset()
        owner = uninstall.Owner(_settings(api, tmp_path))
        await owner.learn()
        assert owner.read_before
        api.answers[("GET", PATH)] = _status(403, "Forbidden")
        verdict = await owner.ask()
    assert verdict.uninstall
    assert verdict.why == (
        f"asking about DaemonSet {NAMESPACE}/{NAME}: refused (403), though this agent read it "
        "at start: its permission was withdrawn (the RBAC is gone)"
    )


async def test_a_403_at_start_is_a_wrong_rbac_not_an_uninstall(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "cdi_gen")
    async with FakeApiServer() as api:
        api.answers[("GET", PATH)] = _status(403, "Forbidden")
        owner = uninstall.Owner(_settings(api, tmp_path))
        await owner.learn()
        verdict = await owner.ask()
    assert not owner.read_before and not verdict.uninstall
    (line,) = [r.getMessage() for r in caplog.records if r.name == "cdi_gen.uninstall"]
    assert line.startswith(
        f"cannot read DaemonSet {NAMESPACE}/{NAME} (needed to tell an uninstall at exit): "
    ), line
    assert "HTTP 403 Forbidden" in line, line


async def test_an_api_server_that_hangs_is_given_up_on_within_the_bound(tmp_path: Path) -> None:
    async with FakeApiServer() as api:
        api.hold_reads = asyncio.Event()
        asked = asyncio.create_task(uninstall.Owner(_settings(api, tmp_path)).ask(timeout=0.5))
        await api.until(lambda: any(p == PATH for _, p, _ in api.requests))
        # The answer is held until after the verdict: the bound, not the server, ended it.
        verdict = await asked
        api.hold_reads.set()
    assert not verdict.uninstall
    assert verdict.why.endswith("is being uninstalled: no answer within 0.5s"), verdict.why


async def test_no_daemonset_named_asks_nothing(tmp_path: Path) -> None:
    async with FakeApiServer() as api:
        verdict = await uninstall.Owner(_settings(api, tmp_path, daemonset=None)).ask()
        assert api.requests == []
    assert not verdict.uninstall
    assert verdict.why == "no DaemonSet named (--daemonset, CDI_GEN_DAEMONSET) to ask about"


async def test_an_unreadable_config_keeps_the_specs(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [")
    verdict = await uninstall.Owner(Settings(kubeconfig=bad, daemonset=NAME)).ask()
    assert not verdict.uninstall
    assert verdict.why.startswith("cannot tell whether DaemonSet "), verdict.why
    assert str(bad) in verdict.why, verdict.why


async def test_the_namespace_defaults_to_the_config_s(tmp_path: Path) -> None:
    async with FakeApiServer() as api:
        api.daemonsets[("default", NAME)] = _daemonset()
        verdict = await uninstall.Owner(_settings(api, tmp_path, daemonset_namespace=None)).ask()
    assert verdict.why == f"DaemonSet default/{NAME} is still there: a restart or an update"


# -- the agent at exit ---------------------------------------------------------------------


def _config(api: str) -> dict[str, Any]:
    return {
        "vendor": DRIVER,
        "classes": [
            {"name": "loop", "match": {"subsystem": "block", "kernel": "loop[0-9]"}, "api": api}
        ],
    }


@asynccontextmanager
async def _agent(
    short_dir: Path, api: FakeApiServer, mode: str, **options: Any
) -> AsyncIterator[Agent]:
    source = PipeSource.from_data("export-db-vm.txt", only={"loop0", "loop1"})
    settings = _settings(
        api,
        short_dir,
        spec_dir=short_dir / "cdi",
        device_plugin_dir=short_dir / "dp",
        plugins_registry_dir=short_dir / "reg",
        kubelet_plugins_dir=short_dir / "plugins",
        state_dir=short_dir / "state",
        node_name=NODE,
        metrics_address=None,
        retry_max_seconds=1.0,
        no_kubelet=mode == "host",
        **options,
    )
    agent = Agent(parse_config(_config(mode if mode == "dra" else "devicePlugin"), "t"), settings,
                  source=source)  # fmt: skip
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.started.wait(), 10)
        yield agent
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)
        source.release()


def _ours(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize("there", [True, False], ids=["restart", "uninstall"])
async def test_the_agent_removes_its_specs_on_uninstall_only(
    short_dir: Path, there: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "cdi_gen")
    spec_dir = short_dir / "cdi"
    async with FakeApiServer() as api:
        if there:
            api.daemonsets[(NAMESPACE, NAME)] = _daemonset()
        async with _agent(short_dir, api, "host"):
            await until(lambda: "example.com-loop.json" in _ours(spec_dir), "the spec written")
            written = _ours(spec_dir)
            assert len(written) == 2, written  # the spec and its owner record
    lines = [r.getMessage() for r in caplog.records if r.name == "cdi_gen.uninstall"]
    if there:
        assert _ours(spec_dir) == written
        assert lines == [
            f"spec files kept at exit: DaemonSet {NAMESPACE}/{NAME} is still there: a restart "
            "or an update"
        ]
    else:
        assert _ours(spec_dir) == []
        assert lines == [
            f"uninstall: DaemonSet {NAMESPACE}/{NAME} is gone; removing our spec files"
        ]


def _slice(node: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-0"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "loop-loop0"}],
        },
    }


@pytest.mark.parametrize("refused", [None, 401, 403], ids=["allowed", "unauthorized", "forbidden"])
async def test_a_dra_agent_deletes_its_node_s_slices_on_uninstall(
    short_dir: Path, refused: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    allowed = refused is None
    caplog.set_level(logging.INFO, "cdi_gen")
    async with FakeApiServer() as api:
        api.nodes[NODE] = str(uuid.uuid4())
        api.write(_slice("node-2"))  # another node's: never ours to delete
        if refused is not None:
            api.daemonsets[(NAMESPACE, NAME)] = _daemonset()
        async with _agent(short_dir, api, "dra") as agent:
            await until(
                lambda: any(s["spec"]["nodeName"] == NODE for s in api.slices.values()),
                "our node's slice published",
            )
            assert agent.dra is not None
            if refused is not None:
                # What `kubectl delete -k` does first: the ServiceAccount and RBAC go, and with
                # them every call of ours (401; 403 while the API server still holds our
                # token's authentication). Once the agent has read its DaemonSet at start.
                await api.until(lambda: any(p == PATH for _, p, _ in api.requests))
                await until(lambda: agent.owner is not None and agent.owner.read_before, "read")
                reason = "Unauthorized" if refused == 401 else "Forbidden"
                api.answers[("GET", PATH)] = _status(refused, reason)
                api.answers[("GET", SLICES)] = _status(refused, reason)
        nodes = sorted(s["spec"]["nodeName"] for s in api.slices.values())
    (line,) = [m for m in caplog.messages if m.startswith("uninstall: ")]
    assert _ours(short_dir / "cdi") == []
    if allowed:
        assert nodes == ["node-2"]
        assert line == (
            f"uninstall: DaemonSet {NAMESPACE}/{NAME} is gone; removing our spec files; "
            "1 ResourceSlice(s) deleted"
        )
    else:
        assert nodes == ["node-1", "node-2"]
        assert line.startswith("uninstall: asking about DaemonSet"), line
        reason = "Unauthorized: unauthorized" if refused == 401 else "Forbidden: forbidden"
        assert line.endswith(f"HTTP {refused} {reason}); the kubelet wipes them"), line


@pytest.mark.parametrize("there", [True, False], ids=["update", "uninstall"])
async def test_only_a_dra_agent_not_uninstalled_waits_for_a_successor(
    short_dir: Path, there: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rolling update's old pod keeps serving until its successor registered (bounded by
    # the handover's 20 s, spared here: the waits are counted, not waited); an uninstalled
    # one has none coming and stops at once, so deleting the DaemonSet takes no 20 s a node.
    from cdi_gen.dra.plugin.server import DraPlugin

    waits: list[str] = []

    async def hand_over(plugin: DraPlugin, within: float = 0.0) -> bool:
        waits.append(plugin.driver)
        return False

    monkeypatch.setattr(DraPlugin, "hand_over", hand_over)
    async with FakeApiServer() as api:
        api.nodes[NODE] = str(uuid.uuid4())
        if there:
            api.daemonsets[(NAMESPACE, NAME)] = _daemonset()
        async with _agent(short_dir, api, "dra", pod_uid=str(uuid.uuid4())):
            await until(lambda: bool(api.slices), "our node's slice published")
    assert waits == ([DRIVER] if there else [])
