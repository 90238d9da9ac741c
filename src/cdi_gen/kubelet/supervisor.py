"""Keep a kubelet plugin served and registered across kubelet restarts.

Every kubelet plugin has the same life: serve its socket(s), make itself known to the
kubelet, and start over when the kubelet restarts, which wipes the plugin's socket files and
forgets every registration. What differs is how a plugin makes itself known, a
:class:`Registrar`: the device plugin calls ``Register`` on ``kubelet.sock``; a DRA driver
serves a registration socket in ``plugins_registry`` and waits for the kubelet's
``NotifyRegistrationStatus``.

:class:`Supervisor` runs that life on the event loop: serve first (the kubelet calls back
while registration is in flight), register in the background with backoff while the kubelet
is absent or refuses, then watch the socket files; when one of ours disappears or the
kubelet's identity changes (a kubelet restart does both), serve on fresh sockets and register
again. A restart noticed while registration is in flight abandons that attempt at once.
Failed attempts go through one :class:`~cdi_gen.retry.Retry` (waits never less than its
floor nor more than the plugin's bound, the agent's ``retry_max_seconds``; a repeat logged
once per doubling), and :attr:`Supervisor.serving` says whether every socket is served, with
a hook for what must follow it (a DRA driver offers its devices only while it serves).

It sleeps until told: inotify (:class:`~cdi_gen.kubelet.socketwatch.SocketWatch`) wakes it when
one of its socket files or one of the registrar's kubelet files changes, and the registrar
wakes it when the kubelet's identity changes without a file (a DRA driver's GetInfo count).
A look every ``watch_interval`` (a minute) is the safety net for what inotify cannot see (a
parent folder renamed); while a folder cannot be watched the look comes every
:data:`UNWATCHED_INTERVAL` instead.

Whether a new kubelet needs fresh sockets depends on the registration: the device plugin's
kubelet wipes its folder when it starts, so serving anew is required; the plugin watcher keeps
the registration socket and dials it again by itself, and a socket re-created for it would
only make it register the plugin once more (``serve_anew_on_restart=False``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal, Protocol, Self

from cdi_gen.kubelet.socketwatch import SocketWatch
from cdi_gen.kubelet.transport import UnixServer
from cdi_gen.logs import call_hook
from cdi_gen.retry import Backoff, Retry, describe
from cdi_gen.waits import first_of

__all__ = ["RegisterHook", "Registrar", "ServingHook", "SupervisedPlugin", "Supervisor"]

log = logging.getLogger(__name__)

#: ``on_register(ok, error)``: error is ``""`` on success, else why the kubelet said no.
RegisterHook = Callable[[bool, str], None]
#: ``on_serving(serving, why)``: whether every socket is served; why not (``""`` when it is).
ServingHook = Callable[[bool, str], None]
_Outcome = Literal["ok", "failed", "interrupted"]
#: Shortest interval between two looks at the socket files and the kubelet.
MIN_WATCH_INTERVAL = 0.01
#: Between two looks without an inotify event: only what inotify cannot see is left to them.
#: Each look wakes an idle agent (about 0.5 ms of CPU on a cold cache): every 5 s it was a
#: tenth of the agent's idle CPU (benchmarks/bench_footprint.py, the event loop's row).
WATCH_INTERVAL = 60.0
#: Between two looks while a followed folder cannot be watched (missing, no inotify): a
#: kubelet restart must still be noticed within a fraction of a second.
UNWATCHED_INTERVAL = 0.15


class Registrar(Protocol):
    """How one kubelet plugin makes itself known to the kubelet."""

    def kubelet_id(self) -> Hashable | None:
        """Identity of the kubelet registered with: it changes when the kubelet restarts;
        None while no kubelet can be reached (registration waits for one). Any value that
        compares equal while the kubelet stays the same (a socket file's identity, a count
        of the kubelet's calls)."""
        ...

    def follow(self, wake: Callable[[], None]) -> Sequence[Path]:
        """The files whose change may change :meth:`kubelet_id` (the supervisor follows them
        through inotify); the registrar calls ``wake()``, from any thread, when the
        identity may have changed without a file changing."""
        ...

    async def register(self) -> str | None:
        """One attempt, bounded in time; None on success, else why it failed."""
        ...


class Supervisor:
    """Serve ``servers``, register through ``registrar``, follow kubelet restarts.

    ``watch_interval`` is how often the socket files are looked at without an inotify event
    (never more often than :data:`MIN_WATCH_INTERVAL`), ``max_backoff`` bounds the wait
    between failed attempts (a :class:`~cdi_gen.retry.Backoff` from 0.1 s: never a shorter
    wait, whatever is asked); a failure that repeats is logged once per doubling of its attempts.
    ``on_register`` is called on the loop after each attempt; its exceptions are logged and
    ignored. With ``serve_anew_on_restart`` False, a new kubelet identity means registering
    again on the same sockets (a socket that is gone is still served anew).
    """

    def __init__(
        self,
        name: str,
        servers: Sequence[UnixServer],
        registrar: Registrar,
        *,
        on_register: RegisterHook | None = None,
        watch_interval: float = WATCH_INTERVAL,
        max_backoff: float = 2.0,
        serve_anew_on_restart: bool = True,
    ) -> None:
        self.name = name
        self.servers = tuple(servers)
        self.registrar = registrar
        self._on_register = on_register
        # A poll interval of 0 would spin the loop.
        self._watch_interval = max(watch_interval, MIN_WATCH_INTERVAL)
        #: Serving and registering again: waits from 0.1 s up to ``max_backoff``.
        self.retrying = Retry(Backoff(0.1, max_backoff), logger=log)
        self._serve_anew = serve_anew_on_restart
        self._task: asyncio.Task[None] | None = None
        self._registered = asyncio.Event()
        #: Set when something the supervisor follows may have changed.
        self._wake = asyncio.Event()
        self._watch: tuple[SocketWatch, int] | None = None
        #: Successful registrations so far (a kubelet restart adds one).
        self.registrations = 0
        #: Whether every socket is served (between a start and a stop, unless serving anew
        #: failed), and who is told when that changes (exceptions logged and ignored).
        self.serving = False
        self.on_serving: ServingHook | None = None

    async def start(self) -> None:
        """Serve every socket, then register in the background. Raises
        :class:`~cdi_gen.errors.RegistrationError` when a socket cannot be served."""
        if self._task is not None:
            return
        for server in self.servers:
            server.start()
        self._set_serving(True, "")
        self._follow()
        self.retrying.succeeded()  # a new start: its failures are new ones
        self._task = asyncio.create_task(self._run(), name=f"kubelet plugin {self.name}")

    async def stop(self, grace: float = 1.0) -> None:
        """Stop registering and serving; remove our socket files. Never raises when stopped."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # Not suppress(CancelledError): that would also swallow a cancel of our caller.
            await asyncio.gather(task, return_exceptions=True)
        if self._watch is not None:
            watch, handle = self._watch
            self._watch = None
            watch.unfollow(handle)
        await self._stop_servers(grace)
        self._registered.clear()
        self._set_serving(False, "stopped")

    async def wait_registered(self) -> None:
        """Wait until the kubelet has accepted the current registration."""
        await self._registered.wait()

    def _follow(self) -> None:
        """Be woken by inotify when a socket or kubelet file changes, and by the registrar."""
        loop = asyncio.get_running_loop()
        wake = self._wake

        def from_any_thread() -> None:
            # The registrar calls from gRPC threads, maybe as the loop closes: then nobody
            # waits, and the kubelet's call must not fail for it.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)

        files = [s.path for s in self.servers]
        files += self.registrar.follow(from_any_thread)
        watch = SocketWatch.of(loop)
        self._watch = watch, watch.follow(files, wake.set)

    async def _stop_servers(self, grace: float, *, release: bool = True) -> None:
        await asyncio.gather(*(s.stop(grace, release=release) for s in self.servers))

    async def _restart_servers(self) -> None:
        # The names stay ours in between: no other process takes them while we serve anew.
        await self._stop_servers(grace=0.2, release=False)
        try:
            for server in self.servers:
                server.start()
        except Exception as exc:
            self._set_serving(False, describe(exc))
            raise
        self._set_serving(True, "")

    def _set_serving(self, serving: bool, why: str) -> None:
        if serving == self.serving:
            return
        self.serving = serving
        if self.on_serving is None:
            return
        try:
            self.on_serving(serving, why)
        except Exception:
            log.exception("serving hook of %s failed", self.name)

    def _gone(self) -> bool:
        return any(s.gone() for s in self.servers)

    async def _run(self) -> None:
        retrying = self.retrying
        fresh_servers = False
        while True:
            try:
                outcome, kubelet_id, error = await self._register_once(fresh_servers)
                fresh_servers = False
            except Exception as exc:
                # Serving failed (folder gone, bind refused...): keep trying, the kubelet
                # folder may come back; the hook lets the agent decide to give up.
                why = describe(exc)
                retrying.failed(
                    why,
                    "kubelet plugin %(name)s cannot serve (attempt %(attempt)d, next in "
                    "%(delay)gs): %(why)s",
                    name=self.name,
                )
                self._call_hook(False, why)
                await asyncio.sleep(retrying.delay)
                continue
            if outcome == "interrupted":
                # The kubelet restarted while registration was in flight: its answer no
                # longer matters (it may never come, the kubelet dialling a socket it wiped).
                log.info("kubelet restarted during registration; registering %s again", self.name)
                fresh_servers = self._serve_anew
                continue
            restarted = functools.partial(self._kubelet_restarted, kubelet_id)
            if outcome == "failed":
                retrying.failed(
                    error,
                    "registering %(name)s with the kubelet failed (attempt %(attempt)d, next "
                    "in %(delay)gs): %(why)s",
                    level=logging.WARNING,
                    name=self.name,
                )
                # Retry after the backoff, or at once when the kubelet is no longer the one
                # just tried. Its identity was taken before the attempt: read after the
                # failure it could already be the new kubelet's, which would then look
                # unchanged and cost the whole backoff.
                await self._poll(restarted, retrying.delay)
                continue
            retrying.succeeded()
            await self._poll(restarted)
            log.info("kubelet restarted; registering %s again", self.name)
            self._registered.clear()
            fresh_servers = self._serve_anew

    async def _register_once(self, fresh_servers: bool) -> tuple[_Outcome, Hashable | None, str]:
        """Serve anew if asked or if a socket is gone, wait for a kubelet, register once.

        Return the outcome, the kubelet identity tried (read before the attempt) and why it
        failed: ``ok``, ``failed`` (the kubelet said no or was unreachable) or
        ``interrupted`` (a socket or the kubelet was replaced while registration was in
        flight).
        """
        registrar = self.registrar
        while True:
            if fresh_servers or self._gone():
                await self._restart_servers()
                fresh_servers = False
            # A socket wiped before any kubelet came is served again now, not once one
            # comes (the plugin watcher cannot even find a registration socket that is gone).
            await self._poll(lambda: registrar.kubelet_id() is not None or self._gone())
            if not self._gone():
                break
        kubelet_id = registrar.kubelet_id()
        error, _ = await first_of(
            registrar.register(),
            self._poll(functools.partial(self._kubelet_restarted, kubelet_id)),
        )
        if isinstance(error, asyncio.CancelledError):
            self._registered.clear()
            return "interrupted", kubelet_id, ""
        if isinstance(error, BaseException):
            raise error
        if error is not None:
            # An empty answer is still a refusal, and must say so.
            error = error or "refused without a reason"
            self._call_hook(False, error)
            return "failed", kubelet_id, error
        self._call_hook(True, "")
        self.registrations += 1
        self._registered.set()
        log.info("registered %s with the kubelet", self.name)
        return "ok", kubelet_id, ""

    def _kubelet_restarted(self, registered_with: Hashable | None) -> bool:
        if self._gone():
            return True
        current = self.registrar.kubelet_id()
        return current is not None and current != registered_with

    async def _poll(self, done: Callable[[], bool], limit: float | None = None) -> None:
        """Return when ``done()`` holds or ``limit`` s pass. ``done()`` is checked when woken
        (inotify, the registrar) and at least every watch interval."""
        loop = asyncio.get_running_loop()
        deadline = None if limit is None else loop.time() + limit
        while True:
            # Cleared before the look: a change after it sets the event again.
            self._wake.clear()
            interval = self._watch_interval
            if self._watch is None or not self._watch[0].arm():
                interval = min(interval, UNWATCHED_INTERVAL)
            if done():
                return
            left = interval if deadline is None else min(deadline - loop.time(), interval)
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._wake.wait()

    def _call_hook(self, ok: bool, error: str) -> None:
        what = f"registration hook of {self.name}"
        call_hook(self._on_register, ok, error, what=what, logger=log)


class SupervisedPlugin:
    """What every kubelet plugin hands to its :class:`Supervisor`: its registrations,
    stopping, waiting for the kubelet, and ``async with``. A plugin sets ``_supervisor`` and
    defines :meth:`start` (what it does before serving differs)."""

    _supervisor: Supervisor

    @property
    def registrations(self) -> int:
        """Successful registrations so far (a kubelet restart adds one)."""
        return self._supervisor.registrations

    async def start(self) -> None:
        raise NotImplementedError

    @property
    def retrying(self) -> Retry:
        """The retry loop of serving and registering (its waits, its failures in a row)."""
        return self._supervisor.retrying

    @property
    def serving(self) -> bool:
        """Whether every socket of the plugin is served now."""
        return self._supervisor.serving

    def follow_serving(self, hook: ServingHook) -> None:
        """Have ``hook(serving, why)`` called on the loop whenever :attr:`serving` changes
        (what depends on the plugin, like the devices a DRA driver publishes, follows it)."""
        self._supervisor.on_serving = hook

    async def stop(self, grace: float = 1.0) -> None:
        """Stop registering, end the plugin's streams, stop serving, remove its sockets.

        In-flight unary calls get ``grace`` seconds. Never raises for an already stopped
        plugin.
        """
        await self._supervisor.stop(grace)

    async def wait_registered(self) -> None:
        """Wait until the kubelet has accepted the current registration."""
        await self._supervisor.wait_registered()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
