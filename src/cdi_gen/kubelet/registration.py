"""Registering a DRA driver through the kubelet's plugin watcher.

Unlike the device plugin, a DRA driver does not call the kubelet: it serves
``pluginregistration.Registration`` on ``<plugins_registry>/<driver>-reg.sock`` and waits.
The kubelet watches that folder, dials each socket it finds (at its start, and whenever one
is created), asks :meth:`RegistrationService.get_info` what it is (a ``DRAPlugin`` named
after the driver, served on the ``dra.sock`` endpoint, with the gRPC services it speaks) and
tells the outcome through ``NotifyRegistrationStatus``.

:class:`PluginWatcherRegistrar` is the :class:`~cdi_gen.kubelet.supervisor.Registrar` of that
exchange. The kubelet's identity it reports is the count of GetInfo calls: a DRA driver
has no kubelet socket to look at, and a gRPC call over a unix socket does not say which
process made it. The plugin watcher calls GetInfo once for every registration it starts, so
a new GetInfo means a kubelet started registering us anew (a restarted kubelet does, as does
one that saw our socket re-created) and the NotifyRegistrationStatus after it is a new
registration. ``register()`` therefore returns the first notification it has not reported
yet, waiting (bounded) for one.

The kubelet's error text is input like any other: it is kept quoted (control characters
escaped) and cut (:func:`~cdi_gen.errors.quote`), so a megabyte of it with newlines becomes
neither a huge log line nor forged log lines.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from cdi_gen._proto.pluginregistration.v1 import api_pb2
from cdi_gen.errors import quote
from cdi_gen.kubelet.boundary import wake

__all__ = [
    "DRA_PLUGIN_TYPE",
    "SUPPORTED_SERVICES",
    "Notice",
    "PluginWatcherRegistrar",
    "RegistrationService",
]

log = logging.getLogger(__name__)

#: ``PluginInfo.type`` of a DRA driver.
DRA_PLUGIN_TYPE = "DRAPlugin"
#: The services on the DRA endpoint, newest DRAPlugin first: the kubelet takes the first of
#: the list it knows (``v1`` from 1.34, ``v1beta1`` before); the health service is optional,
#: used by kubelets with the ResourceHealthStatus gate (on from 1.36), and opened only when
#: listed: the 1.37 kubelet picks ``v1`` before ``v1alpha1``, older ones know only ``v1alpha1``.
SUPPORTED_SERVICES = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)
_SERVICE = "pluginregistration.Registration"


@dataclass(frozen=True, slots=True)
class Notice:
    """One NotifyRegistrationStatus: what the kubelet said (``error`` quoted and cut, "" when
    it gave none)."""

    registered: bool
    error: str


class RegistrationService:
    """The ``pluginregistration.Registration`` service of one DRA driver and what it heard.

    Handlers run on the gRPC server's threads; :class:`PluginWatcherRegistrar` reads the
    state from the event loop.
    """

    def __init__(self, driver: str, endpoint: Path) -> None:
        self.driver = driver
        self.endpoint = Path(endpoint)
        self._lock = threading.Lock()
        #: GetInfo calls so far.
        self.info_calls = 0
        #: NotifyRegistrationStatus calls so far, and the newest few, oldest first.
        self.notified = 0
        self.notices: list[Notice] = []
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        #: Called (on the server's thread) after each GetInfo: the kubelet's identity moved.
        self.on_info: Callable[[], None] | None = None

    def services(self) -> dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]]:
        methods = {
            "GetInfo": grpc.unary_unary_rpc_method_handler(
                self.get_info,
                request_deserializer=api_pb2.InfoRequest.FromString,
                response_serializer=api_pb2.PluginInfo.SerializeToString,
            ),
            "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                self.notify,
                request_deserializer=api_pb2.RegistrationStatus.FromString,
                response_serializer=api_pb2.RegistrationStatusResponse.SerializeToString,
            ),
        }
        return {_SERVICE: methods}

    def info(self) -> api_pb2.PluginInfo:
        return api_pb2.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=list(SUPPORTED_SERVICES),
        )

    def get_info(self, request: api_pb2.InfoRequest, context: grpc.ServicerContext) -> Any:
        with self._lock:
            self.info_calls += 1
            call = self.info_calls
        log.debug("kubelet asked for the registration of %s (call %d)", self.driver, call)
        if self.on_info is not None:
            self.on_info()
        return self.info()

    def notify(self, request: api_pb2.RegistrationStatus, context: grpc.ServicerContext) -> Any:
        error = quote(request.error) if request.error else ""
        with self._lock:
            notice = Notice(request.plugin_registered, error)
            self.notices.append(notice)
            del self.notices[:-16]  # the registrar reads only the newest
            self.notified += 1
            waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            wake(loop, event)
        return api_pb2.RegistrationStatusResponse()

    def newest_after(self, seen: int) -> tuple[int, Notice | None]:
        """The count of notifications and the newest one if more than ``seen`` arrived."""
        with self._lock:
            count = self.notified
            return count, (self.notices[-1] if count > seen and self.notices else None)

    def waiter(self) -> asyncio.Event:
        """An event set at the next notification (for the running loop)."""
        event = asyncio.Event()
        with self._lock:
            self._waiters.append((asyncio.get_running_loop(), event))
        return event

    def forget(self, event: asyncio.Event) -> None:
        """Drop a waiter that gave up, so that attempts without an answer pile nothing up."""
        with self._lock:
            self._waiters = [w for w in self._waiters if w[1] is not event]


class PluginWatcherRegistrar:
    """Registration through the plugin watcher: wait for the kubelet's notification.

    ``timeout`` bounds each wait for a notification the kubelet has not sent yet.
    """

    def __init__(self, service: RegistrationService, timeout: float = 10.0) -> None:
        self.service = service
        self.timeout = timeout
        #: Notifications already reported by :meth:`register`.
        self._reported = 0

    def kubelet_id(self) -> int | None:
        """The count of GetInfo calls: a new one means a new registration (see the module
        docstring); None until a kubelet has called."""
        calls = self.service.info_calls
        return calls or None

    def follow(self, wake: Callable[[], None]) -> tuple[Path, ...]:
        """No file tells of a new kubelet here: each GetInfo wakes the supervisor."""
        self.service.on_info = wake
        return ()

    async def register(self) -> str | None:
        service = self.service
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            event = service.waiter()  # before looking: a notification in between sets it
            try:
                count, notice = service.newest_after(self._reported)
                if notice is not None:
                    self._reported = count
                    if notice.registered:
                        return None
                    return f"the kubelet refused the registration: {_reason(notice)}"
                left = deadline - loop.time()
                if left <= 0:
                    return self._silence()
                try:
                    await asyncio.wait_for(event.wait(), left)
                except TimeoutError:
                    return self._silence()
            finally:
                service.forget(event)

    def _silence(self) -> str:
        last = self.service.notices[-1] if self.service.notices else None
        if last is not None and not last.registered:
            return (
                f"the kubelet refused the registration: {_reason(last)} "
                f"(no new attempt within {self.timeout:g}s)"
            )
        return (
            f"the kubelet called GetInfo on the registration socket but no "
            f"NotifyRegistrationStatus within {self.timeout:g}s"
        )


def _reason(notice: Notice) -> str:
    return notice.error or "(no reason given)"
