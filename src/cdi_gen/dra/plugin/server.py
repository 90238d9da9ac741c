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
beside the old one and the kubelet sends its calls to the newest; the old instance then hands
over (:class:`~cdi_gen.dra.plugin.handover.Handover`: the files beside the DRA socket that
say an instance is registered and has yielded the slices, its newer and older instances, and
the waits for them). :meth:`DraPlugin.hand_over`, at SIGTERM, keeps serving until a newer
instance is registered, bounded, before the stop removes only this instance's own sockets and
files (the agent skips the wait when its DaemonSet is being uninstalled: no successor comes).
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
from cdi_gen.dra.plugin.handover import Handover
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.dra.plugin.service import MAX_READING_CALLS, DraService, PrepareHook
from cdi_gen.errors import InvalidNameError, RegistrationError
from cdi_gen.kubelet.registration import (
    PluginWatcherRegistrar,
    RegistrationService,
    endpoint_socket,
    registration_socket,
)
from cdi_gen.kubelet.supervisor import WATCH_INTERVAL, RegisterHook, SupervisedPlugin, Supervisor
from cdi_gen.kubelet.transport import UnixServer
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
            driver, preparer, claims, pool=pool, max_reading_calls=max_reading_calls, status=status
        )
        self.pool_name = pool_name
        self.pod_uid = pod_uid
        # Each server checks its socket's path is short enough before anything is touched.
        self.socket_path = endpoint_socket(Path(plugins_dir) / driver, pod_uid)
        self.registration_socket = registration_socket(Path(registry_dir), driver, pod_uid)
        self._on_register = on_register
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
        #: What this instance knows of its driver's other instances (a rolling update).
        self.handover = Handover(driver, pod_uid, self.socket_path, self.registration_server)
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
        self.handover.forget()
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
        if ok:
            self.handover.mark_registered()
        if self._on_register is not None:
            self._on_register(ok, error)

    async def stop(self, grace: float = 1.0) -> None:
        # The files named after our sockets are ours only while we hold the names: a copy
        # refused them (a second one with our pod UID) must leave the running one's alone.
        ours = self.registration_server.lock.held()
        if ours:
            self.handover.registered_file.unlink(missing_ok=True)
        await super().stop(grace)
        # After the sockets: a newer instance never sees ours served and not yielded again.
        if ours:
            self.handover.yielded_file.unlink(missing_ok=True)

    async def hand_over(self, within: float = HANDOVER_SECONDS) -> bool:
        """Before a stop: keep serving until a newer instance has registered beside us, at
        most ``within`` seconds; whether one did. At once False without a pod UID (one
        instance per node: nobody to hand over to) or when not serving."""
        if self.pod_uid is None or not self.serving:
            return False
        try:
            async with asyncio.timeout(within):
                found = await self.handover.superseded()
        except TimeoutError:
            log.info(
                "DRA driver %s stopping: no newer instance registered within %gs",
                self.driver,
                within,
            )
            return False
        log.info("DRA driver %s hands over to %s", self.driver, found)
        return True
