"""``cdi-gen run``: the node agent. udev discovery → CDI spec files → the kubelet, through a
:class:`~cdi_gen.agent.frontend.Frontend` per class: a device plugin of its own
(:mod:`cdi_gen.deviceplugin.frontend`) or, for classes with ``api: dra``, the node's DRA
driver (:mod:`cdi_gen.dra.node`), one for all of them.

One asyncio loop runs everything; its consumers are tasks of one :class:`asyncio.TaskGroup`
(a consumer that fails stops the others, and the agent raises its error after a clean
shutdown). A record source (:class:`~cdi_gen.sources.RecordSource`: udev, or any other in
tests) delivers batches, :class:`Discovery` turns them into per-class changes, and each
:class:`~cdi_gen.agent.runner.ClassRunner` applies its class's changes on a task of its own (a class
that waits, for the API server or a slow folder, never delays another), in the order that
keeps the runtime and the kubelet consistent:

1. withdraw from ListAndWatch (or the ResourceSlices) every device that is gone or became
   unhealthy,
2. write the class's spec file (or remove it when no device is left),
3. advertise the new list (publish it in the DRA pool).

So a device's CDI entry is on disk before its ID is advertised, and its ID is withdrawn
before its entry leaves the spec. A spec write that fails (read-only folder, full disk)
leaves step 3 undone and is retried with backoff: the kubelet never sees a device the runtime
cannot resolve. Entries never pin major/minor for nodes that exist on the host, so a
re-plugged device with new numbers is injected with its current ones.

Each device is judged once, when it appears or changes, by the one spec path the CLI uses
too (:func:`~cdi_gen.discovery.spec.class_spec`), and its entry reused: re-writing a class's
spec after an event costs about one serialisation, done on the loop; the write and its fsyncs
run in a thread, so a slow disk never stalls ListAndWatch or Allocate. The settings come from
:class:`~cdi_gen.config.settings.Settings`.

Failures stop at the class boundary. A device that cannot be written (skipped by discovery,
invalid, missing a required extra host path under /dev or /sys, or needing a newer cdiVersion
than the class is pinned to or, unpinned, than the node's known runtimes read) is logged
once, counted in ``cdi_gen_failures_total{resource, reason}``, and left out of both the spec
and the list (``/readyz`` stays ready, naming a class degraded by this node's runtimes or
paths);
a class whose spec write or frontend start fails is retried through
:class:`~cdi_gen.retry.Retry` (a line per doubling of the attempts, each counted, the waits
bounded by ``retry_max_seconds``) and reported by
``/readyz``, naming the cause, until it works; anything unexpected in one class is logged
with its traceback, counted as ``internal`` and leaves the other classes running.

The agent builds each class's runner and frontend and lends them :class:`~cdi_gen.retry.Tools`
(metrics, the retries' bound, its task group); they never hold the agent. A device-plugin
class gets a :class:`~cdi_gen.deviceplugin.board.DeviceBoard` (its plugin serves it); a DRA
class publishes into the driver's pool instead. On shutdown the boards close, every frontend
stops, then the specs are removed when ``cleanup_on_exit`` says so (or on an uninstall), unless
a newer agent took them over.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import signal
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from cdi_gen.agent.frontend import DeviceSink, Frontend
from cdi_gen.agent.privileges import Privileges
from cdi_gen.agent.runner import ClassRunner
from cdi_gen.cdi import atomicfile, writer
from cdi_gen.cdi.registry import SpecCache
from cdi_gen.cdi.store import SpecStore
from cdi_gen.config.models import AgentConfig, ClassConfig
from cdi_gen.config.settinggroups import parse_address
from cdi_gen.config.settings import Settings
from cdi_gen.deviceplugin.board import DeviceBoard
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.errors import ConfigError, SpecWriteError, quote
from cdi_gen.logs import fields
from cdi_gen.metrics import Metrics, serve_http, serve_http_unix
from cdi_gen.retry import Failures, Tools, describe
from cdi_gen.sources import RecordSource

if TYPE_CHECKING:
    from pathlib import Path

    from cdi_gen.agent.whenback import BackPolicy, OnOutcomes
    from cdi_gen.cdi.runtimes import Ceiling
    from cdi_gen.dra.node import DraDriver
    from cdi_gen.dra.plugin.uninstall import Owner

log = logging.getLogger("cdi_gen.agent.agent")

#: Each stops the agent cleanly (sockets removed, specs kept or removed per
#: ``cleanup_on_exit``). SIGHUP included: its default action killed the agent and left both
#: behind. It means "the terminal or session went away", so a stop is what a user running
#: ``cdi-gen run`` by hand expects; nothing sends it to a pod for a reload (a changed config
#: rolls the DaemonSet), and a reload of udev alone would look like one of the config.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Longest the start-up scan of our spec folder (stale specs of removed classes) may take.
FOLDER_SCAN_SECONDS = 10.0
#: Between two tries of a metrics address the replaced agent still holds (a rolling update).
LISTEN_RETRY_SECONDS = 0.5


class Agent:
    """The node agent. ``await agent.run()`` until :meth:`stop` or SIGTERM/SIGINT/SIGHUP."""

    def __init__(
        self,
        config: AgentConfig,
        settings: Settings,
        source: RecordSource | None = None,
        *,
        ceiling: Ceiling | None = None,
        on_when_back: OnOutcomes | None = None,
    ) -> None:
        self.config = config
        self.on_when_back = on_when_back  # each whenBack's outcomes (agent/whenback.py)
        #: The node's runtimes' newest cdiVersion, when known (cli/run.py finds it).
        self.ceiling = ceiling
        self.settings = settings
        self.metrics = Metrics()
        self.discovery = Discovery(config)
        self.spec_cache = SpecCache(settings.paths.for_runtime())
        #: The class specs as written: a DRA claim's own spec is built from them in memory.
        #: The spec cache learns every write the agent makes, so the check of Allocate and
        #: NodePrepareResources after one scans nothing; without a kubelet nothing checks.
        self.specs = SpecStore(self.spec_cache if settings.kubelet.enabled else None)
        self._background = _Background()
        #: What the runners and frontends are lent: nothing that holds the agent itself.
        self.tools = Tools(
            metrics=self.metrics,
            retry_max_seconds=settings.retry.max_seconds,
            spawn=self._background.spawn,
        )
        #: The DRA driver of the classes with ``api: dra`` (none in host mode). Imported
        #: only then: an agent of device plugins alone never loads the DRA modules.
        self.dra: DraDriver | None = None
        if settings.kubelet.enabled and any(c.api == "dra" for c in config.classes):
            from cdi_gen.dra.node import DraDriver

            self.dra = DraDriver(config, settings, self.tools, self.spec_cache, self.specs)
        #: What it may do to a running container: asked once, if a class's whenBack is not keep.
        self.privileges: Privileges | None = None
        if settings.kubelet.enabled and any(c.when_back != "keep" for c in config.classes):
            self.privileges = Privileges.now(
                settings.kubelet.pod_resources_socket, settings.runtimes.cri_sockets
            )
        self.runners = {c.name: self._runner(c) for c in config.classes}
        #: The DaemonSet running the agent: read at start by a DRA agent, asked at exit.
        self.owner: Owner | None = None
        self._stop = asyncio.Event()
        #: The records' source; udev (started in :meth:`run`) unless one is given.
        self.source = source
        self._http: asyncio.Server | None = None
        #: The endpoints on ``--probe-socket``: this pod's agent, whoever holds the address.
        self._probe: asyncio.Server | None = None
        self.started = asyncio.Event()

    def _runner(self, config: ClassConfig) -> ClassRunner:
        """The class's runner, with its frontend when a kubelet is used: the DRA driver for
        ``api: dra`` (its pool too), else a device plugin of its own serving the class's
        board."""
        if config.api == "dra":
            return self._class_runner(config, sink=self.dra, frontend=self.dra)
        board = DeviceBoard()
        frontend: Frontend | None = None
        if self.settings.kubelet.enabled:
            # Imported here: an agent in host mode never needs it.
            from cdi_gen.deviceplugin.frontend import DevicePluginFrontend

            resource = f"{self.config.vendor}/{config.name}"
            frontend = DevicePluginFrontend(
                self.config.vendor,
                config,
                board,
                resolver=self.spec_cache,
                settings=self.settings,
                tools=self.tools,
                failures=Failures(self.metrics, resource),
            )
        return self._class_runner(config, board=board, frontend=frontend)

    def _class_runner(
        self,
        config: ClassConfig,
        *,
        board: DeviceBoard | None = None,
        sink: DeviceSink | None = None,
        frontend: Frontend | None = None,
    ) -> ClassRunner:
        return ClassRunner(
            config,
            vendor=self.config.vendor,
            spec_dir=self.settings.paths.spec_dir,
            instance=self.settings.instance,
            tools=self.tools,
            board=board,
            sink=sink,
            specs=self.specs,
            frontend=frontend,
            ceiling=self.ceiling,
            back=self._back(config),
        )

    def _back(self, config: ClassConfig) -> BackPolicy | None:
        """The class's ``whenBack`` as this agent can apply it (None: ``keep`` configured)."""
        if config.when_back == "keep":
            return None
        from cdi_gen.agent.whenback import announced, class_policy

        dra = self.dra if config.api == "dra" else None
        driver = None if dra is None else (dra.name, dra.node, self.config.class_names)
        policy = class_policy(
            config, self.config.vendor, self.privileges, self.settings.kubelet.pod_resources_socket,
            driver=driver, metrics=self.metrics, on_outcomes=self.on_when_back,
        )  # fmt: skip
        if dra is not None:
            # The claims and pods holding it are told what was done (Events, claim status).
            policy.on_outcomes = announced(dra, config.name, policy.policy, self.on_when_back)
        return policy

    def stop(self) -> None:
        """Ask :meth:`run` to shut down (safe from a signal handler)."""
        self._stop.set()

    def ready(self) -> tuple[bool, str]:
        """For ``/readyz``: every spec in place and every class served and registered."""
        if not self.started.is_set():
            return False, "starting"
        # The DRA classes share their driver's line: named once.
        waiting = dict.fromkeys(why for r in self.runners.values() for why in r.waiting())
        if waiting:
            return False, "waiting for " + ", ".join(waiting)
        degraded = [why for r in self.runners.values() if (why := r.degraded())]
        return True, "ready" + ("; degraded: " + ", ".join(degraded) if degraded else "")

    async def run(self) -> None:
        """Start everything, follow the records until stopped, then shut down cleanly.

        The consumers run as tasks of one :class:`asyncio.TaskGroup`: the record follower
        and the frontends still trying to start. Raises
        :class:`~cdi_gen.errors.DiscoveryError` when udev cannot be read at start (or its
        reading fails later), after the same clean shutdown.
        """
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.stop)
        try:
            async with asyncio.TaskGroup() as group:
                self._background.group = group
                await self._start()
                for runner in self.runners.values():
                    self.spawn(runner.follow(), f"changes of {runner.resource}")
                follower = group.create_task(self._follow_records(), name="records")
                await self._stop.wait()
                # The follower and the frontends still starting are cancelled: a source need
                # not end its batches on close (a recorded one may wait forever).
                self._close_source()
                follower.cancel()
                self._background.cancel()
        except BaseExceptionGroup as group_error:
            # One consumer failed (the others were cancelled): raise it as itself, so the
            # CLI maps it to its exit code.
            raise _first(group_error) from None
        finally:
            self._background.group = None
            self._close_source()
            await self._shutdown()
            for sig in STOP_SIGNALS:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.remove_signal_handler(sig)

    def _close_source(self) -> None:
        if self.source is not None:
            self.source.close()

    async def _start(self) -> None:
        settings = self.settings
        await self._serve_endpoints()
        # Off the event loop and bounded: /healthz is already served, and the folder may be
        # slow or hold anything.
        try:
            await asyncio.wait_for(asyncio.to_thread(self._remove_stale_specs), FOLDER_SCAN_SECONDS)
        except TimeoutError:
            log.error(
                "stale spec scan of %s took over %gs; going on without it",
                settings.paths.spec_dir,
                FOLDER_SCAN_SECONDS,
            )
        source = self.source
        if source is None:
            # Imported here: pyudev is loaded only by an agent that reads udev.
            from cdi_gen.sources.udev import UdevWatcher

            source = self.source = UdevWatcher(
                source=settings.udev_source or self.config.udev_source,
                subsystems=self.discovery.subsystems,
                interest=self.discovery.interest,
                wants=self.discovery.wants,
                resync_seconds=self.config.resync_seconds,
            )
        records = source.start()
        log.info(
            "udev monitor started",
            extra=fields(source=source.source, enumerated=len(records), classes=len(self.runners)),
        )
        for change in self.discovery.replace(records):
            await self.runners[change.class_name].apply(change, None)
        if settings.kubelet.enabled:
            await self._start_frontends()
        if self.dra is not None and settings.cluster.daemonset is not None:
            self._background.spawn(self._owner().learn(), "owner DaemonSet")
        self.started.set()

    async def _serve_endpoints(self) -> None:
        """/metrics, /healthz and /readyz on the probe socket and the metrics address."""
        settings = self.settings
        if settings.metrics.probe_socket is not None:
            self._probe = await self._serve_probe(settings.metrics.probe_socket)
        if settings.metrics.address:
            host, port = parse_address(settings.metrics.address)
            try:
                self._http = await serve_http(host, port, self.metrics, self.ready)
            except OSError as exc:  # in use, or an address this host does not have
                if exc.errno != errno.EADDRINUSE or settings.dra.pod_uid is None:
                    raise ConfigError(
                        f"--metrics-address {quote(settings.metrics.address)}: cannot listen: "
                        f"{os.strerror(exc.errno) if exc.errno else exc}"
                    ) from None
                # A rolling update with surge: the pod this one replaces shares the host's
                # network and holds the port until it exits (this pod's readiness probe asks
                # the probe socket; the older agent hands over once this one is registered).
                log.warning(
                    "metrics address in use (the agent this pod replaces?); served once free",
                    extra=fields(address=settings.metrics.address),
                )
                self._background.spawn(self._listen_later(host, port), "metrics address")
            else:
                log.info(
                    "serving /metrics /healthz /readyz",
                    extra=fields(address=settings.metrics.address),
                )

    async def _serve_probe(self, path: Path) -> asyncio.Server:
        try:
            server = await serve_http_unix(path, self.metrics, self.ready)
        except OSError as exc:
            raise ConfigError(f"--probe-socket {quote(str(path))}: cannot listen: {exc}") from None
        log.info("serving /metrics /healthz /readyz", extra=fields(socket=str(path)))
        return server

    async def _listen_later(self, host: str, port: int) -> None:
        """Serve the endpoints as soon as the address is free (see :meth:`_start`)."""
        while True:
            await asyncio.sleep(LISTEN_RETRY_SECONDS)
            try:
                self._http = await serve_http(host, port, self.metrics, self.ready)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    continue
                log.error("metrics address: cannot listen: %s", describe(exc))
                return
            log.info("serving /metrics /healthz /readyz", extra=fields(address=f"{host}:{port}"))
            return

    def _remove_stale_specs(self) -> None:
        spec_dir = self.settings.paths.spec_dir
        removed_temps = atomicfile.remove_stale_temps(spec_dir)
        if removed_temps:
            log.info("removed %d temporary files of an interrupted write", removed_temps)
        configured = {(self.config.vendor, c) for c in self.runners}
        instance = self.settings.instance or self.config.vendor
        for vendor, cls, error in writer.remove_unconfigured(
            spec_dir, configured, instance=instance
        ):
            if error is not None:
                log.error("cannot remove stale spec: %s", error)
                continue
            log.info(
                "stale spec removed: class no longer configured",
                extra=fields(resource=f"{vendor}/{cls}", dir=str(spec_dir)),
            )

    async def _start_frontends(self) -> None:
        # Each start is one attempt; the retries run on the group (see Retry.until).
        for runner in self.runners.values():
            await runner.start()

    @property
    def running(self) -> bool:
        """Whether :meth:`run` is between start and shutdown (its task group is open)."""
        return self._background.group is not None

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``work`` as a task of the agent's group (cancelled on stop)."""
        self._background.spawn(work, name)

    async def _follow_records(self) -> None:
        source = self.source
        assert source is not None
        async for batch in source.batches():
            try:
                if batch.full:
                    self.metrics.resyncs.labels("resync").inc()
                    changes = self.discovery.replace(batch.records)
                else:
                    for record in batch.records:
                        self.metrics.udev_events.labels(record.action or "change").inc()
                    changes = self.discovery.apply(batch.records)
            except Exception:
                # Not tied to one class: counted under "*"; a full enumeration starts afresh.
                self.metrics.failures.labels("*", "internal").inc()
                log.exception("discovery failed on a batch of %d records", len(batch.records))
                source.request_resync()
                continue
            for change in changes:
                # Each class on its own task (see ClassRunner.follow): never awaited here.
                self.runners[change.class_name].changes.put_nowait((change, batch.received or None))

    async def _shutdown(self) -> None:
        await self._background.cancel_and_wait()
        # Asked before anything stops: an uninstalled DRA driver has no successor to serve for
        # (a rolling update's newer pod), so it stops at once instead of waiting for one.
        verdict = None if self.settings.cleanup_on_exit else await self._owner().ask()
        if self.dra is not None and verdict is not None and verdict.uninstall:
            await self.dra.stop(successor=False)
        await self._stop_frontends()
        # Nothing serves the kubelet any more: what is cleaned up after the agent goes here.
        # Not the spec files a newer agent took over (a rolling update with surge): it writes
        # the same files under the same names, and does not write them again while they hold
        # what it would write, so removing them would leave its devices without a spec.
        if self.dra is not None and self.dra.handed_over:
            log.info("spec files kept at exit: the newer agent that took over serves them")
        elif verdict is None or await self._owner().finish(
            verdict, None if self.dra is None else self.dra.name
        ):
            await self._remove_specs()
        if self._http is not None:
            self._http.close()
            await self._http.wait_closed()
        if self._probe is not None:
            self._probe.close()
            await self._probe.wait_closed()
            probe_socket = self.settings.metrics.probe_socket
            with contextlib.suppress(OSError):  # the pod's own folder: nobody else's file
                if probe_socket is not None and probe_socket.is_socket():
                    probe_socket.unlink()
        log.info("stopped")

    async def _stop_frontends(self) -> None:
        for runner in self.runners.values():
            runner.close()
        # Every frontend at once (the DRA classes' shared driver stops once); none raises.
        await asyncio.gather(*(r.stop() for r in self.runners.values()))

    async def _remove_specs(self) -> None:
        for runner in self.runners.values():
            with contextlib.suppress(SpecWriteError):
                if await asyncio.to_thread(
                    functools.partial(writer.remove_spec, instance=self.settings.instance),
                    self.settings.paths.spec_dir,
                    self.config.vendor,
                    runner.config.name,
                ):
                    log.info("spec removed on exit", extra=fields(resource=runner.resource))

    def _owner(self) -> Owner:
        from cdi_gen.dra.plugin.uninstall import Owner

        self.owner = self.owner or Owner(self.settings)
        return self.owner


class _Background:
    """The agent's background tasks (retries, class followers): tasks of its group while
    :meth:`Agent.run` runs, cancelled on stop; work spawned outside a run is closed unrun."""

    def __init__(self) -> None:
        self.group: asyncio.TaskGroup | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        if self.group is None:
            work.close()
            return
        task = self.group.create_task(work, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()

    async def cancel_and_wait(self) -> None:
        self.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf exception of a (possibly nested) exception group."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
