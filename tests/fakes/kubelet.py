"""A fake kubelet that speaks the real device plugin protocol over real unix sockets.

It serves ``v1beta1.Registration`` on ``<plugin dir>/kubelet.sock`` and, inside Register, does
what the kubelet does: check the version and resource name, dial the plugin's socket, read
GetDevicePluginOptions, then open ListAndWatch and keep reading it. Every ListAndWatch
message lands in the plugin's ``updates`` queue, every accepted RegisterRequest in
``registered``. :meth:`FakeKubelet.restart` behaves like a kubelet restart: the old
connections break, every socket in the folder is removed and a new ``kubelet.sock`` appears.

Use it as ``async with FakeKubelet(folder) as kubelet:`` or with start/stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from cdi_gen.errors import InvalidNameError
from cdi_gen.names import validate_resource_name

SUPPORTED_VERSIONS = ("v1beta1",)


@dataclass
class ConnectedPlugin:
    """One registered plugin as the kubelet holds it: its connection and its device stream."""

    request: api_pb2.RegisterRequest
    channel: grpc.aio.Channel
    stub: api_pb2_grpc.DevicePluginAsyncStub
    options: api_pb2.DevicePluginOptions
    #: Every ListAndWatch message, in order.
    updates: asyncio.Queue[api_pb2.ListAndWatchResponse] = field(default_factory=asyncio.Queue)
    #: Set when ListAndWatch ended; ``stream_error`` holds the status if it was not OK.
    stream_ended: asyncio.Event = field(default_factory=asyncio.Event)
    stream_error: grpc.aio.AioRpcError | None = None
    task: asyncio.Task[None] | None = None

    async def next_devices(self, within: float = 5.0) -> dict[str, api_pb2.Device]:
        """The next ListAndWatch message as {ID: Device}."""
        message = await asyncio.wait_for(self.updates.get(), within)
        return {d.ID: d for d in message.devices}

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.channel.close(None)


class FakeKubelet:
    """A Registration server on ``<plugin_dir>/kubelet.sock`` that connects back to plugins."""

    def __init__(self, plugin_dir: Path, *, dial_timeout: float = 10.0) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.socket = self.plugin_dir / "kubelet.sock"
        self.dial_timeout = dial_timeout
        #: Every RegisterRequest the fake received, accepted or not.
        self.requests: list[api_pb2.RegisterRequest] = []
        #: Accepted registrations, in order.
        self.registered: asyncio.Queue[ConnectedPlugin] = asyncio.Queue()
        #: The newest connection per resource name (a new registration replaces the old).
        self.plugins: dict[str, ConnectedPlugin] = {}
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Stop serving and drop every plugin connection (their streams are cancelled)."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0)
        plugins, self.plugins = list(self.plugins.values()), {}
        for plugin in plugins:
            await plugin.close()
        self.socket.unlink(missing_ok=True)

    async def restart(self) -> None:
        """Stop, remove every socket in the folder as a starting kubelet does, start again."""
        await self.stop()
        for entry in os.scandir(self.plugin_dir):
            if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                os.unlink(entry.path)
        await self.start()

    async def next_registration(self, within: float = 5.0) -> ConnectedPlugin:
        return await asyncio.wait_for(self.registered.get(), within)

    async def __aenter__(self) -> FakeKubelet:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _connect(self, request: api_pb2.RegisterRequest) -> ConnectedPlugin:
        channel = grpc.aio.insecure_channel(f"unix://{self.plugin_dir / request.endpoint}")
        try:
            await asyncio.wait_for(channel.channel_ready(), self.dial_timeout)
            stub = api_pb2_grpc.DevicePluginStub(channel)
            options = await stub.GetDevicePluginOptions(api_pb2.Empty())
        except BaseException:
            await channel.close(None)
            raise
        plugin = ConnectedPlugin(request, channel, stub, options)
        plugin.task = asyncio.create_task(_pipe_stream(plugin))
        return plugin


async def _pipe_stream(plugin: ConnectedPlugin) -> None:
    try:
        async for message in plugin.stub.ListAndWatch(api_pb2.Empty()):
            await plugin.updates.put(message)
    except grpc.aio.AioRpcError as exc:
        plugin.stream_error = exc
    finally:
        plugin.stream_ended.set()


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.Empty:
        kubelet = self.kubelet
        kubelet.requests.append(request)
        if request.version not in SUPPORTED_VERSIONS:
            await context.abort(
                grpc.StatusCode.UNKNOWN,
                f"requested API version {request.version!r} is not supported by kubelet. "
                f"Supported version is {SUPPORTED_VERSIONS[0]!r}",
            )
        try:
            validate_resource_name(request.resource_name)
        except InvalidNameError:
            await context.abort(
                grpc.StatusCode.UNKNOWN, f"the ResourceName {request.resource_name!r} is invalid"
            )
        try:
            plugin = await kubelet._connect(request)
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            await context.abort(grpc.StatusCode.UNKNOWN, f"failed to dial device plugin: {exc}")
        old = kubelet.plugins.pop(request.resource_name, None)
        if old is not None:
            await old.close()
        kubelet.plugins[request.resource_name] = plugin
        await kubelet.registered.put(plugin)
        return api_pb2.Empty()
