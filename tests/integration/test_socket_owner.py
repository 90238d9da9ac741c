"""Who serves a socket name, over real processes and real gRPC on unix sockets.

A name a live process serves is never taken: the transport holds a lock beside each socket
(``.<name>.lock``) from its first start to its last stop, and a socket someone listens on
without it is left alone too. A second copy of an agent with the same pod UID (``kubectl
debug``, a manual run with the pod's environment, a reused UID in a test) exits with one line
naming the socket and the rule, and the first keeps serving. Before, the copy unlinked the
first one's sockets, the first one's supervisor served them anew, and the two traded the
names dozens of times a second; the survivor's DRA socket then answered UNAVAILABLE.

And a rolling update whose new instance dies after the old one handed it the
ResourceSlices: the old one notices (the connection it holds to the new one's registration
socket ends; a kill leaves the files) and publishes them again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from cdi_gen.agent.agent import Agent
from cdi_gen.config.loader import parse_config
from cdi_gen.config.settings import Settings
from cdi_gen.errors import RegistrationError, SocketInUseError
from cdi_gen.files import file_id
from cdi_gen.kubelet.transport import UnixServer
from tests.agentrun import dra_settings, running_agent
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.drakubelet import FakeDraKubelet
from tests.fakes.kubelet import FakeKubelet
from tests.fakes.source import PipeSource
from tests.waiting import until

pytestmark = pytest.mark.timeout(90)

DRIVER = "example.com"
NODE = "node-1"


def _config(kernel: str) -> dict[str, Any]:
    match = {"subsystem": "block", "kernel": kernel}
    return {"vendor": DRIVER, "classes": [{"name": "loop", "match": match, "api": "dra"}]}


# -- the transport ------------------------------------------------------------------------

#: A process serving an echo service on argv[1] as instance argv[2] until its stdin closes.
HOLDER = """
import sys
from pathlib import Path

import grpc

from cdi_gen.kubelet.transport import UnixServer

echo = grpc.unary_unary_rpc_method_handler(lambda request, _: request)
server = UnixServer(Path(sys.argv[1]), lambda: {"t.T": {"Echo": echo}}, instance=sys.argv[2])
server.start()
print("serving", flush=True)
sys.stdin.read()
"""


def _echo(path: Path, instance: str = "") -> UnixServer:
    echo = grpc.unary_unary_rpc_method_handler(lambda request, _: request)
    return UnixServer(path, lambda: {"t.T": {"Echo": echo}}, instance=instance)


async def _call(path: Path) -> bytes:
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        echo = channel.unary_unary("/t.T/Echo", request_serializer=None, response_deserializer=None)
        answer: bytes = await echo(b"ping", timeout=5)
        return answer


async def test_a_name_another_process_serves_is_never_taken(short_dir: Path) -> None:
    path = short_dir / "a.sock"
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, str(path), "uid-a",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert await asyncio.wait_for(holder.stdout.readline(), 20) == b"serving\n"
        served = file_id(path)
        # A second copy of the same instance: refused in one line naming the socket and rule.
        copy = _echo(path, "uid-a")
        with pytest.raises(SocketInUseError) as refused:
            copy.start()
        message = str(refused.value)
        assert repr(str(path)) in message and "one instance per pod" in message, message
        assert "\n" not in message
        # Another instance, or one without a pod UID (an agent this one replaces, stopping):
        # refused too, with an error its plugin retries.
        for other in ("uid-b", ""):
            with pytest.raises(RegistrationError) as busy:
                _echo(path, other).start()
            assert not isinstance(busy.value, SocketInUseError)
            assert "'uid-a'" in str(busy.value) and "never taken" in str(busy.value)
        # The refused copy's stop touches nothing of the holder's.
        await copy.stop(0)
        assert file_id(path) == served
        assert (short_dir / ".a.sock.lock").is_file()
        assert await _call(path) == b"ping"

        # Killed, the holder leaves its socket and lock file; the kernel dropped its lock:
        # the name is free, and taken.
        holder.kill()
        await holder.wait()
        assert file_id(path) == served
        taker = _echo(path, "uid-a")
        taker.start()
        try:
            assert file_id(path) != served
            assert await _call(path) == b"ping"
        finally:
            await taker.stop(0)
        assert not path.exists() and not (short_dir / ".a.sock.lock").exists()
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()


async def test_a_socket_served_without_the_lock_is_never_unlinked(short_dir: Path) -> None:
    """Something listens on the name without our lock (an older release, another program):
    left alone, and the plugin is told so."""
    path = short_dir / "b.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(str(path))
        other.listen()
        before = file_id(path)
        server = _echo(path, "uid-a")
        with pytest.raises(RegistrationError, match="holds no lock"):
            server.start()
        await server.stop(0)
        assert file_id(path) == before
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(str(path))


@pytest.mark.parametrize("plant", ["symlink", "fifo", "hard link", "folder"])
async def test_something_planted_at_the_locks_name_is_refused_and_kept(
    short_dir: Path, plant: str
) -> None:
    """The lock lives in the kubelet's folder: what is there under its name that is not a
    lock file of its own is neither followed, waited on, written nor removed."""
    path, lock = short_dir / "c.sock", short_dir / ".c.sock.lock"
    target = short_dir / "target"
    target.write_text("keep")
    if plant == "symlink":
        lock.symlink_to(target)
    elif plant == "fifo":
        os.mkfifo(lock)
    elif plant == "hard link":
        os.link(target, lock)
    else:
        lock.mkdir()
    server = _echo(path, "uid-a")
    with pytest.raises(RegistrationError, match=r"lock"):
        server.start()
    await server.stop(0)
    assert target.read_text() == "keep"
    assert lock.is_symlink() or lock.exists()
    assert not path.exists()


# -- the agent ----------------------------------------------------------------------------


def _flat(short_dir: Path, api: FakeApiServer, pod_uid: str) -> dict[str, Any]:
    return dra_settings(short_dir, api.kubeconfig(short_dir), NODE, pod_uid=pod_uid)


@asynccontextmanager
async def _agent(short_dir: Path, api: FakeApiServer, pod_uid: str) -> AsyncIterator[Agent]:
    """The agent in this process, on recorded loop0 and loop1."""
    source = PipeSource.from_data("export-db-vm.txt", only={"loop0", "loop1"})
    settings = Settings(**_flat(short_dir, api, pod_uid))
    agent = Agent(parse_config(_config("loop[0-9]"), "test.yaml"), settings, source=source)
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.started.wait(), 10)
        yield agent
    finally:
        agent.stop()
        await asyncio.wait_for(task, 30)
        source.release()


async def _run(
    short_dir: Path, api: FakeApiServer, pod_uid: str, kernel: str
) -> asyncio.subprocess.Process:
    """``cdi-gen run`` as a process with the pod's environment, on this machine's loop
    devices (kernel events)."""
    config = short_dir / f"config-{pod_uid}.yaml"
    config.write_text(yaml.safe_dump(_config(kernel)))
    env = {f"CDI_GEN_{k.upper()}": str(v) for k, v in _flat(short_dir, api, pod_uid).items()}
    env |= {"CDI_GEN_CONFIG": str(config), "CDI_GEN_UDEV_SOURCE": "kernel"}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cdi_gen", "run",
        env={**os.environ, **env}, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


def _offered(api: FakeApiServer) -> set[str]:
    """The devices our slices list, if they are all of one generation."""
    ours = [s for s in api.slices.values() if s["spec"]["driver"] == DRIVER]
    if len({s["spec"]["pool"]["generation"] for s in ours}) != 1:
        return {"<none or mixed>"}
    return {d["name"] for s in ours for d in (s["spec"].get("devices") or [])}


def _api(api: FakeApiServer) -> FakeApiServer:
    api.nodes[NODE] = str(uuid.uuid4())
    return api


async def test_a_second_copy_of_the_agent_is_refused_and_the_first_keeps_serving(
    short_dir: Path,
) -> None:
    pod_uid = str(uuid.uuid4())
    claim = ("default", "c1", "uid-1")
    async with (
        FakeApiServer() as api,
        FakeDraKubelet(short_dir / "reg") as kubelet,
        _agent(short_dir, _api(api), pod_uid) as first,
    ):
        connection = await kubelet.next_registration(within=10)
        await until(lambda: first.ready()[0], "the first agent ready")
        dra_socket = short_dir / "plugins" / DRIVER / f"dra-{pod_uid}.sock"
        sockets = {p: file_id(p) for p in (dra_socket, connection.socket)}
        registered = short_dir / "plugins" / DRIVER / f"{connection.socket.name}.registered"
        assert registered.exists()

        copy = await _run(short_dir, api, pod_uid, "loop[0-9]")
        _, stderr = await asyncio.wait_for(copy.communicate(), 60)
        errors = [line for line in stderr.decode().splitlines() if line.startswith("error:")]
        assert copy.returncode == 2, stderr.decode()
        assert len(errors) == 1, stderr.decode()
        assert repr(str(dra_socket)) in errors[0] and "one instance per pod" in errors[0]
        assert "Traceback" not in stderr.decode()

        # The first one's names, and the file saying it is registered, are as they were,
        # and its DRA socket answers.
        assert {p: file_id(p) for p in sockets} == sockets
        assert registered.exists()
        answer = await connection.prepare([claim])
        assert "uid-1" in answer.claims  # answered (the claim is unknown to the API server)
        assert first.ready()[0], first.ready()


async def test_a_second_copy_of_a_device_plugin_agent_is_refused_and_the_first_keeps_serving(
    short_dir: Path,
) -> None:
    """The same through a device plugin, whose socket carries no pod UID: the lock says
    whose it is."""
    from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2

    pod_uid = str(uuid.uuid4())
    config = {
        "vendor": DRIVER,
        "classes": [{"name": "loop", "match": {"subsystem": "block", "kernel": "loop[0-7]"}}],
    }
    async with (
        FakeKubelet(short_dir / "dp") as kubelet,
        running_agent(short_dir, config, pod_uid=pod_uid),
    ):
        plugin = await kubelet.next_registration(within=10)
        path = short_dir / "dp" / "example.com-loop.sock"
        served = file_id(path)
        text = yaml.safe_dump(config)
        (short_dir / "dp-config.yaml").write_text(text)
        env = {
            "CDI_GEN_CONFIG": str(short_dir / "dp-config.yaml"),
            "CDI_GEN_SPEC_DIR": str(short_dir / "cdi"),
            "CDI_GEN_DEVICE_PLUGIN_DIR": str(short_dir / "dp"),
            "CDI_GEN_UDEV_SOURCE": "kernel",
            "CDI_GEN_METRICS_ADDRESS": "127.0.0.1:0",
            "CDI_GEN_POD_UID": pod_uid,
        }
        copy = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cdi_gen", "run",
            env={**os.environ, **env}, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, stderr = await asyncio.wait_for(copy.communicate(), 60)
        errors = [line for line in stderr.decode().splitlines() if line.startswith("error:")]
        assert copy.returncode == 2, stderr.decode()
        assert len(errors) == 1 and repr(str(path)) in errors[0], stderr.decode()
        assert file_id(path) == served
        options = await plugin.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
        assert options.get_preferred_allocation_available
        assert not plugin.stream_ended.is_set()


async def test_the_older_agent_publishes_again_when_its_successor_dies(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rolling update: the newer agent (a real process) registers, the older one yields
    the ResourceSlices to it, then the newer one is killed (SIGKILL: its socket files stay).
    The older one takes them back: it publishes its pool again, restores a deletion (a
    kubelet restart deletes the node's slices) and is ready again. Before, it never
    published again and stayed unready. The newer one started again gets them back."""
    from cdi_gen.dra.plugin.server import DraPlugin

    async def no_successor(_plugin: DraPlugin, within: float = 0.0) -> bool:
        return False  # at the older one's stop, no newer pod comes: its wait is not the point

    monkeypatch.setattr(DraPlugin, "hand_over", no_successor)
    older_uid, newer_uid = str(uuid.uuid4()), str(uuid.uuid4())
    yielded = short_dir / "plugins" / DRIVER / f"{DRIVER}-{older_uid}-reg.sock.yielded"
    async with (
        FakeApiServer() as api,
        FakeDraKubelet(short_dir / "reg") as kubelet,
        _agent(short_dir, _api(api), older_uid) as older,
    ):
        await kubelet.next_registration(within=10)
        await until(lambda: _offered(api) == {"loop-loop0", "loop-loop1"}, "the older pool")
        newer = await _run(short_dir, api, newer_uid, "loop7")
        try:
            await kubelet.next_registration(within=30)
            await until(yielded.exists, "the older agent yielding", within=30)
            await until(lambda: _offered(api) == {"loop-loop7"}, "the newer pool", within=30)
            assert not older.ready()[0]
            newer.send_signal(signal.SIGKILL)
            await newer.wait()
        finally:
            if newer.returncode is None:
                newer.kill()
                await newer.wait()
        newer_socket = short_dir / "reg" / f"{DRIVER}-{newer_uid}-reg.sock"
        assert newer_socket.is_socket()  # a kill leaves it: only its silence tells

        await until(lambda: not yielded.exists(), "the older agent taking the slices back")
        await until(lambda: _offered(api) == {"loop-loop0", "loop-loop1"}, "the older pool again")
        await until(lambda: older.ready()[0], "the older agent ready again")
        # A deletion behind its back (a kubelet restart) is repaired: it publishes again.
        for name in list(api.slices):
            api.remove(name)
        await until(lambda: _offered(api) == {"loop-loop0", "loop-loop1"}, "the pool restored")
        assert older.ready()[0], older.ready()

        # The newer pod's container restarted (a crash loop): handed the slices again, once
        # the kubelet registered it anew (what its killed run left says nothing of it).
        again = await _run(short_dir, api, newer_uid, "loop7")
        try:
            await until(yielded.exists, "the older agent yielding again", within=30)
            await until(lambda: _offered(api) == {"loop-loop7"}, "the newer pool again", within=30)
        finally:
            again.kill()
            await again.wait()
