"""The kubelet's DRA node service and the device health stream, on the gRPC server's threads.

:class:`DraService` answers NodePrepareResources and NodeUnprepareResources in both versions
kubelets speak (``dra.v1`` from Kubernetes 1.34, ``dra.v1beta1`` before; the same calls, v1
adds ``share_id``) and streams device health (``v1.DRAResourceHealth`` from Kubernetes 1.37,
``v1alpha1`` before; the same messages). :class:`~cdi_gen.dra.plugin.server.DraPlugin` serves
it on the driver's socket.

This is the gRPC side of the generic part (the split of Kubernetes' helper library for DRA
drivers): it checks each request's shape and each claim reference, once
(:func:`~cdi_gen.dra.plugin.claims.check_reference`: they become an API path), computes what
the caller's deadline leaves (:func:`work_timeout`), hands the references to
:class:`~cdi_gen.dra.plugin.calls.ClaimCalls` and answers. Every claim of a request gets an
entry; a claim that cannot be prepared gets its error, never the whole call. No handler
lets an exception out. The health stream answers from the
:class:`~cdi_gen.dra.plugin.pool.DevicePool`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import grpc

from cdi_gen._proto.dra.v1 import api_pb2 as dra_v1
from cdi_gen._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from cdi_gen._proto.drahealth.v1 import api_pb2 as health_v1
from cdi_gen._proto.drahealth.v1alpha1 import api_pb2 as health_pb
from cdi_gen.dra.plugin.calls import ClaimCalls
from cdi_gen.dra.plugin.claims import (
    NOT_REFUSALS,
    ClaimRef,
    ClaimRefused,
    PrepareResult,
    check_reference,
    claim_label,
)
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.kubelet.streams import StreamGate, clip, follow
from cdi_gen.kubelet.transport import WORKERS
from cdi_gen.logs import call_hook
from cdi_gen.model import PoolDevice

__all__ = [
    "ANSWER_MARGIN_SECONDS",
    "HEALTH_RESEND_SECONDS",
    "HEALTH_TIMEOUT_SECONDS",
    "MAX_HEALTH_STREAMS",
    "MAX_READING_CALLS",
    "READ_TIMEOUT_SECONDS",
    "DraService",
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
#: NodePrepareResources calls that may wait for the API server at once (the claim calls are
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
_GONE_MESSAGE = "the device is gone from the node"
_UNHEALTHY_MESSAGE = "the device failed its health check"

#: ``on_prepare(outcome, reason)`` per claim: outcome ``"ok"`` or ``"error"``; reason ``""``,
#: a refusal (:class:`~cdi_gen.dra.plugin.claims.Refusal` or the driver part's),
#: ``"claim-read"`` (the claim could not be read, or was not: too many calls already wait
#: for the API server, or another call holds it), ``"checkpoint"`` or ``"internal"``.
#: Called on server threads.
PrepareHook = Callable[[str, str], None]


def work_timeout(left: float | None) -> float:
    """How long a call may work when its caller's deadline is ``left`` seconds away (None:
    no deadline): :data:`READ_TIMEOUT_SECONDS` at most, and a margin kept for answering."""
    if left is None:
        return READ_TIMEOUT_SECONDS
    return min(READ_TIMEOUT_SECONDS, left - min(ANSWER_MARGIN_SECONDS, left / 10))


class DraService:
    """The DRA and health services of driver ``driver``, for the pool ``pool_name``:
    handlers for the server's threads. Every prepare and unprepare is ``calls``'s answer;
    the health stream sends the health of ``pool``'s devices. ``on_prepare`` is called per
    claim (see :data:`PrepareHook`); its exceptions are logged and ignored.

    Health streams are capped and ended by :attr:`streams`.
    """

    def __init__(
        self,
        driver: str,
        pool: DevicePool,
        calls: ClaimCalls,
        *,
        pool_name: str,
        on_prepare: PrepareHook | None = None,
    ) -> None:
        self.driver = driver
        self.pool = pool
        self.calls = calls
        self.pool_name = pool_name
        self._on_prepare = on_prepare
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
        self.pool.interrupt()

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
            driver = self.driver
            try:
                results = self.calls.prepare(refs, work_timeout(context.time_remaining()))
                if len(results) != len(refs):
                    raise RuntimeError(f"the claim calls answered {len(results)} of {len(refs)}")
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
        if result.error:
            self._call_prepare_hook("error", result.reason or "internal")
            # A claim's own failure (refused, not read) is logged here, clipped as it is
            # answered; the driver part logs its own (the checkpoint, a bug) with their cause.
            if result.reason not in NOT_REFUSALS:
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
        self._call_prepare_hook("ok", "")

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
                errors = self.calls.unprepare(refs, work_timeout(context.time_remaining()))
                if len(errors) != len(refs):
                    raise RuntimeError(f"the claim calls answered {len(errors)} of {len(refs)}")
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
        now = int(time.time())
        response = health_pb.NodeWatchResourcesResponse()
        with self._lock:
            devices = self.pool.devices
            for device in devices.values():
                health, message, since = self._status(device, now)
                response.devices.add(
                    device=health_pb.DeviceIdentifier(
                        pool_name=self.pool_name, device_name=device.name
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
            self.pool,
            context,
            self.health_response,
            what=f"device health of DRA driver {self.driver}",
            resend_seconds=HEALTH_RESEND_SECONDS,
        )

    def _call_prepare_hook(self, outcome: str, reason: str) -> None:
        what = f"prepare hook of {self.driver}"
        call_hook(self._on_prepare, outcome, reason, what=what, logger=log)
