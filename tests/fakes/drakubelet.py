"""A kubelet stand-in for DRA drivers: its plugin watcher and DRA client, over real gRPC.

It watches a plugins_registry folder (polling; the kubelet uses inotify, the effect is the
same), and for each new socket file does what the kubelet's plugin watcher does: dial it,
call ``GetInfo``, check the answer (type ``DRAPlugin``, a DNS-subdomain name, an endpoint,
a DRAPlugin service it speaks, taking the first of the plugin's list it knows), then call
``NotifyRegistrationStatus`` with the outcome. A socket re-created under the same name is
registered again; a removed one is forgotten. Two instances of one driver on distinct
endpoints (a rolling update) are both kept, as kubelets from 1.33 keep them. Accepted plugins
land in ``registered`` as :class:`DraConnection`, which calls NodePrepareResources /
NodeUnprepareResources with the chosen version and reads NodeWatchResources of the health
service picked as the kubelet picks it: the first of its own list (``v1`` then ``v1alpha1``
for 1.37, ``v1alpha1`` alone before) that the plugin lists.

:meth:`FakeDraKubelet.restart` behaves like a kubelet restart: connections break, everything
known is forgotten, and the existing sockets are registered again (the plugin watcher walks
the folder when it starts; it does not remove the sockets in it).

:meth:`FakeDraKubelet.stop` ends the plugin watcher within :data:`STOP_SECONDS`, or fails saying
where it is: the watcher also stops at its next pass once told, because a cancel can be lost on
Python 3.11 (``asyncio.wait_for`` returns the inner result when it ends in the turn the cancel
lands in; grpc.aio reports a call cancelled as it ended by its outcome), and a stop that only
cancelled and then waited for the watcher hung the test while it kept polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

import grpc

from cdi_gen._proto.dra.v1 import api_pb2 as dra_v1
from cdi_gen._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from cdi_gen._proto.drahealth.v1 import api_pb2 as health_v1
from cdi_gen._proto.drahealth.v1alpha1 import api_pb2 as health_pb
from cdi_gen._proto.pluginregistration.v1 import api_pb2 as reg_pb
from cdi_gen.names import is_dns_subdomain

#: What a 1.34+ kubelet speaks, best first.
KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
#: The health services a 1.37 kubelet knows, best first; a 1.31-1.36 kubelet knows the second.
KUBELET_HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
_HEALTH_MODULES: dict[str, ModuleType] = {
    "v1.DRAResourceHealth": health_v1,
    "v1alpha1.DRAResourceHealth": health_pb,
}
_MODULES: dict[str, ModuleType] = {"v1.DRAPlugin": dra_v1, "v1beta1.DRAPlugin": dra_v1beta1}
_PACKAGES = {
    "v1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    "v1beta1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
}

Claim = tuple[str, str, str]  # namespace, name, uid

#: Longest a stop waits for the plugin watcher to end (a registration in flight ends within
#: ``dial_timeout`` per call; a stuck watcher is a bug of the fake, named when it happens).
STOP_SECONDS = 15.0


@dataclass
class DraConnection:
    """One registered DRA plugin as the kubelet holds it."""

    socket: Path
    info: reg_pb.PluginInfo
    service: str
    channel: grpc.aio.Channel
    #: The health service this kubelet picked ("" when the plugin lists none it knows).
    health_service: str = ""
    #: Every NodeWatchResources message, in order (once :meth:`watch_health` ran).
    health: asyncio.Queue[health_pb.NodeWatchResourcesResponse] = field(
        default_factory=asyncio.Queue
    )
    health_ended: asyncio.Event = field(default_factory=asyncio.Event)
    health_error: grpc.aio.AioRpcError | None = None
    _health_task: asyncio.Task[None] | None = None

    @property
    def messages(self) -> ModuleType:
        return _MODULES[self.service]

    def _call(self, method: str, response: Any) -> Any:
        return self.channel.unary_unary(
            f"/{_PACKAGES[self.service]}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,
        )

    async def prepare(self, claims: Sequence[Claim], within: float = 10.0) -> Any:
        pb = self.messages
        request = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        call = self._call("NodePrepareResources", pb.NodePrepareResourcesResponse)
        return await call(request, timeout=within)

    async def unprepare(self, claims: Sequence[Claim], within: float = 10.0) -> Any:
        pb = self.messages
        request = pb.NodeUnprepareResourcesRequest(
            claims=[pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        call = self._call("NodeUnprepareResources", pb.NodeUnprepareResourcesResponse)
        return await call(request, timeout=within)

    def watch_health(self) -> None:
        """Open NodeWatchResources; its messages land in ``health``."""
        if not self.health_service:
            raise AssertionError(
                f"the plugin offers no health service this kubelet knows: "
                f"{list(self.info.supported_versions)}"
            )
        self._health_task = asyncio.create_task(self._pipe_health())

    async def next_health(self, within: float = 5.0) -> dict[str, health_pb.DeviceHealth]:
        """The next health message as {device name: DeviceHealth}."""
        message = await asyncio.wait_for(self.health.get(), within)
        return {d.device.device_name: d for d in message.devices}

    async def _pipe_health(self) -> None:
        pb = _HEALTH_MODULES[self.health_service]
        stream = self.channel.unary_stream(
            f"/{self.health_service}/NodeWatchResources",
            request_serializer=lambda m: m.SerializeToString(),
            # Read as the picked version's message, then kept as v1alpha1's: the fields are
            # the same, and the tests compare against one set of enum values.
            response_deserializer=pb.NodeWatchResourcesResponse.FromString,
        )
        try:
            async for message in stream(pb.NodeWatchResourcesRequest()):
                await self.health.put(
                    health_pb.NodeWatchResourcesResponse.FromString(message.SerializeToString())
                )
        except grpc.aio.AioRpcError as exc:
            self.health_error = exc
        finally:
            self.health_ended.set()

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        await self.channel.close(None)


def _socket_id(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class FakeDraKubelet:
    """The plugin watcher over ``registry_dir`` and the DRA client of the accepted plugins."""

    def __init__(
        self,
        registry_dir: Path,
        *,
        services: Sequence[str] = KUBELET_SERVICES,
        health_services: Sequence[str] = KUBELET_HEALTH_SERVICES,
        refuse: str | None = None,
        poll_interval: float = 0.02,
        dial_timeout: float = 5.0,
    ) -> None:
        self.registry_dir = Path(registry_dir)
        self.services = tuple(services)
        self.health_services = tuple(health_services)
        #: When set, every plugin is refused with this error (after a valid GetInfo).
        self.refuse = refuse
        self.poll_interval = poll_interval
        self.dial_timeout = dial_timeout
        #: Every PluginInfo received, accepted or not.
        self.infos: list[reg_pb.PluginInfo] = []
        #: Every (socket, registered, error) notified.
        self.notified: list[tuple[Path, bool, str]] = []
        self.registered: asyncio.Queue[DraConnection] = asyncio.Queue()
        #: The newest connection per driver name, and the older instances' kept beside them.
        self.plugins: dict[str, DraConnection] = {}
        self.older: list[DraConnection] = []
        #: Passes over the registry folder completed: a test waits for it to move on to know
        #: that a socket replaced before that moment would have been seen (and registered).
        self.scans = 0
        self._known: dict[Path, tuple[int, int, int]] = {}
        self._task: asyncio.Task[None] | None = None
        #: Set by stop() for the watcher it ends: looked at on each pass (see the module
        #: docstring: a cancel alone may be lost).
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._stopping = asyncio.Event()
        self._task = asyncio.create_task(self._watch(self._stopping))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            self._stopping.set()
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=STOP_SECONDS)
            if not done:
                raise AssertionError(
                    f"the fake kubelet's plugin watcher did not stop within {STOP_SECONDS:g}s: "
                    f"{task!r}"
                )
            error = None if task.cancelled() else task.exception()
            if error is not None:
                raise error  # what the watcher failed with, as awaiting it raised
        plugins, self.plugins = [*self.plugins.values(), *self.older], {}
        self.older = []
        for plugin in plugins:
            await plugin.close()
        self._known.clear()

    async def restart(self) -> None:
        """A kubelet restart: drop every connection and registration, walk the folder anew."""
        await self.stop()
        await self.start()

    async def next_registration(self, within: float = 5.0) -> DraConnection:
        return await asyncio.wait_for(self.registered.get(), within)

    async def __aenter__(self) -> FakeDraKubelet:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _watch(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            present: dict[Path, tuple[int, int, int]] = {}
            for entry in sorted(self.registry_dir.iterdir()):
                ident = _socket_id(entry)
                if ident is not None:
                    present[entry] = ident
            for path in [p for p in self._known if p not in present]:
                del self._known[path]  # deregistered: the plugin removed its socket
            for path, ident in present.items():
                if self._known.get(path) != ident and not stopping.is_set():
                    self._known[path] = ident
                    await self._register(path)
            self.scans += 1
            await asyncio.sleep(self.poll_interval)

    async def _register(self, socket: Path) -> None:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            get_info = channel.unary_unary(
                "/pluginregistration.Registration/GetInfo",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=reg_pb.PluginInfo.FromString,
            )
            notify = channel.unary_unary(
                "/pluginregistration.Registration/NotifyRegistrationStatus",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=reg_pb.RegistrationStatusResponse.FromString,
            )
            try:
                info = await get_info(reg_pb.InfoRequest(), timeout=self.dial_timeout)
            except grpc.aio.AioRpcError:
                return  # a socket nobody serves (yet): the kubelet retries on the next event
            self.infos.append(info)
            error, connection = await self._validate(socket, info)
            self.notified.append((socket, error is None, error or ""))
            await notify(
                reg_pb.RegistrationStatus(plugin_registered=error is None, error=error or ""),
                timeout=self.dial_timeout,
            )
        if connection is not None:
            old = self.plugins.pop(info.name, None)
            if old is not None and old.info.endpoint != info.endpoint:
                # Another instance of the driver (a rolling update): kubelets >= 1.33 keep
                # both, the newest first.
                self.older.append(old)
            elif old is not None:
                await old.close()
            self.plugins[info.name] = connection
            await self.registered.put(connection)

    def _refusal(self, info: reg_pb.PluginInfo) -> str | None:
        """Why the kubelet would not accept ``info``; None when it would."""
        if info.type != "DRAPlugin":
            return f"no handler registered for plugin type: {info.type}"
        if not is_dns_subdomain(info.name):
            return f"invalid DRA driver name {info.name!r}"
        if not info.endpoint:
            return "no endpoint"
        if not any(s in self.services for s in info.supported_versions):
            return (
                f"none of services supported by the plugin ({list(info.supported_versions)}) "
                f"are supported by the kubelet ({list(self.services)})"
            )
        return self.refuse

    async def _validate(
        self, socket: Path, info: reg_pb.PluginInfo
    ) -> tuple[str | None, DraConnection | None]:
        refusal = self._refusal(info)
        if refusal is not None:
            return refusal, None
        chosen = next(s for s in info.supported_versions if s in self.services)
        channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
        try:
            # A cancel scope, not wait_for: on 3.11 that one can take a stop's cancel for
            # the dial's success (see the module docstring).
            async with asyncio.timeout(self.dial_timeout):
                await channel.channel_ready()
        except TimeoutError:
            await channel.close(None)
            return f"cannot connect to the DRA endpoint {info.endpoint}", None
        health = next((s for s in self.health_services if s in info.supported_versions), "")
        return None, DraConnection(socket, info, chosen, channel, health)
