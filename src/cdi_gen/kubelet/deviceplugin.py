"""The kubelet device plugin of one device class: the only module that imports grpc.

One :class:`DevicePlugin` serves ``deviceplugin/v1beta1`` for ``<vendor>/<class>`` on
``<plugin dir>/<vendor>-<class>.sock`` (grpc.aio, on the caller's event loop) and registers
it with the kubelet. It advertises what the :class:`~cdi_gen.kubelet.board.DeviceBoard`
holds (device ID = CDI device name) and answers Allocate with CDI device names only, after
checking that every name resolves in the spec folders the way the runtime will resolve it.

Lifecycle, as the kubelet expects it: serve first, then Register in the background (the
kubelet calls GetDevicePluginOptions back while Register is in flight). A watcher polls the
socket files; when our socket disappears or ``kubelet.sock`` is re-created (a kubelet restart
does both) the server is restarted on a fresh socket and registered again, with backoff while
the kubelet is absent. :meth:`DevicePlugin.stop` ends every stream, stops the server with a
short grace and removes the socket.

What the answers contain is decided by the pure functions of :mod:`cdi_gen.kubelet.allocation`;
this module only maps them to messages and status codes. No handler lets an exception out
(gRPC would turn it into ``UNKNOWN``): refusals become ``INVALID_ARGUMENT`` or
``FAILED_PRECONDITION``, anything unexpected ``INTERNAL``, each with a message naming the
resource.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import stat
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol

import grpc

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from cdi_gen.errors import ConfigError, RegistrationError
from cdi_gen.kubelet.allocation import (
    AllocationError,
    PhysicalPolicy,
    Refusal,
    build_cdi_annotations,
    check_id_lengths,
    check_request,
    preferred_allocation,
)
from cdi_gen.kubelet.board import DeviceBoard
from cdi_gen.model import AdvertisedDevice
from cdi_gen.modes import SOCKET_MODE, umask
from cdi_gen.names import validate_cdi_kind_as_resource
from cdi_gen.paths import DEVICE_PLUGIN_DIR, KUBELET_SOCKET_NAME

__all__ = [
    "API_VERSION",
    "HEALTHY",
    "UNHEALTHY",
    "DevicePlugin",
    "SpecResolver",
]

log = logging.getLogger(__name__)

#: The kubelet's fixed device plugin directory (not moved by ``--root-dir``).
API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
#: sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107

_STATUS = {
    Refusal.UNKNOWN: grpc.StatusCode.INVALID_ARGUMENT,
    Refusal.DUPLICATE: grpc.StatusCode.INVALID_ARGUMENT,
    Refusal.UNHEALTHY: grpc.StatusCode.FAILED_PRECONDITION,
    Refusal.UNRESOLVED: grpc.StatusCode.FAILED_PRECONDITION,
    Refusal.SAME_PHYSICAL: grpc.StatusCode.INVALID_ARGUMENT,
    Refusal.TOO_LONG: grpc.StatusCode.INVALID_ARGUMENT,
}
#: Longest status message sent (and logged): gRPC refuses metadata over 16 KiB, which
#: the caller would see as RESOURCE_EXHAUSTED instead of our answer.
MAX_STATUS_CHARS = 1024


def _clip(text: str) -> str:
    if len(text) <= MAX_STATUS_CHARS:
        return text
    return f"{text[:MAX_STATUS_CHARS]}... ({len(text) - MAX_STATUS_CHARS} more characters)"


class SpecResolver(Protocol):
    """What Allocate needs from :class:`cdi_gen.cdi.registry.SpecCache`."""

    def unresolved(self, qualified_names: Iterable[str]) -> list[str]:
        """One message per name a runtime could not resolve; empty when all resolve."""
        ...


#: ``on_allocate(outcome, reason)``: outcome ``"ok"`` or ``"error"``; reason ``""``, a
#: :class:`~cdi_gen.kubelet.allocation.Refusal` value or ``"internal"``.
AllocateHook = Callable[[str, str], None]
#: ``on_register(ok, error)``: error is ``""`` on success, else why the kubelet said no.
RegisterHook = Callable[[bool, str], None]

#: Longest an Allocate waits for the spec folders to be read (a scan reads at most a capped
#: amount per file; this bounds a hung filesystem).
SPEC_CHECK_SECONDS = 5.0


@functools.cache
def _spec_scans() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cdi-gen-spec-scan")


_FileId = tuple[int, int, int]
_Outcome = Literal["ok", "failed", "interrupted"]
_Context = grpc.aio.ServicerContext[Any, Any]


def _file_id(path: Path) -> _FileId | None:
    """Identity of the file at ``path``; a re-created file differs even if its inode is reused."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class DevicePlugin:
    """Device plugin server and kubelet registration for one CDI kind ``<vendor>/<class>``.

    ``board`` supplies the advertised devices, ``spec_cache`` resolves qualified CDI names
    before Allocate answers. With ``cdi_annotations`` each container response also carries a
    ``cdi.k8s.io/`` annotation for runtimes that read only those. ``physical_policy`` says how
    GetPreferredAllocation places slots of shared devices (``spread`` over physical devices or
    ``pack`` onto the fullest); ``one_slot_per_device`` refuses a container request holding two
    slots of one physical device. ``on_allocate`` and
    ``on_register`` are called on the loop for metrics; their exceptions are logged and
    ignored. ``watch_interval`` is how often the socket files are checked for a kubelet
    restart, ``register_timeout`` bounds each Register call and ``max_backoff`` the wait
    between failed registrations.

    The constructor raises :class:`~cdi_gen.errors.InvalidNameError` when ``vendor/class`` is
    not both a CDI kind and a Kubernetes extended resource name, and
    :class:`~cdi_gen.errors.ConfigError` when the socket path is too long for a unix socket.
    """

    def __init__(
        self,
        vendor: str,
        cls: str,
        board: DeviceBoard,
        spec_cache: SpecResolver,
        *,
        plugin_dir: Path = DEVICE_PLUGIN_DIR,
        kubelet_socket: Path | None = None,
        cdi_annotations: bool = False,
        physical_policy: PhysicalPolicy = "pack",
        one_slot_per_device: bool = False,
        on_allocate: AllocateHook | None = None,
        on_register: RegisterHook | None = None,
        watch_interval: float = 0.15,
        register_timeout: float = 10.0,
        max_backoff: float = 2.0,
    ) -> None:
        self.resource_name = validate_cdi_kind_as_resource(vendor, cls)
        self.vendor = vendor
        self.cls = cls
        self.board = board
        self.spec_cache = spec_cache
        self.socket_path = Path(plugin_dir) / f"{vendor}-{cls}.sock"
        self.kubelet_socket = kubelet_socket or Path(plugin_dir) / KUBELET_SOCKET_NAME
        for path in (self.socket_path, self.kubelet_socket):
            if len(os.fsencode(path)) > MAX_SOCKET_PATH:
                raise ConfigError(
                    f"unix socket path {str(path)!r} is longer than {MAX_SOCKET_PATH} bytes"
                )
        self.cdi_annotations = cdi_annotations
        self.physical_policy: PhysicalPolicy = physical_policy
        self.one_slot_per_device = one_slot_per_device
        self._on_allocate = on_allocate
        self._on_register = on_register
        self._watch_interval = watch_interval
        self._register_timeout = register_timeout
        self._max_backoff = max_backoff
        self._server: grpc.aio.Server | None = None
        self._servicer: _Servicer | None = None
        self._socket_id: _FileId | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._registered = asyncio.Event()
        self._list_cache: tuple[int, api_pb2.ListAndWatchResponse | None] = (-1, None)
        self._wire_devices: dict[AdvertisedDevice, api_pb2.Device] = {}
        #: Successful registrations so far (a kubelet restart adds one).
        self.registrations = 0

    @property
    def endpoint(self) -> str:
        """The socket file name sent to the kubelet (relative to the plugin directory)."""
        return self.socket_path.name

    @property
    def options(self) -> api_pb2.DevicePluginOptions:
        """The DevicePluginOptions sent in Register and answered by GetDevicePluginOptions."""
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    async def start(self) -> None:
        """Serve on the socket, then register with the kubelet in the background.

        Returns as soon as the server accepts calls; registration retries until it succeeds
        and repeats after every kubelet restart (see :meth:`wait_registered`). Raises
        :class:`~cdi_gen.errors.RegistrationError` when the socket cannot be created (the
        path holds something that is not a socket, or bind fails).
        """
        if self._supervisor is not None:
            return
        await self._serve()
        self._supervisor = asyncio.create_task(
            self._supervise(), name=f"device plugin {self.resource_name}"
        )

    async def stop(self, grace: float = 1.0) -> None:
        """Stop registering, end every ListAndWatch stream, stop serving, remove the socket.

        In-flight unary calls get ``grace`` seconds. Never raises for an already stopped
        plugin.
        """
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        await self._shutdown_server(grace)
        self._registered.clear()

    async def wait_registered(self) -> None:
        """Wait until the kubelet has accepted the current registration."""
        await self._registered.wait()

    async def __aenter__(self) -> DevicePlugin:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- serving ---------------------------------------------------------------------------

    async def _serve(self) -> None:
        path = self.socket_path
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise RegistrationError(f"cannot serve on {str(path)!r}: {exc}") from exc
        else:
            if not stat.S_ISSOCK(st.st_mode):
                raise RegistrationError(
                    f"{str(path)!r} exists and is not a socket; refusing to replace it"
                )
            # Left by an earlier run, or by the instance we replace: the newest server
            # takes the name, as the kubelet keeps only the newest registration anyway.
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                raise RegistrationError(f"cannot remove stale {str(path)!r}: {exc}") from exc
        server = grpc.aio.server()
        servicer = _Servicer(self)
        api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)
        try:
            # Binding creates the socket file: with the umask the launcher gave us (000)
            # any local user could call Allocate.
            with umask(0o777 & ~SOCKET_MODE):
                server.add_insecure_port(f"unix://{path}")
        except RuntimeError as exc:
            raise RegistrationError(f"cannot serve on {str(path)!r}: {exc}") from exc
        # Recorded before start so that a cancelled start is still stopped by stop().
        self._server, self._servicer = server, servicer
        await server.start()
        self._socket_id = _file_id(path)
        log.info("serving %s on %s", self.resource_name, path)

    async def _shutdown_server(self, grace: float) -> None:
        server, self._server = self._server, None
        servicer, self._servicer = self._servicer, None
        if servicer is not None:
            servicer.stopping.set()
        if server is not None:
            await server.stop(grace)
        # grpc unlinks the socket itself; make sure, but never touch a newer file.
        if self._socket_id is not None and _file_id(self.socket_path) == self._socket_id:
            self.socket_path.unlink(missing_ok=True)
        self._socket_id = None

    async def _restart_server(self) -> None:
        await self._shutdown_server(grace=0.2)
        await self._serve()

    # -- registration ------------------------------------------------------------------------

    async def _supervise(self) -> None:
        initial = min(0.1, self._max_backoff)
        delay = initial
        fresh_server = False
        while True:
            try:
                outcome, kubelet_id = await self._register_once(fresh_server)
                fresh_server = False
            except Exception as exc:
                # Serving failed (folder gone, bind refused...): keep trying, the kubelet
                # folder may come back; the hook lets the agent decide to give up.
                log.error("device plugin %s cannot serve: %s", self.resource_name, exc)
                self._call_hook(self._on_register, False, str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_backoff)
                continue
            if outcome == "interrupted":
                # The kubelet restarted while Register was in flight: its answer no longer
                # matters (it may never come, the kubelet dialling a socket it wiped).
                log.info("kubelet restarted during Register; serving %s again", self.resource_name)
                fresh_server = True
                continue
            restarted = functools.partial(self._kubelet_restarted, kubelet_id)
            if outcome == "failed":
                # Retry after the backoff, or at once when kubelet.sock is no longer the one
                # just tried. Its identity was taken before the attempt: read after the
                # failure it could already be the new kubelet's, which would then look
                # unchanged and cost the whole backoff.
                await self._poll(restarted, delay)
                delay = min(delay * 2, self._max_backoff)
                continue
            delay = initial
            await self._poll(restarted)
            log.info("kubelet restarted; serving %s again", self.resource_name)
            self._registered.clear()
            fresh_server = True

    async def _register_once(self, fresh_server: bool) -> tuple[_Outcome, _FileId | None]:
        """Serve anew if asked or if our socket is gone, wait for kubelet.sock, Register.

        Return the outcome and the identity of the kubelet.sock tried, read before the
        attempt: ``ok``, ``failed`` (the kubelet said no or was unreachable) or
        ``interrupted`` (our socket or kubelet.sock was replaced while Register was in
        flight). Raises :class:`RegistrationError` when the socket cannot be served.
        """
        if fresh_server or self._server is None or _file_id(self.socket_path) != self._socket_id:
            await self._restart_server()
        await self._poll(lambda: _file_id(self.kubelet_socket) is not None)
        kubelet_id = _file_id(self.kubelet_socket)
        register = asyncio.ensure_future(self._register())
        watch = asyncio.ensure_future(
            self._poll(functools.partial(self._kubelet_restarted, kubelet_id))
        )
        try:
            await asyncio.wait({register, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not register.done():
                register.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            with contextlib.suppress(asyncio.CancelledError):
                await register
        if register.cancelled():
            self._registered.clear()
            return "interrupted", kubelet_id
        error = register.result()
        self._call_hook(self._on_register, error is None, error or "")
        if error is not None:
            log.warning(
                "registering %s with %s failed: %s", self.resource_name, self.kubelet_socket, error
            )
            return "failed", kubelet_id
        self.registrations += 1
        self._registered.set()
        log.info("registered %s with the kubelet", self.resource_name)
        return "ok", kubelet_id

    def _kubelet_restarted(self, registered_with: _FileId | None) -> bool:
        if _file_id(self.socket_path) != self._socket_id:
            return True
        current = _file_id(self.kubelet_socket)
        return current is not None and current != registered_with

    async def _poll(self, done: Callable[[], bool], limit: float | None = None) -> None:
        """Return when ``done()`` holds (checked every watch interval) or ``limit`` s pass."""
        loop = asyncio.get_running_loop()
        deadline = None if limit is None else loop.time() + limit
        while not done():
            left = self._watch_interval if deadline is None else deadline - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(left, self._watch_interval))

    async def _register(self) -> str | None:
        """Call Register once; return why it failed, or None."""
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.endpoint,
            resource_name=self.resource_name,
            options=self.options,
        )
        try:
            async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                stub = api_pb2_grpc.RegistrationStub(channel)
                await stub.Register(request, timeout=self._register_timeout)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        except Exception as exc:
            log.exception("unexpected failure registering %s", self.resource_name)
            return f"{type(exc).__name__}: {exc}"
        return None

    # -- answers -----------------------------------------------------------------------------

    def list_response(self) -> api_pb2.ListAndWatchResponse:
        """The ListAndWatchResponse for the board's current devices (shared by all streams)."""
        version, response = self._list_cache
        if version != self.board.version or response is None:
            # Building a Device message costs more than copying one; most publishes change
            # a few devices out of many, so unchanged devices reuse their message.
            known, wires = self._wire_devices, {}
            for device in self.board.devices.values():
                wires[device] = known.get(device) or _wire_device(device)
            self._wire_devices = wires
            response = api_pb2.ListAndWatchResponse(devices=wires.values())
            self._list_cache = (self.board.version, response)
        return response

    async def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        """Build the AllocateResponse; raise :class:`AllocationError` when a rule fails.

        Works on one snapshot of the board, so a concurrent publish cannot mix two lists.
        """
        devices = self.board.devices
        kind = self.resource_name
        per_container: list[list[str]] = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            check_request(ids, devices, kind, one_per_physical=self.one_slot_per_device)
            per_container.append([f"{kind}={device_id}" for device_id in ids])
        problems = await self._unresolved([n for names in per_container for n in names])
        if problems:
            raise AllocationError(
                Refusal.UNRESOLVED,
                "",
                f"CDI devices of resource {kind} do not resolve: " + "; ".join(problems),
            )
        response = api_pb2.AllocateResponse()
        for names in per_container:
            answer = response.container_responses.add()
            answer.cdi_devices.extend(api_pb2.CDIDevice(name=n) for n in names)
            if self.cdi_annotations and names:
                answer.annotations.update(build_cdi_annotations(self.vendor, self.cls, names))
        return response

    async def _unresolved(self, qualified_names: list[str]) -> list[str]:
        """The spec folder check: from the cache when no folder changed, else on a worker
        thread and within :data:`SPEC_CHECK_SECONDS`.

        Folder reads stay off the event loop, so a slow or hostile folder cannot stall the
        other classes' Allocate, ListAndWatch or /healthz; one worker for all plugins, so a
        stuck scan holds one thread and later checks time out instead of piling up.
        """
        # The common case, nothing changed in the folders, is answered here: a bounded stat
        # scan, no file read (a thread hop would cost a third of Allocate's time).
        fast = getattr(self.spec_cache, "unresolved_if_fresh", None)
        answer: list[str] | None = fast(qualified_names) if fast is not None else None
        if answer is not None:
            return answer
        loop = asyncio.get_running_loop()
        scan = loop.run_in_executor(_spec_scans(), self.spec_cache.unresolved, qualified_names)
        try:
            return await asyncio.wait_for(scan, SPEC_CHECK_SECONDS)
        except TimeoutError:
            raise AllocationError(
                Refusal.UNRESOLVED,
                "",
                f"CDI devices of resource {self.resource_name} cannot be checked: the spec "
                f"folders were not read within {SPEC_CHECK_SECONDS:g}s",
            ) from None

    def preferred(
        self, request: api_pb2.PreferredAllocationRequest
    ) -> api_pb2.PreferredAllocationResponse:
        """Build the PreferredAllocationResponse (one answer per container request)."""
        devices: Mapping[str, AdvertisedDevice] = self.board.devices
        response = api_pb2.PreferredAllocationResponse()
        for container in request.container_requests:
            check_id_lengths(container.available_deviceIDs, self.resource_name)
            check_id_lengths(container.must_include_deviceIDs, self.resource_name)
            ids = preferred_allocation(
                container.available_deviceIDs,
                container.must_include_deviceIDs,
                container.allocation_size,
                devices,
                physical=self.physical_policy,
            )
            response.container_responses.add().deviceIDs.extend(ids)
        return response

    def _call_hook(self, hook: Callable[[Any, Any], None] | None, *args: Any) -> None:
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:
            log.exception("device plugin hook %r failed", hook)


def _wire_device(device: AdvertisedDevice) -> api_pb2.Device:
    wire = api_pb2.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY)
    if device.numa_node is not None:
        wire.topology.nodes.add(ID=device.numa_node)
    return wire


class _Servicer(api_pb2_grpc.DevicePluginServicer):
    """The DevicePlugin service of one server generation; ``stopping`` ends its streams."""

    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin
        self.stopping = asyncio.Event()

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: _Context
    ) -> api_pb2.DevicePluginOptions:
        return self.plugin.options

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: _Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        plugin, board = self.plugin, self.plugin.board
        stopped = asyncio.ensure_future(self.stopping.wait())
        try:
            while not self.stopping.is_set():
                seen = board.version
                try:
                    response = plugin.list_response()
                except Exception as exc:
                    log.exception("building the device list of %s failed", plugin.resource_name)
                    await context.abort(
                        grpc.StatusCode.INTERNAL,
                        _clip(f"device list of resource {plugin.resource_name} failed: {exc}"),
                    )
                yield response
                if board.closed:
                    return
                newer = asyncio.ensure_future(board.wait_newer(seen))
                try:
                    await asyncio.wait({newer, stopped}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    newer.cancel()
                if board.closed:
                    return
        finally:
            stopped.cancel()

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: _Context
    ) -> api_pb2.PreferredAllocationResponse:
        plugin = self.plugin
        try:
            return plugin.preferred(request)
        except AllocationError as refused:
            log.info("preferred allocation refused: %s", _clip(refused.message))
            await context.abort(_STATUS[refused.reason], _clip(refused.message))
        except Exception as exc:
            log.exception("preferred allocation for %s failed", plugin.resource_name)
            await context.abort(
                grpc.StatusCode.INTERNAL,
                _clip(f"preferred allocation for resource {plugin.resource_name} failed: {exc}"),
            )

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: _Context
    ) -> api_pb2.AllocateResponse:
        plugin = self.plugin
        try:
            response = await plugin.allocate(request)
        except AllocationError as refused:
            plugin._call_hook(plugin._on_allocate, "error", str(refused.reason))
            log.info("allocate refused: %s", _clip(refused.message))
            await context.abort(_STATUS[refused.reason], _clip(refused.message))
        except Exception as exc:
            plugin._call_hook(plugin._on_allocate, "error", "internal")
            log.exception("allocate for %s failed", plugin.resource_name)
            await context.abort(
                grpc.StatusCode.INTERNAL,
                _clip(f"allocate for resource {plugin.resource_name} failed: {exc}"),
            )
        plugin._call_hook(plugin._on_allocate, "ok", "")
        return response

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: _Context
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()
