"""The kubelet device plugin (``deviceplugin/v1beta1``) of one device class.

One :class:`DevicePlugin` serves ``<vendor>/<class>`` on ``<plugin dir>/<vendor>-<class>.sock``
and registers it by calling ``Register`` on ``kubelet.sock``; the
:class:`~cdi_gen.kubelet.supervisor.Supervisor` keeps it served and registered across kubelet
restarts. It advertises what the :class:`~cdi_gen.deviceplugin.board.DeviceBoard` holds (device
ID = CDI device name) and answers Allocate with CDI device names only, after checking that
every name resolves in the spec folders the way the runtime will resolve it.

Calls are served on the gRPC server's threads (see :mod:`~cdi_gen.kubelet.transport`):
Allocate reads an immutable snapshot of the board and a spec-folder check that costs one look
at an inotify queue when nothing changed (a folder that changed is read on a shared worker,
bounded in time); each ListAndWatch stream blocks on the board's condition
and sends the list as bytes encoded once per board version, re-encoding only the devices that
changed. What the answers contain is decided by the pure functions of
:mod:`cdi_gen.deviceplugin.allocation`; this module maps them to messages and status codes. No
handler lets an exception out (gRPC would turn it into ``UNKNOWN``): refusals become
``INVALID_ARGUMENT`` or ``FAILED_PRECONDITION``, anything unexpected ``INTERNAL``, each with a
message naming the resource.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import grpc

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from cdi_gen.cdi.resolution import SpecResolver, unresolved
from cdi_gen.deviceplugin.allocation import (
    AllocationError,
    AllocationRefusal,
    PhysicalPolicy,
    build_cdi_annotations,
    check_id_lengths,
    check_request,
    preferred_allocation,
)
from cdi_gen.deviceplugin.board import DeviceBoard
from cdi_gen.files import FileId, file_id
from cdi_gen.kubelet.streams import StreamGate, abort, clip, follow
from cdi_gen.kubelet.supervisor import WATCH_INTERVAL, RegisterHook, SupervisedPlugin, Supervisor
from cdi_gen.kubelet.transport import UnixServer, check_socket_path
from cdi_gen.logs import call_hook
from cdi_gen.model import AdvertisedDevice
from cdi_gen.names import validate_cdi_kind_as_resource
from cdi_gen.paths import DEVICE_PLUGIN_DIR, KUBELET_SOCKET_NAME

__all__ = [
    "API_VERSION",
    "HEALTHY",
    "MAX_STREAMS",
    "UNHEALTHY",
    "AllocateHook",
    "DevicePlugin",
]

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
_SERVICE = "v1beta1.DevicePlugin"


#: ListAndWatch streams open at once. The kubelet keeps one; each holds a server thread, so
#: the cap keeps threads free for Allocate whatever a local client opens.
MAX_STREAMS = 4
#: Longest a Register call to the kubelet may take before the attempt counts as failed.
REGISTER_TIMEOUT_SECONDS = 10.0

_STATUS = {
    AllocationRefusal.UNKNOWN: grpc.StatusCode.INVALID_ARGUMENT,
    AllocationRefusal.DUPLICATE: grpc.StatusCode.INVALID_ARGUMENT,
    AllocationRefusal.UNHEALTHY: grpc.StatusCode.FAILED_PRECONDITION,
    AllocationRefusal.UNRESOLVED: grpc.StatusCode.FAILED_PRECONDITION,
    AllocationRefusal.SAME_PHYSICAL: grpc.StatusCode.INVALID_ARGUMENT,
    AllocationRefusal.TOO_LONG: grpc.StatusCode.INVALID_ARGUMENT,
}


#: ``on_allocate(outcome, reason)``: outcome ``"ok"`` or ``"error"``; reason ``""``, a
#: :class:`~cdi_gen.deviceplugin.allocation.AllocationRefusal` value or ``"internal"``.
#: Called on server threads.
AllocateHook = Callable[[str, str], None]


class DevicePlugin(SupervisedPlugin):
    """Device plugin server and kubelet registration for one CDI kind ``<vendor>/<class>``.

    ``board`` supplies the advertised devices, ``spec_cache`` resolves qualified CDI names
    before Allocate answers. With ``cdi_annotations`` each container response also carries a
    ``cdi.k8s.io/`` annotation for runtimes that read only those. ``physical_policy`` says how
    GetPreferredAllocation places slots of shared devices (``spread`` over physical devices or
    ``pack`` onto the fullest); ``one_slot_per_device`` refuses a container request holding two
    slots of one physical device. ``on_allocate`` is called on the server's threads and
    ``on_register`` on the loop, for metrics; their exceptions are logged and ignored.
    ``watch_interval`` is how often the socket files are looked at without an inotify event.
    ``pod_uid`` (the agent's pod, when known) tells a second copy of this agent apart from an
    agent it replaces when the socket's name is held (see :mod:`~cdi_gen.kubelet.transport`).

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
        watch_interval: float = WATCH_INTERVAL,
        max_backoff: float = 2.0,
        pod_uid: str | None = None,
    ) -> None:
        self.resource_name = validate_cdi_kind_as_resource(vendor, cls)
        self.vendor = vendor
        self.cls = cls
        self.board = board
        self.spec_cache = spec_cache
        self.socket_path = Path(plugin_dir) / f"{vendor}-{cls}.sock"
        self.kubelet_socket = kubelet_socket or Path(plugin_dir) / KUBELET_SOCKET_NAME
        check_socket_path(self.kubelet_socket)
        self.cdi_annotations = cdi_annotations
        self.physical_policy: PhysicalPolicy = physical_policy
        self.one_slot_per_device = one_slot_per_device
        self._on_allocate = on_allocate
        self._service = _Service(self)
        self.server = UnixServer(
            self.socket_path,
            self._service.services,
            on_stop=self._service.end_streams,
            instance=pod_uid or "",
        )
        self._supervisor = Supervisor(
            self.resource_name,
            [self.server],
            _KubeletRegistration(self),
            on_register=on_register,
            watch_interval=watch_interval,
            max_backoff=max_backoff,
        )

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
        await self._supervisor.start()
        log.info("serving %s on %s", self.resource_name, self.socket_path)

    # -- answers (called on server threads) -------------------------------------------------

    def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
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
        problems = self._unresolved([n for names in per_container for n in names])
        if problems:
            raise AllocationError(
                AllocationRefusal.UNRESOLVED,
                "",
                f"CDI devices of resource {kind} do not resolve: " + "; ".join(problems),
            )
        response = api_pb2.AllocateResponse()
        for container_names in per_container:
            answer = response.container_responses.add()
            for name in container_names:
                answer.cdi_devices.add(name=name)
            if self.cdi_annotations and container_names:
                answer.annotations.update(
                    build_cdi_annotations(self.vendor, self.cls, container_names)
                )
        return response

    def _unresolved(self, qualified_names: list[str]) -> list[str]:
        """The spec folder check (:func:`cdi_gen.cdi.resolution.unresolved`)."""
        try:
            return unresolved(self.spec_cache, qualified_names)
        except TimeoutError as exc:
            raise AllocationError(
                AllocationRefusal.UNRESOLVED,
                "",
                f"CDI devices of resource {self.resource_name} cannot be checked: {exc}",
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

    def call_allocate_hook(self, outcome: str, reason: str) -> None:
        what = f"allocate hook of {self.resource_name}"
        call_hook(self._on_allocate, outcome, reason, what=what, logger=log)


#: The fields a Device message is made of. Comparing these (a tuple built in C) is several
#: times cheaper than comparing AdvertisedDevice objects, which matters at 1,000 devices.
_WIRE_FIELDS = operator.attrgetter("id", "healthy", "numa_node")


def _encode(device: AdvertisedDevice) -> bytes:
    """The device as one element of ListAndWatchResponse.devices, field tag included: the
    encodings of a repeated field's elements concatenate into the message's encoding."""
    wire = api_pb2.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY)
    if device.numa_node is not None:
        wire.topology.nodes.add(ID=device.numa_node)
    return api_pb2.ListAndWatchResponse(devices=[wire]).SerializeToString()


class _KubeletRegistration:
    """Registers the device plugin by calling Register on ``kubelet.sock``."""

    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin

    def kubelet_id(self) -> FileId | None:
        # A starting kubelet creates kubelet.sock anew: its identity is the kubelet's.
        return file_id(self.plugin.kubelet_socket)

    def follow(self, wake: Callable[[], None]) -> tuple[Path, ...]:
        return (self.plugin.kubelet_socket,)

    async def register(self) -> str | None:
        plugin = self.plugin
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=plugin.endpoint,
            resource_name=plugin.resource_name,
            options=plugin.options,
        )
        try:
            async with grpc.aio.insecure_channel(f"unix://{plugin.kubelet_socket}") as channel:
                stub = api_pb2_grpc.RegistrationStub(channel)
                await stub.Register(request, timeout=REGISTER_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        except Exception as exc:
            log.exception("unexpected failure registering %s", plugin.resource_name)
            return f"{type(exc).__name__}: {exc}"
        return None


class _Service:
    """The DevicePlugin service: handlers for the server's threads, and the encoded list.

    ListAndWatch streams are capped and ended by :attr:`streams`.
    """

    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin
        self.streams = StreamGate(MAX_STREAMS)
        self._lock = threading.Lock()
        #: Board version and the ListAndWatchResponse bytes encoded for it.
        self._list: tuple[int, bytes] = (-1, b"")
        #: What a device looks like on the wire -> its encoded element.
        self._encoded: dict[tuple[str, bool, int | None], bytes] = {}

    def services(self) -> dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]]:
        methods = {
            "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
                self.get_options,
                request_deserializer=api_pb2.Empty.FromString,
                response_serializer=api_pb2.DevicePluginOptions.SerializeToString,
            ),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self.list_and_watch,
                request_deserializer=api_pb2.Empty.FromString,
                response_serializer=None,  # already bytes
            ),
            "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
                self.get_preferred_allocation,
                request_deserializer=api_pb2.PreferredAllocationRequest.FromString,
                response_serializer=api_pb2.PreferredAllocationResponse.SerializeToString,
            ),
            "Allocate": grpc.unary_unary_rpc_method_handler(
                self.allocate,
                request_deserializer=api_pb2.AllocateRequest.FromString,
                response_serializer=api_pb2.AllocateResponse.SerializeToString,
            ),
            "PreStartContainer": grpc.unary_unary_rpc_method_handler(
                self.pre_start_container,
                request_deserializer=api_pb2.PreStartContainerRequest.FromString,
                response_serializer=api_pb2.PreStartContainerResponse.SerializeToString,
            ),
        }
        return {_SERVICE: methods}

    def end_streams(self) -> None:
        self.streams.end_all()
        self.plugin.board.interrupt()

    def list_bytes(self) -> bytes:
        """The encoded ListAndWatchResponse of the board's current devices.

        Encoded once per board version for every stream. Only devices not seen before are
        encoded: a publish usually changes one device out of many.
        """
        board = self.plugin.board
        with self._lock:
            # The version first: a publish in between gives newer devices under an older
            # version, which is sent again later, never an older list under a newer one.
            version = board.version
            if self._list[0] == version:
                return self._list[1]
            devices = list(board.devices.values())
            keys = list(map(_WIRE_FIELDS, devices))
            encoded = self._encoded
            parts = list(map(encoded.get, keys))
            if None in parts:
                for i, part in enumerate(parts):
                    if part is None:
                        parts[i] = encoded[keys[i]] = _encode(devices[i])
            complete = cast(list[bytes], parts)
            if len(encoded) > 2 * len(keys) + 64:
                self._encoded = dict(zip(keys, complete, strict=True))  # forget devices long gone
            body = b"".join(complete)
            self._list = (version, body)
            return body

    def get_options(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return self.plugin.options

    def list_and_watch(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        yield from follow(
            self.streams,
            self.plugin.board,
            context,
            self.list_bytes,
            what=f"device list of resource {self.plugin.resource_name}",
        )

    def get_preferred_allocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        plugin = self.plugin
        try:
            return plugin.preferred(request)
        except AllocationError as refused:
            log.info("preferred allocation refused: %s", clip(refused.message))
            abort(context, _STATUS[refused.reason], refused.message)
        except Exception as exc:
            log.exception("preferred allocation for %s failed", plugin.resource_name)
            abort(
                context,
                grpc.StatusCode.INTERNAL,
                f"preferred allocation for resource {plugin.resource_name} failed: {exc}",
            )

    def allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        plugin = self.plugin
        try:
            response = plugin.allocate(request)
        except AllocationError as refused:
            plugin.call_allocate_hook("error", str(refused.reason))
            log.info("allocate refused: %s", clip(refused.message))
            abort(context, _STATUS[refused.reason], refused.message)
        except Exception as exc:
            plugin.call_allocate_hook("error", "internal")
            log.exception("allocate for %s failed", plugin.resource_name)
            abort(
                context,
                grpc.StatusCode.INTERNAL,
                f"allocate for resource {plugin.resource_name} failed: {exc}",
            )
        plugin.call_allocate_hook("ok", "")
        return response

    def pre_start_container(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()
