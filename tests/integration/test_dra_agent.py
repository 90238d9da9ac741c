"""The agent's DRA driver as wired for `cdi-gen run`, against a stand-in API server.

The real :class:`~cdi_gen.agent.agent.Agent` with a DRA class on recorded devices, its real
:class:`~cdi_gen.dra.node.DraDriver` (the real lightkube client, publisher and kubelet
plugin on real unix sockets) and the stand-in :class:`~tests.fakes.apiserver.FakeApiServer`, whose
every accepted slice write is recorded here. A device is offered in a ResourceSlice only
while the kubelet plugin serves: the scheduler allocates what a slice lists, and a driver
that does not serve cannot prepare it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from cdi_gen.agent.agent import Agent
from cdi_gen.config.loader import parse_config
from cdi_gen.config.settings import Settings
from cdi_gen.metrics import Metrics, serve_http
from cdi_gen.sources.udev import enumerate_records
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
        {"name": "loop", "match": {"subsystem": "block", "kernel": "loop[0-9]"}, "api": "dra"}
    ],
}
DEVICES = {"loop-loop0", "loop-loop1"}


def _previous_run_slice() -> Obj:
    """What an earlier agent of this node left: the pool at generation 3 with a device."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-{DRIVER}-0"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 3, "resourceSliceCount": 1},
            "devices": [{"name": "loop-loop0"}],
        },
    }


def _devices_of(obj: Obj) -> list[Obj]:
    return list((obj.get("spec") or {}).get("devices") or [])


def _offered(api: FakeApiServer) -> set[str]:
    """The devices our slices list now, if they are all of one generation (the scheduler
    ignores a pool's older generations) and all written by this agent (owned by the Node,
    which the seed is not; a change within the seed's one slice keeps its generation)."""
    ours = [s for s in api.slices.values() if s["spec"]["driver"] == DRIVER]
    generations = {s["spec"]["pool"]["generation"] for s in ours}
    if len(generations) != 1 or any(not s["metadata"].get("ownerReferences") for s in ours):
        return {"<none or stale>"}
    return {d["name"] for s in ours for d in _devices_of(s)}


def _api(api: FakeApiServer) -> list[Obj]:
    """The node and the slice an earlier run left in ``api``; then every slice the API
    server accepts from now on, in order (what was ever published, not only what is)."""
    api.nodes[NODE] = str(uuid.uuid4())
    api.write(_previous_run_slice())
    written: list[Obj] = []
    write = api.write

    def record(obj: Obj) -> Obj:
        written.append(copy.deepcopy(obj))
        return write(obj)

    api.write = record  # type: ignore[method-assign]
    return written


def _ever_offered(written: list[Obj]) -> set[str]:
    return {d["name"] for obj in written for d in _devices_of(obj)}


@asynccontextmanager
async def _agent(
    short_dir: Path, api: FakeApiServer, config: dict[str, Any] = CONFIG, **options: Any
) -> AsyncIterator[tuple[Agent, PipeSource]]:
    source = PipeSource.from_data("export-db-vm.txt", only={"loop0", "loop1"})
    settings = dra_settings(short_dir, api.kubeconfig(short_dir), NODE, **options)
    agent = Agent(parse_config(config, "test.yaml"), Settings(**settings), source=source)
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.started.wait(), 10)
        yield agent, source
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)
        source.release()


async def _readyz(agent: Agent) -> tuple[int, str]:
    assert agent._http is not None
    host, port = agent._http.sockets[0].getsockname()[:2]
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
    data = (await asyncio.wait_for(reader.read(), 5)).decode()
    writer.close()
    head, _, body = data.partition("\r\n\r\n")
    return int(head.split()[1]), body.strip()


def _foreign_checkpoint(short_dir: Path) -> Callable[[], None]:
    path = short_dir / "state" / f"dra-{DRIVER}.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"kind": "SomethingElse"}')
    return lambda: path.rename(path.with_suffix(".moved"))


def _corrupt_checkpoint(short_dir: Path) -> Callable[[], None]:
    path = short_dir / "state" / f"dra-{DRIVER}.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00not json")
    return path.unlink


@pytest.mark.parametrize(
    ("refuse", "why"),
    [(_foreign_checkpoint, "not a cdi-gen DRA checkpoint"), (_corrupt_checkpoint, "not JSON")],
)
async def test_no_device_is_offered_until_the_plugin_serves(
    short_dir: Path, refuse: Callable[[Path], Callable[[], None]], why: str
) -> None:
    """A refused checkpoint: the slices an earlier run left are emptied, no write ever
    lists a device, /readyz names the cause; once the checkpoint is moved away the plugin
    serves and the devices are published."""
    allow = refuse(short_dir)
    async with FakeApiServer() as api:
        written = _api(api)
        async with _agent(short_dir, api) as (agent, _):
            await api.until(lambda: _offered(api) == set())
            status, body = await _readyz(agent)
            assert status == 503
            assert f"DRA driver {DRIVER} (not serving: " in body and why in body, body
            assert _ever_offered(written) == set(), written

            allow()  # the next start attempt serves
            await api.until(lambda: _offered(api) == DEVICES)
            assert agent.dra is not None and agent.dra.serving


async def test_a_socket_path_over_the_unix_limit_offers_no_device(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The plugin cannot even be made: nothing is offered, and every start attempt (the
    second one too) names the cause in the log and in /readyz."""
    plugins = short_dir / ("p" * 100)
    async with FakeApiServer() as api:
        written = _api(api)
        async with _agent(short_dir, api, kubelet_plugins_dir=plugins) as (agent, _):
            await api.until(lambda: _offered(api) == set())
            attempts = agent.metrics.failures.labels(DRIVER, "plugin-start")
            await until(lambda: attempts._value.get() >= 2, "two start attempts")
            status, body = await _readyz(agent)
            assert status == 503
            assert "not serving: unix socket path" in body and "longer than 107 bytes" in body
            assert _ever_offered(written) == set(), written
    failed = [r.getMessage() for r in caplog.records if "failed to start" in r.getMessage()]
    assert len(failed) >= 2
    assert all("longer than 107 bytes" in line for line in failed), failed


async def test_devices_are_withdrawn_while_the_plugin_cannot_serve(short_dir: Path) -> None:
    """Serving and registered, then the plugin's folder becomes a file (the sockets cannot
    be served again): the devices leave the slices until it serves again."""
    async with FakeApiServer() as api, FakeDraKubelet(short_dir / "reg") as kubelet:
        _api(api)
        async with _agent(short_dir, api) as (agent, _):
            await kubelet.next_registration(within=10)
            await api.until(lambda: _offered(api) == DEVICES)
            folder = short_dir / "plugins" / DRIVER
            shutil.rmtree(folder)
            folder.write_text("in the way")
            await api.until(lambda: _offered(api) == set())
            status, body = await _readyz(agent)
            assert status == 503 and "not serving: cannot serve on" in body, body

            folder.unlink()
            folder.mkdir()
            await api.until(lambda: _offered(api) == DEVICES)


def _allocated_claim(uid: str) -> Obj:
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
            }
        },
    }


async def test_a_prepared_claim_shows_its_device_in_its_status_until_unprepared(
    short_dir: Path,
) -> None:
    uid = str(uuid.uuid4())
    async with FakeApiServer() as api, FakeDraKubelet(short_dir / "reg") as kubelet:
        _api(api)
        api.claims[("default", "c")] = _allocated_claim(uid)
        async with _agent(short_dir, api):
            connection = await kubelet.next_registration(within=10)
            await api.until(lambda: _offered(api) == DEVICES)
            claim = ("default", "c", uid)
            answer = (await connection.prepare([claim])).claims[uid]
            assert answer.error == ""

            def entries() -> list[Obj]:
                found = api.claims[("default", "c")]["status"].get("devices")
                return list(found or [])

            await api.until(lambda: bool(entries()))
            [entry] = entries()
            assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, NODE, "loop-loop0")
            assert entry["conditions"][0]["type"] == "Ready"
            assert entry["conditions"][0]["status"] == "True"
            assert entry["data"]["cdiDeviceIDs"] == list(answer.devices[0].cdi_device_ids)
            assert entry["data"]["deviceNodes"] == ["/dev/loop0"]
            # The metadata file of the plain claim, mounted through its own spec.
            assert any(i.endswith("-metadata") for i in entry["data"]["cdiDeviceIDs"])

            assert (await connection.unprepare([claim])).claims[uid].error == ""
            await api.until(lambda: not entries())


async def test_the_probe_socket_answers_for_this_agent_while_another_holds_the_address(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rolling update on the host's network: the agent this pod replaces holds the metrics
    address and says ready there. ``cdi-gen probe`` on this pod's socket says what this
    agent waits for until its own plugin is registered, then ready; the socket is removed
    at exit."""
    from cdi_gen.dra.plugin.server import DraPlugin

    async def no_successor(_plugin: DraPlugin, within: float = 0.0) -> bool:
        return False  # at its stop, no newer pod comes: the 20 s handover is not the point

    monkeypatch.setattr(DraPlugin, "hand_over", no_successor)
    older = await serve_http("127.0.0.1", 0, Metrics(), lambda: (True, "ready"))
    port = older.sockets[0].getsockname()[1]
    probe_socket = short_dir / "probe.sock"

    def probe() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cdi_gen", "probe", "--socket", str(probe_socket)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    async with older, FakeApiServer() as api:
        _api(api)
        options = {
            "metrics_address": f"127.0.0.1:{port}",
            "pod_uid": str(uuid.uuid4()),
            "probe_socket": probe_socket,
        }
        async with _agent(short_dir, api, **options):
            waiting = await asyncio.to_thread(probe)
            assert waiting.returncode == 1, waiting
            assert waiting.stdout.startswith(f"waiting for DRA driver {DRIVER}"), waiting.stdout
            async with FakeDraKubelet(short_dir / "reg") as kubelet:
                await kubelet.next_registration(within=10)

                async def answer() -> subprocess.CompletedProcess[str] | None:
                    done = await asyncio.to_thread(probe)
                    return done if done.returncode == 0 else None

                ready = await until(answer, "the probe saying ready", within=20)
                assert ready.stdout == "ready\n"
    assert not probe_socket.exists()


async def test_with_cleanup_on_exit_the_agent_a_newer_one_took_over_from_leaves_the_specs(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--cleanup-on-exit`` through a rolling update with surge: the older agent hands over
    to the newer one registered beside it and leaves the class's spec file, which the newer
    one serves under the same name (and does not write again: it holds what it would
    write). The newer one, with nobody to hand over to, removes it at its exit."""
    from cdi_gen.dra.plugin.server import HANDOVER_SECONDS, DraPlugin

    older_uid, newer_uid = str(uuid.uuid4()), str(uuid.uuid4())
    hand_over = DraPlugin.hand_over

    async def briefly(plugin: DraPlugin, within: float = HANDOVER_SECONDS) -> bool:
        # The newest agent waits out its bound for a successor that never comes: a short one.
        return await hand_over(plugin, within=0.5 if plugin.pod_uid == newer_uid else within)

    monkeypatch.setattr(DraPlugin, "hand_over", briefly)
    spec = short_dir / "cdi" / f"{DRIVER}-loop.json"
    async with (
        FakeApiServer() as api,
        FakeDraKubelet(short_dir / "reg") as kubelet,
        contextlib.AsyncExitStack() as newer,
    ):
        _api(api)
        async with _agent(short_dir, api, pod_uid=older_uid, cleanup_on_exit=True):
            await kubelet.next_registration(within=10)
            await until(spec.is_file, "the older agent's class spec")
            written = spec.read_bytes()
            await newer.enter_async_context(
                _agent(short_dir, api, pod_uid=newer_uid, cleanup_on_exit=True)
            )
            await kubelet.next_registration(within=10)
        # The older agent has gone, after the newer one registered; the newer one serves.
        assert spec.read_bytes() == written
    assert not spec.exists()


async def test_in_a_rolling_update_the_two_agents_never_write_the_slices_at_once(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolling update with surge that changes the config: the newer agent publishes its
    pool only once the older one has said it writes no more (after the kubelet registered
    the newer one), so the older one's last write is never the last word. Before, both
    published while the newer one waited for its registration, each took the other's slice
    for a change to repair, and now and then the older one's devices stayed published."""
    from cdi_gen.dra.plugin.server import HANDOVER_SECONDS, DraPlugin

    older_uid, newer_uid = str(uuid.uuid4()), str(uuid.uuid4())
    hand_over = DraPlugin.hand_over

    async def briefly(plugin: DraPlugin, within: float = HANDOVER_SECONDS) -> bool:
        return await hand_over(plugin, within=0.5 if plugin.pod_uid == newer_uid else within)

    monkeypatch.setattr(DraPlugin, "hand_over", briefly)
    one = copy.deepcopy(CONFIG)
    one["classes"][0]["match"]["kernel"] = "loop0"
    caplog.set_level("INFO", logger="cdi_gen.dra.plugin.server")
    async with FakeApiServer() as api, contextlib.AsyncExitStack() as newer:
        written = _api(api)
        kubelet = FakeDraKubelet(short_dir / "reg")
        async with _agent(short_dir, api, pod_uid=older_uid):
            async with kubelet:
                await kubelet.next_registration(within=10)
                await until(lambda: _offered(api) == DEVICES, "the older agent's pool")
            # No kubelet for a while: the newer agent serves and is not registered.
            await newer.enter_async_context(_agent(short_dir, api, one, pod_uid=newer_uid))
            await until(
                lambda: "once the older instance hands them over" in caplog.text,
                "the newer agent waiting for the older one",
            )
            assert all("loop-loop1" in _ever_offered([w]) for w in written[1:]), written
            async with kubelet:
                await until(
                    lambda: _offered(api) == {"loop-loop0"}, "the newer agent's pool", within=20
                )
                first = next(
                    i for i, w in enumerate(written) if _ever_offered([w]) == {"loop-loop0"}
                )
                # Every write before the newer one's first is the older one's, none after.
                assert all("loop-loop1" in _ever_offered([w]) for w in written[1:first])
                assert all(_ever_offered([w]) == {"loop-loop0"} for w in written[first:])
        assert _offered(api) == {"loop-loop0"}
        assert all(_ever_offered([w]) == {"loop-loop0"} for w in written[first:])


@pytest.fixture
def veth() -> Iterator[str]:
    """A veth pair made for the test (host end ``cgd<pid>h``), deleted after."""
    host = f"cgd{os.getpid() % 100000}h"
    subprocess.run(
        ["ip", "link", "add", host, "type", "veth", "peer", "name", f"{host[:-1]}p"],
        check=True,
        capture_output=True,
    )
    yield host
    subprocess.run(["ip", "link", "del", host], capture_output=True, check=False)


def _address(interface: str) -> str:
    return Path(f"/sys/class/net/{interface}/address").read_text().strip()


@pytest.mark.kernel
async def test_a_prepared_interface_shows_its_network_data_in_the_claim_status(
    short_dir: Path, veth: str
) -> None:
    """KEP-4817 ``networkData``: the name the interface gets in the pod (the class's
    ``netDevice.name``) and its hardware address, read from the real interface at prepare."""
    config = {
        "vendor": DRIVER,
        "classes": [
            {
                "name": "nic",
                "match": {"subsystem": "net", "kernel": veth},
                "netDevice": {"name": "lan1"},
                "api": "dra",
            }
        ],
    }
    records = enumerate_records(subsystems=["net"], interest=lambda _s, name: name == veth)
    uid = str(uuid.uuid4())
    async with FakeApiServer() as api, FakeDraKubelet(short_dir / "reg") as kubelet:
        _api(api)
        claim = _allocated_claim(uid)
        claim["status"]["allocation"]["devices"]["results"][0]["device"] = f"nic-{veth}"
        api.claims[("default", "c")] = claim
        settings = dra_settings(
            short_dir, api.kubeconfig(short_dir), NODE, runtime=["containerd@2.3.7,runc@1.4.0"]
        )
        source = PipeSource(records)
        agent = Agent(parse_config(config, "test.yaml"), Settings(**settings), source=source)
        task = asyncio.create_task(agent.run())
        try:
            connection = await kubelet.next_registration(within=10)
            await api.until(lambda: _offered(api) == {f"nic-{veth}"})
            answer = (await connection.prepare([("default", "c", uid)])).claims[uid]
            assert answer.error == ""
            assert answer.devices[0].cdi_device_ids[0] == f"{DRIVER}/nic={veth}"

            def entries() -> list[Obj]:
                return list(api.claims[("default", "c")]["status"].get("devices") or [])

            await api.until(lambda: bool(entries()))
            [entry] = entries()
            address = _address(veth)
            assert entry["networkData"] == {"interfaceName": "lan1", "hardwareAddress": address}
            assert "deviceNodes" not in entry["data"]
        finally:
            agent.stop()
            await asyncio.wait_for(task, 10)
            source.release()
