"""``cdi-gen run``: the node agent. udev discovery → CDI spec files → kubelet device plugins
and, for classes with ``api: dra``, the node's DRA driver (:mod:`cdi_gen.driver`).

One asyncio loop runs everything; its consumers are tasks of one :class:`asyncio.TaskGroup`
(a consumer that fails stops the others, and the agent raises its error after a clean
shutdown). A record source (:class:`~cdi_gen.sources.RecordSource`: udev, or any other in
tests) delivers batches, :class:`Discovery` turns them into per-class changes, and each
:class:`_ClassRunner` applies its class's changes on a task of its own (a class that waits, for
the API server or a slow folder, never delays another), in the order that keeps the runtime
and the kubelet consistent:

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
invalid, or needing a newer cdiVersion than the class is pinned to) is logged once, counted
in ``cdi_gen_failures_total{resource, reason}``, and left out of both the spec and the list;
a class whose spec write or plugin start fails is retried with backoff
(:mod:`cdi_gen.backoff`: a line per doubling of the attempts, each counted) and reported by
``/readyz``, naming the cause, until it works; anything unexpected in one class is logged
with its traceback, counted as ``internal`` and leaves the other classes running.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdi_gen.backoff import Backoff, describe
from cdi_gen.cdi import writer
from cdi_gen.cdi.codec import dump_document
from cdi_gen.cdi.registry import SpecCache
from cdi_gen.config.models import AgentConfig, ClassConfig
from cdi_gen.config.settings import Settings, parse_address
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.discovery.sharing import expand_change
from cdi_gen.discovery.spec import Verdicts, class_spec
from cdi_gen.errors import (
    CdiGenError,
    ConfigError,
    SpecWriteError,
    quote,
)
from cdi_gen.kubelet.board import DeviceBoard
from cdi_gen.kubelet.plugin import KubeletPlugin
from cdi_gen.logs import fields
from cdi_gen.metrics import Metrics, serve_http
from cdi_gen.model import AdvertisedDevice, ClassChange, DiscoveredDevice
from cdi_gen.modes import make_folder
from cdi_gen.sources import RecordSource

if TYPE_CHECKING:
    from cdi_gen.apiserver.uninstall import Owner
    from cdi_gen.driver import DraDriver

log = logging.getLogger("cdi_gen.agent")

#: Each stops the agent cleanly (sockets removed, specs kept or removed per
#: ``cleanup_on_exit``). SIGHUP included: its default action killed the agent and left both
#: behind. It means "the terminal or session went away", so a stop is what a user running
#: ``cdi-gen run`` by hand expects; nothing sends it to a pod for a reload (a changed config
#: rolls the DaemonSet), and a reload of udev alone would look like one of the config.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Longest the start-up scan of our spec folder (stale specs of removed classes) may take.
FOLDER_SCAN_SECONDS = 10.0


@dataclass(slots=True)
class _ClassRunner:
    """One class: its board, its plugin, its devices' verdicts and its pending spec write."""

    agent: Agent
    config: ClassConfig
    board: DeviceBoard = field(default_factory=DeviceBoard)
    plugin: KubeletPlugin | None = None
    #: Each device's entry, or why it is left out, judged once per edits (see class_spec).
    verdicts: Verdicts = field(default_factory=dict)
    devices: tuple[DiscoveredDevice, ...] = ()
    target: tuple[AdvertisedDevice, ...] = ()
    spec_ok: bool = False
    retry: asyncio.TimerHandle | None = None
    #: The waits between failed spec writes (made on the first failure: it needs the
    #: settings).
    backoff: Backoff | None = None
    #: The devices the last spec left out: kept out of the list too.
    left_out: frozenset[str] = frozenset()
    #: Why the class's device plugin is not serving, or None.
    plugin_error: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: The class's changes waiting for :meth:`follow`, in the order discovery made them.
    changes: asyncio.Queue[tuple[ClassChange, float | None]] = field(default_factory=asyncio.Queue)

    @property
    def resource(self) -> str:
        return f"{self.agent.config.vendor}/{self.config.name}"

    def fail(
        self, reason: str, message: str, *args: object, device: str = "", logged: bool = True
    ) -> None:
        """Count one failure of this class (or of one of its devices) and log it, unless
        not ``logged`` (a repeat its backoff leaves out of the log)."""
        self.agent.metrics.failures.labels(self.resource, reason).inc()
        if not logged:
            return
        extra = fields(
            resource=self.resource, reason=reason, **({"device": device} if device else {})
        )
        if reason == "internal":
            log.exception(message, *args, extra=extra)
        elif reason in ("device-skipped", "version", "invalid-device"):
            log.warning(message, *args, extra=extra)
        else:
            log.error(message, *args, extra=extra)

    async def follow(self) -> None:
        """Apply this class's changes in order, on a task of its own: a class that waits (a
        DRA withdrawal waiting for the API server, a slow spec folder) never delays
        another class's hotplug."""
        while True:
            change, received = await self.changes.get()
            await self.apply(change, received)

    async def apply(self, change: ClassChange, received: float | None) -> None:
        """Bring the board and the spec file to ``change``; never raises."""
        try:
            await self._apply(change, received)
        except Exception as exc:
            self.fail("internal", "applying a change failed: %s", describe(exc))

    async def _apply(self, change: ClassChange, received: float | None) -> None:
        # Logged per physical device: a shared device is one event, not one line per slot.
        self._log_transitions(change)
        change = expand_change(change, self.config.sharing.replicas)
        for name in change.removed:
            self.verdicts.pop(name, None)  # judged, and logged, afresh if it comes back
        for warning in change.warnings:
            self.fail(
                "device-skipped", "device skipped: %s", warning.message, device=warning.sys_path
            )
        # Step 1: withdraw what is gone, mark what went unhealthy; add nothing yet.
        before = change.before_write(self.board.devices.values())
        self.board.publish(before)
        self.devices = change.devices
        self.target = change.after_write
        driver = self.dra
        if driver is not None and driver.publish(self.config, before, self._by_name()):
            # Out of the ResourceSlice before out of the spec, as out of ListAndWatch.
            await driver.withdrawn()
        await self.sync(received)

    async def sync(self, received: float | None = None) -> None:
        """Write the spec of ``self.devices``; on success publish ``self.target``.

        One sync of a class at a time (a retry waits for a running one); the write itself
        (and its fsync) runs in a thread, so other classes and the plugins go on meanwhile.
        """
        self._cancel_retry()
        async with self.lock:
            await self._sync(received)

    async def _sync(self, received: float | None) -> None:
        try:
            changed = await self._write_spec()
        except Exception as exc:
            # Not published: the kubelet never sees a device the runtime cannot resolve.
            self.spec_ok = False
            backoff = self.backoff = self.backoff or self.agent.backoff()
            why = describe(exc)
            logged = backoff.failed(why)
            reason = "spec-write" if isinstance(exc, CdiGenError) else "internal"
            self.fail(
                reason,
                "spec write failed (attempt %d), retrying in %.1fs: %s",
                backoff.attempts,
                backoff.delay,
                why,
                logged=logged,
            )
            self.agent.metrics.spec_writes.labels(self.resource, "error").inc()
            self.retry = asyncio.get_running_loop().call_later(backoff.delay, self._retry)
            return
        if self.backoff is not None:
            self.backoff.succeeded()
        self.spec_ok = True
        if changed:
            self.agent.metrics.spec_writes.labels(self.resource, "written").inc()
        published = (
            [d for d in self.target if d.id not in self.left_out] if self.left_out else self.target
        )
        self.board.publish(published)
        if self.dra is not None:
            self.dra.publish(self.config, published, self._by_name())
        if received is not None:
            self.agent.metrics.hotplug_latency.observe(time.monotonic() - received)
        self._export_gauges()

    @property
    def dra(self) -> DraDriver | None:
        """The node's DRA driver when this class is served through DRA."""
        return self.agent.dra if self.config.api == "dra" else None

    def _by_name(self) -> dict[str, DiscoveredDevice]:
        return {d.name: d for d in self.devices}

    def _retry(self) -> None:
        self.retry = None
        if self.agent.running:
            self.agent.spawn(self.sync(), f"retry {self.resource}")

    async def _write_spec(self) -> bool:
        """Write (or, without devices, remove) the class's spec; True if the file changed.

        Built on the loop from cached verdicts (cheap), written in a thread (the fsyncs).
        """
        spec_dir = self.agent.settings.spec_dir
        vendor, cls = self.agent.config.vendor, self.config.name
        spec = class_spec(vendor, self.config, self.devices, cache=self.verdicts)
        self.left_out = frozenset(d.device for d in spec.left_out)
        for left in spec.fresh:  # each logged and counted once, when it is judged
            self.fail(left.reason, "%s", left, device=left.physical)
        doc = spec.document
        data = None if doc is None else dump_document(doc)
        instance = self.agent.settings.instance
        outcome = await asyncio.to_thread(
            functools.partial(writer.sync_spec, instance=instance), spec_dir, vendor, cls, data
        )
        if outcome == "removed":
            log.info(
                "spec removed: no devices left",
                extra=fields(resource=self.resource, dir=str(spec_dir)),
            )
        elif outcome == "written" and doc is not None:
            log.info(
                "spec written",
                extra=fields(
                    resource=self.resource,
                    devices=len(doc["devices"]),
                    cdiVersion=doc["cdiVersion"],
                    file=str(spec_dir / writer.spec_filename(vendor, cls)),
                ),
            )
        return outcome in ("written", "removed")

    def _log_transitions(self, change: ClassChange) -> None:
        by_name = {d.name: d for d in change.devices}
        replicas = self.config.sharing.replicas
        slots = {"slots": replicas} if replicas > 1 else {}
        for name in change.added:
            d = by_name[name]
            log.info(
                "device added",
                extra=fields(
                    resource=self.resource,
                    device=name,
                    nodes=",".join(n.host_path for n in d.nodes),
                    healthy=d.healthy,
                    **slots,
                ),
            )
        for name in change.removed:
            log.info("device removed", extra=fields(resource=self.resource, device=name))
        for name in change.changed:
            d = by_name[name]
            log.info(
                "device " + ("changed" if d.healthy else "unhealthy"),
                extra=fields(resource=self.resource, device=name, healthy=d.healthy),
            )

    def _export_gauges(self) -> None:
        m = self.agent.metrics
        healthy = sum(1 for d in self.target if d.healthy)
        m.devices.labels(self.resource, "Healthy").set(healthy)
        m.devices.labels(self.resource, "Unhealthy").set(len(self.target) - healthy)
        m.physical_devices.labels(self.resource).set(len({d.physical for d in self.target}))

    def _cancel_retry(self) -> None:
        if self.retry is not None:
            self.retry.cancel()
            self.retry = None


class Agent:
    """The node agent. ``await agent.run()`` until :meth:`stop` or SIGTERM/SIGINT/SIGHUP."""

    def __init__(
        self, config: AgentConfig, settings: Settings, source: RecordSource | None = None
    ) -> None:
        self.config = config
        self.settings = settings
        self.metrics = Metrics()
        self.discovery = Discovery(config)
        self.runners = {c.name: _ClassRunner(self, c) for c in config.classes}
        self.spec_cache = SpecCache(settings.spec_dirs_for_runtime())
        #: The DRA driver of the classes with ``api: dra`` (none in host mode). Imported
        #: only then: an agent of device plugins alone never loads the DRA modules.
        self.dra: DraDriver | None = None
        if settings.kubelet and any(c.api == "dra" for c in config.classes):
            from cdi_gen.driver import DraDriver

            self.dra = DraDriver(config, settings, self.metrics, self.spec_cache)
        #: The DaemonSet running the agent, read at start by a DRA agent (see _uninstalling).
        self.owner: Owner | None = None
        self._stop = asyncio.Event()
        #: The records' source; udev (started in :meth:`run`) unless one is given.
        self.source = source
        self._http: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._group: asyncio.TaskGroup | None = None
        self.started = asyncio.Event()

    def stop(self) -> None:
        """Ask :meth:`run` to shut down (safe from a signal handler)."""
        self._stop.set()

    def ready(self) -> tuple[bool, str]:
        """For ``/readyz``: every spec in place and every plugin registered."""
        if not self.started.is_set():
            return False, "starting"
        waiting = []
        for r in self.runners.values():
            if r.plugin_error is not None:
                waiting.append(f"{r.resource} (device plugin not serving: {r.plugin_error})")
            elif not r.spec_ok:
                waiting.append(f"{r.resource} (spec not written)")
            elif r.plugin is not None and r.plugin.registrations == 0:
                waiting.append(f"{r.resource} (not registered with the kubelet)")
        if self.dra is not None and (why := self.dra.waiting()) is not None:
            waiting.append(why)
        if waiting:
            return False, "waiting for " + ", ".join(waiting)
        return True, "ready"

    async def run(self) -> None:
        """Start everything, follow the records until stopped, then shut down cleanly.

        The consumers run as tasks of one :class:`asyncio.TaskGroup`: the record follower
        and the plugins still trying to start. Raises
        :class:`~cdi_gen.errors.DiscoveryError` when udev cannot be read at start (or its
        reading fails later), after the same clean shutdown.
        """
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.stop)
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                await self._start()
                for runner in self.runners.values():
                    self.spawn(runner.follow(), f"changes of {runner.resource}")
                follower = group.create_task(self._follow_records(), name="records")
                await self._stop.wait()
                # The follower and the plugins still starting are cancelled: a source need
                # not end its batches on close (a recorded one may wait forever).
                self._close_source()
                follower.cancel()
                for task in self._tasks:
                    task.cancel()
        except BaseExceptionGroup as group_error:
            # One consumer failed (the others were cancelled): raise it as itself, so the
            # CLI maps it to its exit code.
            raise _first(group_error) from None
        finally:
            self._group = None
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
        if settings.metrics_address:
            host, port = parse_address(settings.metrics_address)
            try:
                self._http = await serve_http(host, port, self.metrics, self.ready)
            except OSError as exc:  # in use, or an address this host does not have
                raise ConfigError(
                    f"--metrics-address {quote(settings.metrics_address)}: cannot listen: "
                    f"{os.strerror(exc.errno) if exc.errno else exc}"
                ) from None
            log.info(
                "serving /metrics /healthz /readyz",
                extra=fields(address=settings.metrics_address),
            )
        # Off the event loop and bounded: /healthz is already served, and the folder may be
        # slow or hold anything.
        try:
            await asyncio.wait_for(asyncio.to_thread(self._remove_stale_specs), FOLDER_SCAN_SECONDS)
        except TimeoutError:
            log.error(
                "stale spec scan of %s took over %gs; going on without it",
                settings.spec_dir,
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
        if settings.kubelet:
            await self._start_plugins()
        if self.dra is not None and settings.daemonset is not None:
            self.spawn(self._owner().learn(), "owner DaemonSet")
        self.started.set()

    def _remove_stale_specs(self) -> None:
        spec_dir = self.settings.spec_dir
        removed_temps = writer.remove_stale_temps(spec_dir)
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

    async def _start_plugins(self) -> None:
        # grpc loads here, with the device plugin, and only when a kubelet is used.
        from cdi_gen.kubelet.allocation import Refusal
        from cdi_gen.kubelet.deviceplugin import DevicePlugin

        settings = self.settings
        if self.dra is not None:
            backoff = self.backoff()
            if not await self._start_dra(backoff):
                self.spawn(self._keep_starting(self._start_dra, backoff), "start DRA driver")
        for runner in self.runners.values():
            if runner.config.api == "dra":
                continue
            resource = runner.resource
            on_allocate = self.metrics.allocate_hook(resource, [*Refusal, "internal"])
            registered = {
                ok: self.metrics.registrations.labels(resource, "ok" if ok else "error")
                for ok in (True, False)
            }

            def on_register(ok: bool, error: str, registered: Any = registered) -> None:
                registered[ok].inc()

            try:
                runner.plugin = DevicePlugin(
                    self.config.vendor,
                    runner.config.name,
                    runner.board,
                    self.spec_cache,
                    plugin_dir=settings.device_plugin_dir,
                    kubelet_socket=settings.kubelet_socket,
                    cdi_annotations=settings.cdi_annotations,
                    physical_policy=runner.config.sharing.policy,
                    one_slot_per_device=runner.config.sharing.fail_requests_greater_than_one,
                    on_allocate=on_allocate,
                    on_register=on_register,
                )
            except CdiGenError as exc:
                # Nothing a retry could change (a socket path too long): not ready for good.
                runner.plugin_error = describe(exc)
                runner.fail(
                    "plugin-start", "device plugin cannot be created: %s", runner.plugin_error
                )
                continue
            backoff = self.backoff()
            if not await self._start_plugin(runner, backoff):
                self.spawn(
                    self._keep_starting(functools.partial(self._start_plugin, runner), backoff),
                    f"start {resource}",
                )

    def backoff(self) -> Backoff:
        """The waits of one retry loop of the agent: from 0.5 s (or less, when that is the
        bound) up to ``retry_max_seconds``."""
        longest = self.settings.retry_max_seconds
        return Backoff(min(0.5, longest), longest)

    async def _start_plugin(self, runner: _ClassRunner, backoff: Backoff) -> bool:
        """One attempt to serve the class's plugin; False (counted, and logged as
        ``backoff`` says) if it failed."""
        plugin = runner.plugin
        assert plugin is not None
        try:
            make_folder(self.settings.device_plugin_dir)
            await plugin.start()
        except Exception as exc:
            # One class failing to serve must not stop the others; /readyz names it.
            why = runner.plugin_error = describe(exc)
            logged = backoff.failed(why)
            runner.fail(
                "plugin-start",
                "device plugin failed to start (attempt %d, next in %gs): %s",
                backoff.attempts,
                backoff.delay,
                why,
                logged=logged,
            )
            with contextlib.suppress(Exception):
                await plugin.stop(grace=0)
            return False
        if runner.plugin_error is not None:
            log.info("device plugin started", extra=fields(resource=runner.resource))
        runner.plugin_error = None
        backoff.succeeded()
        return True

    async def _keep_starting(
        self, start: Callable[[Backoff], Awaitable[bool]], backoff: Backoff
    ) -> None:
        """Retry ``start(backoff)`` (a plugin or the DRA driver whose first attempt failed)
        after each of ``backoff``'s waits until it returns True."""
        while True:
            await asyncio.sleep(backoff.delay)
            if await start(backoff):
                return

    async def _start_dra(self, backoff: Backoff) -> bool:
        """One attempt to start the DRA driver; False (counted, and logged as ``backoff``
        says) if it failed."""
        dra = self.dra
        assert dra is not None
        try:
            await dra.start(self.spawn)
        except Exception as exc:
            why = dra.error = describe(exc)
            self.metrics.failures.labels(dra.name, "plugin-start").inc()
            if backoff.failed(why):
                log.error(
                    "DRA driver failed to start (attempt %d, next in %gs): %s",
                    backoff.attempts,
                    backoff.delay,
                    why,
                    extra=fields(driver=dra.name, reason="plugin-start"),
                )
            return False
        dra.error = None
        backoff.succeeded()
        return True

    @property
    def running(self) -> bool:
        """Whether :meth:`run` is between start and shutdown (its task group is open)."""
        return self._group is not None

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``work`` as a task of the agent's group (cancelled on stop)."""
        if self._group is None:
            work.close()
            return
        task = self._group.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
                # Each class on its own task (see _ClassRunner.follow): never awaited here.
                self.runners[change.class_name].changes.put_nowait((change, batch.received or None))

    async def _shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        plugins = [r.plugin for r in self.runners.values() if r.plugin is not None]
        for runner in self.runners.values():
            runner.board.close()
            runner._cancel_retry()
        await asyncio.gather(*(p.stop(grace=1.0) for p in plugins), return_exceptions=True)
        if self.dra is not None:
            try:
                await self.dra.stop()
            except Exception:
                log.exception("stopping the DRA driver failed")
        if self.settings.cleanup_on_exit or await self._uninstalling():
            for runner in self.runners.values():
                with contextlib.suppress(SpecWriteError):
                    if await asyncio.to_thread(
                        functools.partial(writer.remove_spec, instance=self.settings.instance),
                        self.settings.spec_dir,
                        self.config.vendor,
                        runner.config.name,
                    ):
                        log.info("spec removed on exit", extra=fields(resource=runner.resource))
        if self._http is not None:
            self._http.close()
            await self._http.wait_closed()
        log.info("stopped")

    def _owner(self) -> Owner:
        from cdi_gen.apiserver.uninstall import Owner

        self.owner = self.owner or Owner(self.settings)
        return self.owner

    async def _uninstalling(self) -> bool:
        """Whether this exit is an uninstall (the DRA slices then deleted): see
        :mod:`cdi_gen.apiserver.uninstall`."""
        return await self._owner().at_exit(None if self.dra is None else self.dra.name)


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf exception of a (possibly nested) exception group."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
