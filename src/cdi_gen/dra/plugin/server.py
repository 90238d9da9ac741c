"""The kubelet side of the DRA driver: its sockets, its registration and the handover.

One :class:`DraPlugin` per node agent serves, on ``<kubelet plugins>/<driver>/dra.sock``, the
kubelet's DRA node service and the device health stream
(:class:`~cdi_gen.dra.plugin.service.DraService`, the gRPC side, and
:class:`~cdi_gen.dra.plugin.calls.ClaimCalls`, which reads the claims and calls the driver
part it is given, a :class:`~cdi_gen.dra.plugin.claims.ClaimPreparer`: the node's is
:class:`~cdi_gen.dra.driver.preparer.PoolPreparer`), and registers the driver through the
plugin watcher (:mod:`~cdi_gen.kubelet.registration`). The
:class:`~cdi_gen.kubelet.supervisor.Supervisor` keeps both sockets served and the driver
registered across kubelet restarts.

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
node's slices at once). A successor counts only while its registration socket is served: one
killed leaves its files, and :meth:`DraPlugin.successors_gone` (a connection held to that
socket ends with its process) lets the older instance take the slices back. And
:meth:`DraPlugin.hand_over`, at SIGTERM, keeps serving until a newer instance is
registered, bounded, before the stop removes only this instance's own sockets and files
(the agent skips the wait when its DaemonSet is being uninstalled: no successor comes).
Its names are its own while it holds their locks
(:class:`~cdi_gen.kubelet.transport.NameLock`): a second copy with the same pod UID is
refused before it touches any of them. Either instance may get any call: the driver part
shares its state with the other through files, under a lock.

Calls run on the gRPC server's threads (see :mod:`~cdi_gen.kubelet.transport`). A slow API
server must not take them all: the claim calls let at most
:data:`~cdi_gen.dra.plugin.service.MAX_READING_CALLS` calls wait for it at once, so the
claims answered from the checkpoint and the unprepare calls always find a thread.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from cdi_gen._proto.drahealth.v1alpha1 import api_pb2 as health_pb
from cdi_gen.dra.plugin.calls import ClaimCalls
from cdi_gen.dra.plugin.claims import ClaimPreparer, ClaimReader
from cdi_gen.dra.plugin.claimstatus import ClaimStatus
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.dra.plugin.service import MAX_READING_CALLS, DraService, PrepareHook
from cdi_gen.errors import InvalidNameError, RegistrationError
from cdi_gen.kubelet.registration import (
    PluginWatcherRegistrar,
    RegistrationService,
    endpoint_socket,
    newer_siblings,
    older_siblings,
    registration_socket,
    watch_until,
)
from cdi_gen.kubelet.supervisor import WATCH_INTERVAL, RegisterHook, SupervisedPlugin, Supervisor
from cdi_gen.kubelet.transport import UnixServer, check_socket_path, listening
from cdi_gen.modes import make_folder
from cdi_gen.names import is_dns_subdomain

__all__ = ["HANDOVER_SECONDS", "DraPlugin"]

log = logging.getLogger(__name__)

#: Longest an instance stopping keeps serving for its successor to be registered (a rolling
#: update): within the DRA pod's grace period (30 s in the manifests), which also covers the
#: stop. It covers the newer one's start: that one is Ready only once it has published, after
#: this one has handed the slices over (see the module docstring).
HANDOVER_SECONDS = 20.0


class DraPlugin(SupervisedPlugin):
    """The DRA driver ``driver`` as the kubelet sees it, for the pool ``pool_name``.

    ``preparer`` is the driver part: every prepare and unprepare is its answer, given the
    claims read through ``claims`` (at most ``max_reading_calls`` calls wait for the API
    server at once); with ``status``, a prepared claim's devices go into its status. ``pool``
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
        claims: ClaimReader,
        pool_name: str,
        registry_dir: Path,
        plugins_dir: Path,
        pod_uid: str | None = None,
        on_register: RegisterHook | None = None,
        on_prepare: PrepareHook | None = None,
        status: ClaimStatus | None = None,
        max_reading_calls: int = MAX_READING_CALLS,
        watch_interval: float = WATCH_INTERVAL,
        max_backoff: float = 2.0,
        register_timeout: float = 10.0,
    ) -> None:
        if not is_dns_subdomain(driver):
            raise InvalidNameError("DRA driver name", driver, "must be a DNS subdomain")
        self.driver = driver
        self.pool = pool
        #: The generic part of every prepare and unprepare, around the driver part.
        self.calls = ClaimCalls(
            driver,
            preparer,
            claims,
            pool=pool,
            max_reading_calls=max_reading_calls,
            status=status,
        )
        self.pool_name = pool_name
        self.pod_uid = pod_uid
        self.socket_path = endpoint_socket(Path(plugins_dir) / driver, pod_uid)
        self.registration_socket = registration_socket(Path(registry_dir), driver, pod_uid)
        check_socket_path(self.socket_path)
        check_socket_path(self.registration_socket)
        self._on_register = on_register
        #: Where this instance says the kubelet registered it (with a pod UID only).
        self.registered_file = (
            self.socket_path.parent / f"{self.registration_socket.name}.registered"
        )
        #: Where this instance says it writes no ResourceSlice any more (it handed over).
        self.yielded_file = self.socket_path.parent / f"{self.registration_socket.name}.yielded"
        self._service = DraService(
            driver, pool, self.calls, pool_name=pool_name, on_prepare=on_prepare
        )
        instance = pod_uid or ""
        self.server = UnixServer(
            self.socket_path,
            self._service.services,
            on_stop=self._service.end_streams,
            instance=instance,
        )
        self.registration = RegistrationService(driver, self.socket_path)
        self.registration_server = UnixServer(
            self.registration_socket, self.registration.services, instance=instance
        )
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
        """Take both sockets' names, load the driver part's state, serve both sockets, then
        register in the background.

        Raises what the driver part's ``load`` raises (a
        :class:`~cdi_gen.dra.driver.checkpoint.CheckpointError` when the checkpoint cannot be
        read as ours; it is left as it is) and :class:`~cdi_gen.errors.RegistrationError`
        when a socket cannot be served (:class:`~cdi_gen.errors.SocketInUseError` when
        another running copy of this instance serves it).
        """
        try:
            make_folder(self.socket_path.parent)
        except OSError as exc:
            raise RegistrationError(
                f"cannot create the DRA socket folder {str(self.socket_path.parent)!r}: {exc}"
            ) from exc
        # Both names ours before anything of this instance is touched (a second copy with
        # our pod UID stops here); then what an earlier run of this pod left (a crash) says
        # nothing of this one: registered and yielded anew.
        self.server.lock.acquire()
        self.registration_server.lock.acquire()
        self.calls.load()
        if self.pod_uid is not None:
            self.registered_file.unlink(missing_ok=True)
            self.yielded_file.unlink(missing_ok=True)
        await self._supervisor.start()
        log.info(
            "serving DRA driver %s on %s (registration %s), %d prepared claims",
            self.driver,
            self.socket_path,
            self.registration_socket,
            self.calls.count,
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
        # The files named after our sockets are ours only while we hold the names: a copy
        # refused them (a second one with our pod UID) must leave the running one's alone.
        ours = self.registration_server.lock.held()
        if ours:
            self.registered_file.unlink(missing_ok=True)
        await super().stop(grace)
        # After the sockets: a newer instance never sees ours served and not yielded again.
        if ours:
            self.yielded_file.unlink(missing_ok=True)

    def mark_yielded(self, yielded: bool = True) -> None:
        """Say, beside our DRA socket, that this instance writes no ResourceSlice any more
        (or, ``yielded`` False, that it writes them again: its successor is gone): the
        newer instance waits for it before it publishes (see :meth:`predecessors`)."""
        if self.pod_uid is None:
            return
        if yielded:
            self.yielded_file.write_bytes(b"")
        else:
            self.yielded_file.unlink(missing_ok=True)

    def successors(self) -> list[Path]:
        """The registration sockets of newer instances of this driver that the kubelet
        registered and that are still served, newest first (none without a pod UID, or while
        our own socket is not served). An instance killed leaves its files as they were: only
        a socket someone listens on says it runs."""
        served = self.registration_server.socket_id
        if self.pod_uid is None or served is None:
            return []
        folder = self.socket_path.parent
        return [
            path
            for path in newer_siblings(self.registration_socket, self.driver, served[2])
            if (folder / f"{path.name}.registered").exists() and listening(path)
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
        await watch_until(self._folders(), lambda: True if not self.predecessors() else None)

    async def superseded(self) -> Path:
        """Wait until a newer instance of this driver is registered beside us; its
        registration socket. Without a pod UID there is none: this waits until cancelled."""

        def newest() -> Path | None:
            found = self.successors()
            return found[0] if found else None

        return await watch_until(self._folders(), newest)

    async def successors_gone(self) -> None:
        """Wait until no newer instance of this driver is registered and served beside us
        (each stopped, or died: killed, it leaves its files, and the connection held to its
        registration socket tells at once)."""

        def gone() -> bool | None:
            if self.registration_server.socket_id is None:
                return None  # ours being served anew: no sibling can be told newer now
            return None if self.successors() else True

        await watch_until(self._folders(), gone, served=self.successors)

    def _folders(self) -> tuple[Path, Path]:
        return (self.registration_socket.parent, self.socket_path.parent)

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
