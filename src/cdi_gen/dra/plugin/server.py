"""The kubelet side of the DRA driver: NodePrepareResources, NodeUnprepareResources, health.

One :class:`DraPlugin` per node agent serves, on ``<kubelet plugins>/<driver>/dra.sock``, the
kubelet's DRA node service in both versions kubelets speak (``dra.v1`` from Kubernetes 1.34,
``dra.v1beta1`` before; the same calls, v1 adds ``share_id``) and the device health stream
(``v1.DRAResourceHealth`` from Kubernetes 1.37, ``v1alpha1`` before; the same messages), and
registers the driver through the plugin watcher
(:mod:`~cdi_gen.kubelet.registration`). The
:class:`~cdi_gen.kubelet.supervisor.Supervisor` keeps both sockets served and the driver
registered across kubelet restarts.

This is the gRPC side only, as the kubelet's own helper library splits a driver: it checks
each request's shape, computes what the caller's deadline leaves, and answers; which claims
are prepared, and with which devices, is the driver's state behind the
:class:`~cdi_gen.dra.plugin.claims.ClaimPreparer` it is given
(:class:`~cdi_gen.dra.driver.preparer.PoolPreparer`). A claim's namespace, name and UID are
checked first (:func:`~cdi_gen.dra.plugin.claims.check_reference`: they become an API path);
every claim of a request gets an entry; a claim that cannot be prepared gets its error, never
the whole call. The health stream answers from the
:class:`~cdi_gen.dra.plugin.pool.DevicePool`.

With the pod's UID (``pod_uid``, a rolling update with ``maxSurge``: kubelet >= 1.33) both
sockets are named after it (``<driver>-<uid>-reg.sock``, ``dra-<uid>.sock``; digests of it
where a path would be too long for a unix socket), so that the new pod's instance registers
beside the old one and the kubelet sends its calls to the newest. The old instance then hands
over: :meth:`DraPlugin.superseded` returns once a newer instance's registration socket is
there and the kubelet has registered it (each instance says so with a file beside its DRA
socket, ``<its registration socket's name>.registered``, in the plugin folder both share,
removed at its stop; the driver stops publishing the slices then and says so with
``<name>.yielded``: :meth:`DraPlugin.predecessors_yielded` holds the newer one's first
publication until every older instance still served has, so that the two never write the
node's slices at once), and
:meth:`DraPlugin.hand_over`, at SIGTERM, keeps serving until it is, bounded, before the
stop removes only this instance's own sockets (the agent skips the wait when its DaemonSet is
being uninstalled: no successor comes). Either instance may get any call: the
preparer shares its state with the other through files, under a lock.

Calls run on the gRPC server's threads (see :mod:`~cdi_gen.kubelet.transport`); no handler
lets an exception out. A slow API server must not take them all: the preparer lets at most
:data:`MAX_READING_CALLS` calls wait for it at once, so the claims answered from the
checkpoint and the unprepare calls always find a thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from cdi_gen._proto.dra.v1 import api_pb2 as dra_v1
from cdi_gen._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from cdi_gen._proto.drahealth.v1 import api_pb2 as health_v1
from cdi_gen._proto.drahealth.v1alpha1 import api_pb2 as health_pb
from cdi_gen.dra.plugin.claims import (
    ClaimPreparer,
    ClaimRef,
    ClaimRefused,
    PrepareResult,
    Refusal,
    check_reference,
    claim_label,
)
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.errors import InvalidNameError, RegistrationError
from cdi_gen.kubelet.registration import (
    PluginWatcherRegistrar,
    RegistrationService,
    endpoint_socket,
    newer_siblings,
    older_siblings,
    registration_socket,
    successor,
    watch_until,
)
from cdi_gen.kubelet.streams import StreamGate, clip, follow
from cdi_gen.kubelet.supervisor import WATCH_INTERVAL, RegisterHook, SupervisedPlugin, Supervisor
from cdi_gen.kubelet.transport import WORKERS, UnixServer, check_socket_path
from cdi_gen.model import PoolDevice
from cdi_gen.modes import make_folder
from cdi_gen.names import is_dns_subdomain

__all__ = [
    "ANSWER_MARGIN_SECONDS",
    "HANDOVER_SECONDS",
    "HEALTH_RESEND_SECONDS",
    "HEALTH_TIMEOUT_SECONDS",
    "MAX_HEALTH_STREAMS",
    "MAX_READING_CALLS",
    "READ_TIMEOUT_SECONDS",
    "DraPlugin",
    "PrepareHook",
    "work_timeout",
]

log = logging.getLogger(__name__)

_SERVICES = {
    "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin": dra_v1,
    "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin": dra_v1beta1,
}
#: The 1.37 kubelet opens the newest health service the registration lists; 1.31-1.36 know
#: only v1alpha1. The messages are the same on the wire, so one stream serves both.
_HEALTH_SERVICES = {"v1.DRAResourceHealth": health_v1, "v1alpha1.DRAResourceHealth": health_pb}
#: Health streams open at once: the kubelet keeps one; each holds a server thread.
MAX_HEALTH_STREAMS = 4
#: The kubelet reports a device's health Unknown once it heard nothing about it for the
#: timeout, so the stream repeats the list at least this often even when nothing changed.
HEALTH_RESEND_SECONDS = 10.0
#: Sent as each device's health_check_timeout_seconds: three resends may be missed.
HEALTH_TIMEOUT_SECONDS = 30
#: NodePrepareResources calls that may wait for the API server at once (the preparer is
#: built with this bound). Each holds a server thread while it waits; the health streams hold
#: at most MAX_HEALTH_STREAMS more, so at least 4 threads always remain for answers from the
#: checkpoint and for unprepare calls.
MAX_READING_CALLS = WORKERS - MAX_HEALTH_STREAMS - 4
#: Longest a call works (reads claims, waits for another call on the same claim) when the
#: caller's deadline allows more.
READ_TIMEOUT_SECONDS = 10.0
#: What is kept of the caller's deadline for recording and answering after that work: a
#: tenth of it, at most this (an answer after the deadline is lost, prepared or not).
ANSWER_MARGIN_SECONDS = 0.5
#: Longest an instance stopping keeps serving for its successor to be registered (a rolling
#: update): within the DRA pod's grace period (30 s in the manifests), which also covers the
#: stop. The successor may be Ready before it registers (see the chart: the older one answers
#: its probes until it has gone), so this covers the newer one's start.
HANDOVER_SECONDS = 20.0
_GONE_MESSAGE = "the device is gone from the node"
_UNHEALTHY_MESSAGE = "the device failed its health check"
_REFUSALS = frozenset(Refusal)

#: ``on_prepare(outcome, reason)`` per claim: outcome ``"ok"`` or ``"error"``; reason ``""``,
#: a :class:`~cdi_gen.dra.plugin.claims.Refusal` value, ``"claim-read"`` (the claim could not be
#: read, or was not: too many calls already wait for the API server, or another call holds
#: it), ``"checkpoint"`` or ``"internal"``. Called on server threads.
PrepareHook = Callable[[str, str], None]


def work_timeout(left: float | None) -> float:
    """How long a call may work when its caller's deadline is ``left`` seconds away (None:
    no deadline): :data:`READ_TIMEOUT_SECONDS` at most, and a margin kept for answering."""
    if left is None:
        return READ_TIMEOUT_SECONDS
    return min(READ_TIMEOUT_SECONDS, left - min(ANSWER_MARGIN_SECONDS, left / 10))


class DraPlugin(SupervisedPlugin):
    """The DRA driver ``driver`` as the kubelet sees it, for the pool ``pool_name``.

    ``preparer`` is the driver's state: every prepare and unprepare is its answer. ``pool``
    holds the node's DRA devices, whose health the health stream sends. The registration
    socket is ``<registry_dir>/<driver>-reg.sock`` and the service socket
    ``<plugins_dir>/<driver>/dra.sock``; with ``pod_uid``, names of this instance's own (see
    the module docstring). ``on_prepare`` (server threads) and ``on_register``
    (the loop) are for metrics; their exceptions are logged and ignored. ``watch_interval``
    is how often the sockets are looked at without an inotify event, ``max_backoff`` bounds
    the wait between failed registrations and ``register_timeout`` each wait for the
    kubelet's notification.

    The constructor raises :class:`~cdi_gen.errors.InvalidNameError` when ``driver`` is not
    a DNS subdomain and :class:`~cdi_gen.errors.ConfigError` when a socket path is too long.
    """

    def __init__(
        self,
        driver: str,
        pool: DevicePool,
        preparer: ClaimPreparer,
        *,
        pool_name: str,
        registry_dir: Path,
        plugins_dir: Path,
        pod_uid: str | None = None,
        on_register: RegisterHook | None = None,
        on_prepare: PrepareHook | None = None,
        watch_interval: float = WATCH_INTERVAL,
        max_backoff: float = 2.0,
        register_timeout: float = 10.0,
    ) -> None:
        if not is_dns_subdomain(driver):
            raise InvalidNameError("DRA driver name", driver, "must be a DNS subdomain")
        self.driver = driver
        self.pool = pool
        self.preparer = preparer
        self.pool_name = pool_name
        self.pod_uid = pod_uid
        self.socket_path = endpoint_socket(Path(plugins_dir) / driver, pod_uid)
        self.registration_socket = registration_socket(Path(registry_dir), driver, pod_uid)
        check_socket_path(self.socket_path)
        check_socket_path(self.registration_socket)
        self._on_prepare = on_prepare
        self._on_register = on_register
        #: Where this instance says the kubelet registered it (with a pod UID only).
        self.registered_file = (
            self.socket_path.parent / f"{self.registration_socket.name}.registered"
        )
        #: Where this instance says it writes no ResourceSlice any more (it handed over).
        self.yielded_file = self.socket_path.parent / f"{self.registration_socket.name}.yielded"
        self._service = _Service(self)
        self.server = UnixServer(
            self.socket_path, self._service.services, on_stop=self._service.end_streams
        )
        self.registration = RegistrationService(driver, self.socket_path)
        self.registration_server = UnixServer(self.registration_socket, self.registration.services)
        self._supervisor = Supervisor(
            driver,
            # The service first: the kubelet dials the endpoint as soon as it is told.
            [self.server, self.registration_server],
            PluginWatcherRegistrar(self.registration, register_timeout),
            on_register=self._registered,
            watch_interval=watch_interval,
            max_backoff=max_backoff,
            serve_anew_on_restart=False,
        )

    async def start(self) -> None:
        """Load the preparer's state, serve both sockets, then register in the background.

        Raises what the preparer's ``load`` raises (a
        :class:`~cdi_gen.dra.driver.checkpoint.CheckpointError` when the checkpoint cannot be
        read as ours; it is left as it is) and :class:`~cdi_gen.errors.RegistrationError`
        when a socket cannot be served.
        """
        self.preparer.load()
        try:
            make_folder(self.socket_path.parent)
        except OSError as exc:
            raise RegistrationError(
                f"cannot create the DRA socket folder {str(self.socket_path.parent)!r}: {exc}"
            ) from exc
        await self._supervisor.start()
        log.info(
            "serving DRA driver %s on %s (registration %s), %d prepared claims",
            self.driver,
            self.socket_path,
            self.registration_socket,
            self.preparer.count,
        )

    def health_response(self) -> health_pb.NodeWatchResourcesResponse:
        """The health of every device of the pool, as the health stream sends it."""
        return self._service.health_response()

    def _registered(self, ok: bool, error: str) -> None:
        # On the loop, after each registration attempt (the supervisor logs what raises).
        if ok and self.pod_uid is not None:
            # For the older instance, waiting to hand over (see the module docstring).
            self.registered_file.write_bytes(b"")
        if self._on_register is not None:
            self._on_register(ok, error)

    async def stop(self, grace: float = 1.0) -> None:
        self.registered_file.unlink(missing_ok=True)
        await super().stop(grace)
        # After the sockets: a newer instance never sees ours served and not yielded again.
        self.yielded_file.unlink(missing_ok=True)

    def mark_yielded(self) -> None:
        """Say, beside our DRA socket, that this instance writes no ResourceSlice any more:
        the newer instance waits for it before it publishes (see :meth:`predecessors`)."""
        if self.pod_uid is not None:
            self.yielded_file.write_bytes(b"")

    def successors(self) -> list[Path]:
        """The registration sockets of newer instances of this driver that the kubelet
        registered, newest first (none without a pod UID, or while our own socket is not
        served)."""
        served = self.registration_server.socket_id
        if self.pod_uid is None or served is None:
            return []
        folder = self.socket_path.parent
        return [
            path
            for path in newer_siblings(self.registration_socket, self.driver, served[2])
            if (folder / f"{path.name}.registered").exists()
        ]

    def predecessors(self) -> list[Path]:
        """The registration sockets of older instances of this driver still served that have
        not said they handed the ResourceSlices over, oldest first (none without a pod UID).
        While our own socket is not served every served one counts: we cannot tell it is
        older, and publishing beside it would withdraw what it serves."""
        if self.pod_uid is None:
            return []
        served = self.registration_server.socket_id
        folder = self.socket_path.parent
        return [
            path
            for path in older_siblings(
                self.registration_socket, self.driver, None if served is None else served[2]
            )
            if not (folder / f"{path.name}.yielded").exists()
        ]

    async def predecessors_yielded(self) -> None:
        """Wait until no older instance of this driver may write the ResourceSlices: each
        has said it handed them over, or stopped serving. Two instances publishing at once
        would each take the other's slice for a change to repair, and whoever wrote last
        would win: the older one's devices could stay published for good."""
        pending = self.predecessors()
        if not pending:
            return
        log.info(
            "DRA driver %s publishes its ResourceSlices once the older instance hands them "
            "over: %s",
            self.driver,
            pending[0],
        )
        folders = (self.registration_socket.parent, self.socket_path.parent)
        await watch_until(folders, lambda: True if not self.predecessors() else None)

    async def superseded(self) -> Path:
        """Wait until a newer instance of this driver is registered beside us; its
        registration socket. Without a pod UID there is none: this waits until cancelled."""
        folders = (self.registration_socket.parent, self.socket_path.parent)
        return await successor(folders, self.successors)

    async def hand_over(self, within: float = HANDOVER_SECONDS) -> bool:
        """Before a stop: keep serving until a newer instance has registered beside us, at
        most ``within`` seconds; whether one did. At once False without a pod UID (one
        instance per node: nobody to hand over to) or when not serving."""
        if self.pod_uid is None or not self.serving:
            return False
        try:
            async with asyncio.timeout(within):
                found = await self.superseded()
        except TimeoutError:
            log.info(
                "DRA driver %s stopping: no newer instance registered within %gs",
                self.driver,
                within,
            )
            return False
        log.info("DRA driver %s hands over to %s", self.driver, found)
        return True

    def call_prepare_hook(self, outcome: str, reason: str) -> None:
        if self._on_prepare is None:
            return
        try:
            self._on_prepare(outcome, reason)
        except Exception:
            log.exception("prepare hook of %s failed", self.driver)


class _Service:
    """The DRA and health services: handlers for the server's threads.

    Health streams are capped and ended by :attr:`streams`.
    """

    def __init__(self, plugin: DraPlugin) -> None:
        self.plugin = plugin
        self.streams = StreamGate(MAX_HEALTH_STREAMS)
        self._lock = threading.Lock()
        #: Device name -> (health, message, when that pair was first seen), for
        #: last_updated_time: the time the driver determined the status, not the send time.
        self._since: dict[str, tuple[int, str, int]] = {}

    def services(self) -> dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]]:
        services: dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]] = {}
        for name, pb in _SERVICES.items():
            services[name] = {
                "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
                    self._prepare_handler(pb),
                    request_deserializer=pb.NodePrepareResourcesRequest.FromString,
                    response_serializer=pb.NodePrepareResourcesResponse.SerializeToString,
                ),
                "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
                    self._unprepare_handler(pb),
                    request_deserializer=pb.NodeUnprepareResourcesRequest.FromString,
                    response_serializer=pb.NodeUnprepareResourcesResponse.SerializeToString,
                ),
            }
        for name, hpb in _HEALTH_SERVICES.items():
            services[name] = {
                "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
                    self.watch_resources,
                    request_deserializer=hpb.NodeWatchResourcesRequest.FromString,
                    response_serializer=health_pb.NodeWatchResourcesResponse.SerializeToString,
                )
            }
        return services

    def end_streams(self) -> None:
        self.streams.end_all()
        self.plugin.pool.interrupt()

    # -- prepare / unprepare ----------------------------------------------------------------

    def _checked(self, claims: Any, refused: Callable[[Any, ClaimRefused], None]) -> list[ClaimRef]:
        """The claims of a request whose references are Kubernetes ones; ``refused`` is
        called for each of the others."""
        refs = []
        for claim in claims:
            try:
                check_reference(claim.namespace, claim.name, claim.uid)
            except ClaimRefused as exc:
                refused(claim, exc)
                continue
            refs.append(ClaimRef(claim.namespace, claim.name, claim.uid))
        return refs

    def _prepare_handler(self, pb: ModuleType) -> Callable[[Any, grpc.ServicerContext], Any]:
        share_ids = "share_id" in pb.Device.DESCRIPTOR.fields_by_name

        def handler(request: Any, context: grpc.ServicerContext) -> Any:
            response = pb.NodePrepareResourcesResponse()

            def refused(claim: Any, exc: ClaimRefused) -> None:
                result = PrepareResult(error=str(exc), reason=str(exc.reason))
                self._answer(claim, response.claims[claim.uid], result, share_ids)

            refs = self._checked(request.claims, refused)
            if not refs:
                return response
            driver = self.plugin.driver
            try:
                results = self.plugin.preparer.prepare(refs, work_timeout(context.time_remaining()))
                if len(results) != len(refs):
                    raise RuntimeError(f"the preparer answered {len(results)} of {len(refs)}")
            except Exception as exc:
                log.exception("preparing %d claims of driver %s failed", len(refs), driver)
                results = [
                    PrepareResult(
                        error=f"{claim_label(r.namespace, r.name, r.uid)}: internal error of "
                        f"driver {driver}: {exc}",
                        reason="internal",
                    )
                    for r in refs
                ]
            for ref, result in zip(refs, results, strict=True):
                self._answer(ref, response.claims[ref.uid], result, share_ids)
            return response

        return handler

    def _answer(self, claim: Any, answer: Any, result: PrepareResult, share_ids: bool) -> None:
        """Fill ``answer`` for one claim from ``result``, count it, log a refusal."""
        plugin = self.plugin
        if result.error:
            plugin.call_prepare_hook("error", result.reason or "internal")
            # A claim's own failure (refused, not read) is logged here, clipped as it is
            # answered; the preparer logs its own (the checkpoint, a bug) with their cause.
            if result.reason in _REFUSALS:
                log.info("prepare refused: %s", clip(result.error))
            elif result.reason == "claim-read":
                label = claim_label(claim.namespace, claim.name, claim.uid)
                log.info("prepare of %s failed: %s", label, clip(result.error))
            del answer.devices[:]
            answer.error = clip(result.error)
            return
        for device in result.devices:
            wire = answer.devices.add(
                request_names=device.request_names,
                pool_name=device.pool,
                device_name=device.device,
                cdi_device_ids=device.cdi_device_ids,
            )
            if share_ids and device.share_id is not None:
                wire.share_id = device.share_id
        plugin.call_prepare_hook("ok", "")

    def _unprepare_handler(self, pb: ModuleType) -> Callable[[Any, grpc.ServicerContext], Any]:
        def handler(request: Any, context: grpc.ServicerContext) -> Any:
            response = pb.NodeUnprepareResourcesResponse()

            def refused(claim: Any, exc: ClaimRefused) -> None:
                # Never prepared, since a prepare refuses it: already unprepared.
                response.claims[claim.uid].error = ""
                log.info("unprepared %s: not a claim reference (nothing to do)", clip(str(exc)))

            refs = self._checked(request.claims, refused)
            if not refs:
                return response
            try:
                errors = self.plugin.preparer.unprepare(
                    refs, work_timeout(context.time_remaining())
                )
                if len(errors) != len(refs):
                    raise RuntimeError(f"the preparer answered {len(errors)} of {len(refs)}")
            except Exception as exc:
                log.exception("unpreparing %d claims failed", len(refs))
                errors = [f"{claim_label(r.namespace, r.name, r.uid)}: {exc}" for r in refs]
            for ref, error in zip(refs, errors, strict=True):
                answer = response.claims[ref.uid]
                if error:
                    answer.error = clip(error)
            return response

        return handler

    # -- health -----------------------------------------------------------------------------

    def _status(self, device: PoolDevice, now: int) -> tuple[int, str, int]:
        if device.gone:
            health, message = health_pb.UNHEALTHY, _GONE_MESSAGE
        elif not device.healthy:
            health, message = health_pb.UNHEALTHY, _UNHEALTHY_MESSAGE
        else:
            health, message = health_pb.HEALTHY, ""
        seen = self._since.get(device.name)
        if seen is None or seen[:2] != (health, message):
            seen = self._since[device.name] = (health, message, now)
        return seen

    def health_response(self) -> health_pb.NodeWatchResourcesResponse:
        plugin = self.plugin
        now = int(time.time())
        response = health_pb.NodeWatchResourcesResponse()
        with self._lock:
            devices = plugin.pool.devices
            for device in devices.values():
                health, message, since = self._status(device, now)
                response.devices.add(
                    device=health_pb.DeviceIdentifier(
                        pool_name=plugin.pool_name, device_name=device.name
                    ),
                    health=health,
                    last_updated_time=since,
                    health_check_timeout_seconds=HEALTH_TIMEOUT_SECONDS,
                    message=message,
                )
            if len(self._since) > 2 * len(devices) + 64:  # forget devices long gone
                self._since = {k: v for k, v in self._since.items() if k in devices}
        return response

    def watch_resources(
        self, request: health_pb.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[health_pb.NodeWatchResourcesResponse]:
        # Resent without a change too: the kubelet forgets a device's health it has not
        # heard about within the timeout.
        yield from follow(
            self.streams,
            self.plugin.pool,
            context,
            self.health_response,
            what=f"device health of DRA driver {self.plugin.driver}",
            resend_seconds=HEALTH_RESEND_SECONDS,
        )
