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

Two instances of one driver (a rolling update with ``maxSurge``, kubelet >= 1.33) register side
by side when their sockets have distinct names: :func:`registration_socket` names the
registration socket after the pod's UID, ``<driver>-<uid>-reg.sock``, or, when that path
would not fit a unix socket address, after a digest of the UID, then of the driver and the
UID (the names Kubernetes' helper library gives), and :func:`endpoint_socket` the DRA socket,
``dra-<uid>.sock``. :func:`newer_siblings` finds the
registration sockets of the same driver made after ours: the instance that replaces us;
:func:`older_siblings` those made before ours that are still served: the instance we replace.
:func:`watch_until` waits for a look at them to answer, woken by inotify and, through
:func:`server_ended`, by the end of a sibling's process, which leaves its files as they were.

The kubelet's error text is input like any other: it is kept quoted (control characters
escaped) and cut (:func:`~cdi_gen.errors.quote`), so a megabyte of it with newlines becomes
neither a huge log line nor forged log lines.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from cdi_gen._proto.pluginregistration.v1 import api_pb2
from cdi_gen.errors import quote
from cdi_gen.kubelet.boundary import wake
from cdi_gen.kubelet.socketwatch import SocketWatch
from cdi_gen.kubelet.supervisor import UNWATCHED_INTERVAL, WATCH_INTERVAL
from cdi_gen.kubelet.transport import MAX_SOCKET_PATH, listening
from cdi_gen.waits import first_of

__all__ = [
    "DRA_PLUGIN_TYPE",
    "SUPPORTED_SERVICES",
    "Notice",
    "PluginWatcherRegistrar",
    "RegistrationService",
    "endpoint_socket",
    "hashed_name",
    "newer_siblings",
    "older_siblings",
    "registration_socket",
    "server_ended",
    "watch_until",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

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
_SUFFIX = "-reg.sock"


def hashed_name(*parts: str, size: int) -> str:
    """The first ``size`` bytes of the SHA-256 of ``parts`` (joined by NUL), base64url
    without padding: a short file-name-safe stand-in for a name too long to use."""
    digest = hashlib.sha256("\0".join(parts).encode()).digest()[:size]
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def registration_socket(folder: Path, driver: str, pod_uid: str | None) -> Path:
    """The registration socket of ``driver`` in the plugin watcher's ``folder``: one per
    node without a pod UID, else one per pod (see the module docstring). A path that no name
    keeps short enough is returned as it is: the transport refuses it, naming it."""
    if pod_uid is None:
        return Path(folder) / f"{driver}{_SUFFIX}"
    candidates = (
        f"{driver}-{pod_uid}{_SUFFIX}",
        f"{driver}-{hashed_name(pod_uid, size=8)}{_SUFFIX}",
        f"dra-{hashed_name(driver, pod_uid, size=16)}{_SUFFIX}",
    )
    for name in candidates:
        path = Path(folder) / name
        if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
            return path
    return Path(folder) / candidates[-1]


def endpoint_socket(folder: Path, pod_uid: str | None) -> Path:
    """The endpoint a DRA driver registers, in its plugin ``folder``: ``dra.sock`` without a
    pod UID, else ``dra-<uid>.sock``, or ``dra-<digest of the uid>.sock`` where that path
    would be too long for a unix socket address."""
    if pod_uid is None:
        return Path(folder) / "dra.sock"
    path = Path(folder) / f"dra-{pod_uid}.sock"
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return path
    return Path(folder) / f"dra-{hashed_name(pod_uid, size=16)}.sock"


def _siblings(ours: Path, driver: str) -> list[tuple[int, str, Path]]:
    """The registration sockets beside ``ours`` of other instances of ``driver``: (change time,
    name, path). Only names that carry the driver count: the shortest form
    (``dra-<digest>-reg.sock``) does not say whose it is, and two instances of one driver on
    one node get the same form."""
    found = []
    try:
        entries = list(os.scandir(ours.parent))
    except OSError:
        return []
    for entry in entries:
        name = entry.name
        if name == ours.name or not (name.startswith(f"{driver}-") and name.endswith(_SUFFIX)):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode):
            found.append((st.st_ctime_ns, name, Path(entry.path)))
    return found


def newer_siblings(ours: Path, driver: str, since_ns: int) -> list[Path]:
    """The registration sockets beside ``ours`` of another instance of ``driver`` made after
    ours (bound at ``since_ns``, a change time: when a socket was bound), newest first. A
    socket left by an instance killed before ours started is older, so never taken for our
    successor; two bound within one clock tick are ordered by name, so that both instances
    agree which is the newer."""
    mine = (since_ns, ours.name)
    found = [(t, name, path) for t, name, path in _siblings(ours, driver) if (t, name) > mine]
    return [path for _, _, path in sorted(found, reverse=True)]


def older_siblings(ours: Path, driver: str, since_ns: int | None) -> list[Path]:
    """The registration sockets beside ``ours`` of another instance of ``driver`` that is
    still serving and was bound before ours (at ``since_ns``; None, ours not served: every
    one), oldest first: the instances we replace. A socket nobody listens on any more (its
    instance was killed) is none."""
    found = [
        (t, name, path)
        for t, name, path in _siblings(ours, driver)
        if (since_ns is None or (t, name) < (since_ns, ours.name)) and listening(path)
    ]
    return [path for _, _, path in sorted(found)]


async def watch_until(
    folders: Sequence[Path],
    look: Callable[[], _T | None],
    *,
    served: Callable[[], Sequence[Path]] = tuple,
) -> _T:
    """Wait until ``look()`` answers something other than None; that answer. Looked at
    whenever an entry of one of ``folders`` changes (inotify), whenever the server of one of
    the sockets ``served()`` names (asked after each look) closes a connection held to it
    (its process ended: a kill leaves its files as they were), else every
    :data:`~cdi_gen.kubelet.supervisor.WATCH_INTERVAL` (often while one cannot be watched)."""
    woken = asyncio.Event()
    watch = SocketWatch.of(asyncio.get_running_loop())
    handle = watch.follow((), woken.set, folders=folders)
    try:
        while True:
            woken.clear()  # before the look: a socket made after it wakes us again
            interval = WATCH_INTERVAL if watch.arm() else UNWATCHED_INTERVAL
            found = look()
            if found is not None:
                return found
            await first_of(woken.wait(), *map(server_ended, served()), timeout=interval)
    finally:
        watch.unfollow(handle)


async def server_ended(path: Path) -> None:
    """Return once the server on unix socket ``path`` closes a connection made to it (at
    once when none can be made). Its process ending closes it, however it ends. A live
    gRPC server keeps it open (it sends its settings and waits for ours) until it gives up
    on it, which only costs one more look and a new connection."""
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.setblocking(False)
        with contextlib.suppress(OSError):
            await loop.sock_connect(connection, os.fsencode(path))
            while await loop.sock_recv(connection, 4096):
                pass


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
                    # Not wait_for, which on Python 3.11 loses a cancellation that comes as
                    # the event is set.
                    async with asyncio.timeout(left):
                        await event.wait()
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
