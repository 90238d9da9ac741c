"""The kubelet side of the DRA driver: NodePrepareResources, NodeUnprepareResources, health.

One :class:`DraPlugin` per node agent serves, on ``<kubelet plugins>/<driver>/dra.sock``, the
kubelet's DRA node service in both versions kubelets speak (``dra.v1`` from Kubernetes 1.34,
``dra.v1beta1`` before; the same calls, v1 adds ``share_id``) and the device health stream
(``v1.DRAResourceHealth`` from Kubernetes 1.37, ``v1alpha1`` before; the same messages), and
registers the driver through the plugin watcher
(:mod:`~cdi_gen.kubelet.registration`). The
:class:`~cdi_gen.kubelet.supervisor.Supervisor` keeps both sockets served and the driver
registered across kubelet restarts.

Preparing a claim: its namespace, name and UID are checked first
(:func:`~cdi_gen.kubelet.claims.check_reference`: they become an API path). A claim already
in the :class:`~cdi_gen.kubelet.checkpoint.Checkpoint` under that UID is answered from it
(the kubelet may ask again, also after our restart, and the claim may be gone from the API
server by then); otherwise it is read through the
:class:`~cdi_gen.kubelet.claims.ClaimReader`, checked against a snapshot of the
:class:`~cdi_gen.discovery.pool.DevicePool` (:func:`~cdi_gen.kubelet.claims.prepare_claim`),
recorded, and answered with the devices' CDI names: the spec entries the agent keeps on disk
for every pool device, so nothing per claim is written besides the checkpoint. Every claim of
a request gets an entry; a claim that cannot be prepared gets its error, never the whole call.

Calls run on the gRPC server's threads (see :mod:`~cdi_gen.kubelet.transport`); no handler
lets an exception out. A slow API server must not take them all: the claims of a call are
read together, within what is left of the caller's deadline, and at most
:data:`MAX_READING_CALLS` calls wait for the API server at once (a call beyond that gets an
error for the claims it would read, which the kubelet retries), so the claims answered from
the checkpoint are answered at once whatever the API server does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from cdi_gen._proto.dra.v1 import api_pb2 as dra_v1
from cdi_gen._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from cdi_gen._proto.drahealth.v1 import api_pb2 as health_v1
from cdi_gen._proto.drahealth.v1alpha1 import api_pb2 as health_pb
from cdi_gen.discovery.pool import DevicePool
from cdi_gen.errors import ClaimError, InvalidNameError, RegistrationError
from cdi_gen.kubelet.checkpoint import Checkpoint, CheckpointError, PreparedClaim, checkpoint_path
from cdi_gen.kubelet.claims import (
    ClaimReader,
    ClaimRefused,
    PreparedDevice,
    Refusal,
    check_reference,
    claim_label,
    prepare_claim,
)
from cdi_gen.kubelet.registration import PluginWatcherRegistrar, RegistrationService
from cdi_gen.kubelet.resolution import SpecResolver, unresolved
from cdi_gen.kubelet.streams import StreamGate, clip, follow
from cdi_gen.kubelet.supervisor import WATCH_INTERVAL, RegisterHook, SupervisedPlugin, Supervisor
from cdi_gen.kubelet.transport import WORKERS, UnixServer, check_socket_path
from cdi_gen.model import ClaimView, PoolDevice
from cdi_gen.modes import make_folder
from cdi_gen.names import is_dns_subdomain

__all__ = [
    "HEALTH_RESEND_SECONDS",
    "HEALTH_TIMEOUT_SECONDS",
    "MAX_HEALTH_STREAMS",
    "MAX_READING_CALLS",
    "READ_TIMEOUT_SECONDS",
    "DraPlugin",
    "PrepareHook",
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
#: NodePrepareResources calls that may wait for the API server at once. Each holds a server
#: thread while it waits; the health streams hold at most MAX_HEALTH_STREAMS more, so at
#: least 4 threads always remain for answers from the checkpoint and for unprepare calls.
MAX_READING_CALLS = WORKERS - MAX_HEALTH_STREAMS - 4
#: Longest wait for the API server in one call, when the caller's deadline allows more.
READ_TIMEOUT_SECONDS = 10.0
#: What is kept of the caller's deadline for recording and answering after the reads: a
#: tenth of it, at most this (an answer after the deadline is lost, prepared or not).
ANSWER_MARGIN_SECONDS = 0.5
_GONE_MESSAGE = "the device is gone from the node"
_UNHEALTHY_MESSAGE = "the device failed its health check"

#: ``on_prepare(outcome, reason)`` per claim: outcome ``"ok"`` or ``"error"``; reason ``""``,
#: a :class:`~cdi_gen.kubelet.claims.Refusal` value, ``"claim-read"`` (the claim could not be
#: read, or was not: too many calls already wait for the API server), ``"checkpoint"`` or
#: ``"internal"``. Called on server threads.
PrepareHook = Callable[[str, str], None]


def _describe(devices: tuple[PreparedDevice, ...]) -> str:
    return ", ".join(f"{d.device}={','.join(d.cdi_device_ids)}" for d in devices) or "none"


class DraPlugin(SupervisedPlugin):
    """The DRA driver ``driver`` as the kubelet sees it, for the pool ``pool_name``.

    ``pool`` holds the node's DRA devices; ``claims`` reads ResourceClaims (on server
    threads); ``cdi_kinds`` are the CDI kinds (``vendor/class``) of the pool's devices, the
    only ones a recorded claim may name. The registration socket is
    ``<registry_dir>/<driver>-reg.sock``, the service socket
    ``<plugins_dir>/<driver>/dra.sock`` and the prepared claims live in
    ``<state_dir>/dra-<driver>.json``. With a ``resolver``, a claim is prepared only when
    every CDI name it gets resolves in the runtime's spec folders, as Allocate checks them.
    ``on_prepare`` (server threads) and ``on_register``
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
        claims: ClaimReader,
        *,
        pool_name: str,
        cdi_kinds: Collection[str],
        registry_dir: Path,
        plugins_dir: Path,
        state_dir: Path,
        resolver: SpecResolver | None = None,
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
        self.claims = claims
        self.pool_name = pool_name
        self.socket_path = Path(plugins_dir) / driver / "dra.sock"
        self.registration_socket = Path(registry_dir) / f"{driver}-reg.sock"
        check_socket_path(self.socket_path)
        check_socket_path(self.registration_socket)
        self.checkpoint = Checkpoint(
            checkpoint_path(state_dir, driver), driver, pool=pool_name, kinds=cdi_kinds
        )
        self.resolver = resolver
        self._on_prepare = on_prepare
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
            on_register=on_register,
            watch_interval=watch_interval,
            max_backoff=max_backoff,
            serve_anew_on_restart=False,
        )

    async def start(self) -> None:
        """Read the checkpoint, serve both sockets, then register in the background.

        Raises :class:`~cdi_gen.kubelet.checkpoint.CheckpointError` when the checkpoint
        cannot be read as ours (it is left as it is) and
        :class:`~cdi_gen.errors.RegistrationError` when a socket cannot be served.
        """
        self.checkpoint.load()
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
            len(self.checkpoint.claims),
        )

    # -- answers (called on server threads) -------------------------------------------------

    def prepared(self, namespace: str, name: str, uid: str) -> tuple[PreparedDevice, ...] | None:
        """The devices of a claim prepared earlier, None when it must be read first.

        Raises :class:`~cdi_gen.kubelet.claims.ClaimRefused` when the reference is not a
        claim's (checked before anything else: the next step puts it in an API path).
        """
        check_reference(namespace, name, uid)
        known = self.checkpoint.get(uid)
        if known is None:
            return None
        label = claim_label(namespace, name, uid)
        log.info("prepared %s again from the checkpoint: %s", label, _describe(known.devices))
        return known.devices

    def read_claims(
        self, refs: Sequence[tuple[str, str]], timeout: float
    ) -> list[ClaimView | ClaimError]:
        """Each claim of ``refs`` or why it cannot be read, within ``timeout`` seconds."""
        return self.claims.read_claims(refs, timeout)

    def prepare(
        self, namespace: str, name: str, uid: str, claim: ClaimView | Exception
    ) -> tuple[PreparedDevice, ...]:
        """Prepare a claim not prepared yet from what reading it gave: check it, record it,
        return its devices.

        Raises ``claim`` when reading failed (a :class:`~cdi_gen.errors.ClaimError` naming
        it), a :class:`~cdi_gen.kubelet.claims.ClaimRefused` when a rule fails or a
        :class:`~cdi_gen.kubelet.checkpoint.CheckpointError` when it cannot be recorded.
        """
        if isinstance(claim, Exception):
            raise claim
        devices = tuple(
            prepare_claim(
                uid, claim, driver=self.driver, pool_name=self.pool_name, devices=self.pool.devices
            )
        )
        self._check_resolved(claim_label(namespace, name, uid), devices)
        self.checkpoint.add(uid, PreparedClaim(namespace, name, devices))
        log.info("prepared %s: %s", claim_label(namespace, name, uid), _describe(devices))
        return devices

    def _check_resolved(self, label: str, devices: tuple[PreparedDevice, ...]) -> None:
        """Refuse a claim whose CDI names the runtime could not resolve: the kubelet would
        hand them on, and the pod fail later, far from the cause."""
        if self.resolver is None:
            return
        names = [n for device in devices for n in device.cdi_device_ids]
        try:
            problems = unresolved(self.resolver, names)
        except TimeoutError as exc:
            raise ClaimRefused(
                Refusal.UNRESOLVED, f"{label}: its CDI devices cannot be checked: {exc}"
            ) from None
        if problems:
            raise ClaimRefused(
                Refusal.UNRESOLVED, f"{label}: CDI devices do not resolve: " + "; ".join(problems)
            )

    def unprepare(self, namespace: str, name: str, uid: str) -> None:
        """Forget a prepared claim; an unknown one is already unprepared. Raises
        :class:`~cdi_gen.kubelet.checkpoint.CheckpointError` when the change cannot be
        recorded."""
        label = claim_label(namespace, name, uid)
        if self.checkpoint.remove(uid):
            log.info("unprepared %s", label)
        else:
            log.info("unprepared %s: it was not prepared here (nothing to do)", label)

    def health_response(self) -> health_pb.NodeWatchResourcesResponse:
        """The health of every device of the pool, as the health stream sends it."""
        return self._service.health_response()

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
        #: Calls waiting for the API server (see MAX_READING_CALLS); never waited on.
        self._reading = threading.BoundedSemaphore(MAX_READING_CALLS)
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

    def _prepare_handler(self, pb: ModuleType) -> Callable[[Any, grpc.ServicerContext], Any]:
        share_ids = "share_id" in pb.Device.DESCRIPTOR.fields_by_name

        def handler(request: Any, context: grpc.ServicerContext) -> Any:
            plugin = self.plugin
            response = pb.NodePrepareResourcesResponse()
            # Everything answerable without the API server first, so that it never waits
            # behind a read.
            unread = [
                claim
                for claim in request.claims
                if not self._answer(
                    claim,
                    response.claims[claim.uid],
                    share_ids,
                    partial(plugin.prepared, claim.namespace, claim.name, claim.uid),
                )
            ]
            if not unread:
                return response
            for claim, read in zip(unread, self._read(unread, context), strict=True):
                self._answer(
                    claim,
                    response.claims[claim.uid],
                    share_ids,
                    partial(plugin.prepare, claim.namespace, claim.name, claim.uid, read),
                )
            return response

        return handler

    def _read(
        self, claims: Sequence[Any], context: grpc.ServicerContext
    ) -> list[ClaimView | Exception]:
        """Each claim as the API server has it, or why not, within the caller's deadline."""
        refs = [(c.namespace, c.name) for c in claims]
        left = context.time_remaining()
        timeout = READ_TIMEOUT_SECONDS
        if left is not None:
            timeout = min(timeout, left - min(ANSWER_MARGIN_SECONDS, left / 10))
        if timeout <= 0:
            return [
                ClaimError(f"ResourceClaim {ns}/{name}: not read, the caller's deadline has passed")
                for ns, name in refs
            ]
        if not self._reading.acquire(blocking=False):
            log.warning(
                "%d claims not read: %d NodePrepareResources calls already wait for the API server",
                len(refs),
                MAX_READING_CALLS,
            )
            return [
                ClaimError(
                    f"ResourceClaim {ns}/{name}: not read, {MAX_READING_CALLS} calls of driver "
                    f"{self.plugin.driver} already wait for the API server; try again"
                )
                for ns, name in refs
            ]
        try:
            reads: list[ClaimView | Exception] = list(self.plugin.read_claims(refs, timeout))
            if len(reads) != len(refs):
                raise RuntimeError(f"the claim reader answered {len(reads)} of {len(refs)} claims")
        except Exception as exc:
            # Answered per claim below as an internal error, with its traceback logged.
            reads = [exc] * len(refs)
        finally:
            self._reading.release()
        return reads

    def _answer(
        self,
        claim: Any,
        answer: Any,
        share_ids: bool,
        work: Callable[[], tuple[PreparedDevice, ...] | None],
    ) -> bool:
        """Fill ``answer`` for one claim from ``work``; False when it has no answer yet."""
        error = self._prepare_one(claim, answer, share_ids, work)
        if error is None:
            return False
        if error:
            del answer.devices[:]
            answer.error = clip(error)
        return True

    def _prepare_one(
        self,
        claim: Any,
        answer: Any,
        share_ids: bool,
        work: Callable[[], tuple[PreparedDevice, ...] | None],
    ) -> str | None:
        """Fill ``answer`` for one claim; return the error text ("" when prepared, None
        when ``work`` had no answer)."""
        plugin = self.plugin
        label = claim_label(claim.namespace, claim.name, claim.uid)
        try:
            devices = work()
            if devices is None:
                return None
        except ClaimRefused as refused:
            plugin.call_prepare_hook("error", str(refused.reason))
            log.info("prepare refused: %s", clip(str(refused)))
            return str(refused)
        except ClaimError as exc:
            plugin.call_prepare_hook("error", "claim-read")
            log.info("prepare of %s failed: %s", label, clip(str(exc)))
            return str(exc)
        except CheckpointError as exc:
            plugin.call_prepare_hook("error", "checkpoint")
            log.error("prepare of %s failed: %s", label, exc)
            return f"{label}: {exc}"
        except Exception as exc:
            plugin.call_prepare_hook("error", "internal")
            log.exception("prepare of %s failed", label)
            return f"{label}: internal error of driver {plugin.driver}: {exc}"
        for device in devices:
            wire = answer.devices.add(
                request_names=device.request_names,
                pool_name=device.pool,
                device_name=device.device,
                cdi_device_ids=device.cdi_device_ids,
            )
            if share_ids and device.share_id is not None:
                wire.share_id = device.share_id
        plugin.call_prepare_hook("ok", "")
        return ""

    def _unprepare_handler(self, pb: ModuleType) -> Callable[[Any, grpc.ServicerContext], Any]:
        def handler(request: Any, context: grpc.ServicerContext) -> Any:
            response = pb.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                answer = response.claims[claim.uid]
                try:
                    self.plugin.unprepare(claim.namespace, claim.name, claim.uid)
                except Exception as exc:
                    label = claim_label(claim.namespace, claim.name, claim.uid)
                    if not isinstance(exc, CheckpointError):
                        log.exception("unprepare of %s failed", label)
                    else:
                        log.error("unprepare of %s failed: %s", label, exc)
                    answer.error = clip(f"{label}: {exc}")
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
