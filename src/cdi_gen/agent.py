"""``cdi-gen run``: the node agent. udev discovery → CDI spec files → kubelet device plugins.

One asyncio loop runs everything: the udev watcher delivers batches, :class:`Discovery` turns
them into per-class changes, and each :class:`_ClassRunner` applies a change in the order
that keeps the runtime and the kubelet consistent:

1. withdraw from ListAndWatch every device that is gone or became unhealthy,
2. write the class's spec file (or remove it when no device is left),
3. advertise the new list.

So a device's CDI entry is on disk before its ID is advertised, and its ID is withdrawn
before its entry leaves the spec. A spec write that fails (read-only folder, full disk)
leaves step 3 undone and is retried with backoff: the kubelet never sees a device the runtime
cannot resolve. Entries never pin major/minor for nodes that exist on the host, so a
re-plugged device with new numbers is injected with its current ones.

Each device's spec entry is validated once, when it appears, and reused (see
:mod:`cdi_gen.cdi.builder`): re-writing a class's spec after an event costs about one serialisation.

Failures stop at the class boundary. A device that cannot be written (skipped by discovery,
invalid, or needing a newer cdiVersion than the class is pinned to) is logged once, counted
in ``cdi_gen_failures_total{resource, reason}``, and left out of both the spec and the list;
a class whose spec write or plugin start fails is retried with backoff and reported by
``/readyz`` until it works; anything unexpected in one class is logged with its traceback,
counted as ``internal`` and leaves the other classes running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdi_gen import paths
from cdi_gen.cdi import writer
from cdi_gen.cdi.builder import DeviceEntry, assemble, build_entry
from cdi_gen.cdi.codec import dump_document
from cdi_gen.cdi.registry import SpecCache, unique_dirs
from cdi_gen.cdi.spec import ContainerEdits
from cdi_gen.cdi.version import choose_version
from cdi_gen.config.models import AgentConfig, ClassConfig
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.discovery.sharing import expand_change
from cdi_gen.errors import (
    CdiGenError,
    ConfigError,
    SpecError,
    SpecWriteError,
    VersionError,
    quote,
)
from cdi_gen.kubelet.board import DeviceBoard
from cdi_gen.kubelet.plugin import KubeletPlugin
from cdi_gen.logs import fields
from cdi_gen.metrics import Metrics, parse_address, serve_http
from cdi_gen.model import AdvertisedDevice, ClassChange, DiscoveredDevice
from cdi_gen.modes import make_folder

log = logging.getLogger("cdi_gen.agent")

#: Each stops the agent cleanly (sockets removed, specs kept or removed per
#: ``cleanup_on_exit``). SIGHUP included: its default action killed the agent and left both
#: behind. It means "the terminal or session went away", so a stop is what a user running
#: ``cdi-gen run`` by hand expects; nothing sends it to a pod for a reload (a changed config
#: rolls the DaemonSet), and a reload of udev alone would look like one of the config.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Longest the start-up scan of our spec folder (stale specs of removed classes) may take.
FOLDER_SCAN_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """Everything ``cdi-gen run`` takes besides the config."""

    spec_dir: Path = paths.DYNAMIC_SPEC_DIR
    plugin_dir: Path = paths.DEVICE_PLUGIN_DIR
    kubelet_socket: Path | None = None
    #: Folders the runtime reads, lowest priority first; Allocate checks names against them.
    #: Default: /etc/cdi and the spec folder.
    runtime_spec_dirs: tuple[Path, ...] = ()
    udev_source: str | None = None
    metrics_address: str | None = None
    cdi_annotations: bool = False
    cleanup_on_exit: bool = False
    kubelet: bool = True
    retry_max_seconds: float = 30.0

    def spec_dirs_for_runtime(self) -> tuple[Path, ...]:
        if self.runtime_spec_dirs:
            # A folder named twice would conflict with itself and fail every Allocate.
            return unique_dirs(self.runtime_spec_dirs)
        etc = paths.STATIC_SPEC_DIR
        return (self.spec_dir,) if self.spec_dir == etc else (etc, self.spec_dir)


@dataclass(slots=True)
class _ClassRunner:
    """One class: its board, its plugin, its cached entries and its pending spec write."""

    agent: Agent
    config: ClassConfig
    board: DeviceBoard = field(default_factory=DeviceBoard)
    plugin: KubeletPlugin | None = None
    entries: dict[str, tuple[DiscoveredDevice, DeviceEntry]] = field(default_factory=dict)
    devices: tuple[DiscoveredDevice, ...] = ()
    target: tuple[AdvertisedDevice, ...] = ()
    spec_ok: bool = False
    retry: asyncio.TimerHandle | None = None
    failures: int = 0
    #: Devices left out of the spec and the list: name → (the edits judged, why).
    rejected: dict[str, tuple[ContainerEdits, str]] = field(default_factory=dict)
    #: Why the class's device plugin is not serving, or None.
    plugin_error: str | None = None

    @property
    def resource(self) -> str:
        return f"{self.agent.config.vendor}/{self.config.name}"

    def fail(self, reason: str, message: str, *args: object, device: str = "") -> None:
        """Log and count one failure of this class (or of one of its devices)."""
        self.agent.metrics.failures.labels(self.resource, reason).inc()
        extra = fields(
            resource=self.resource, reason=reason, **({"device": device} if device else {})
        )
        if reason == "internal":
            log.exception(message, *args, extra=extra)
        elif reason in ("device-skipped", "version", "invalid-device"):
            log.warning(message, *args, extra=extra)
        else:
            log.error(message, *args, extra=extra)

    def apply(self, change: ClassChange, received: float | None) -> None:
        """Bring the board and the spec file to ``change``; never raises."""
        try:
            self._apply(change, received)
        except Exception as exc:
            self.fail("internal", "applying a change failed: %s", exc)

    def _apply(self, change: ClassChange, received: float | None) -> None:
        # Logged per physical device: a shared device is one event, not one line per slot.
        self._log_transitions(change)
        change = expand_change(change, self.config.sharing.replicas)
        for name in change.removed:
            self.entries.pop(name, None)
            self.rejected.pop(name, None)
        for warning in change.warnings:
            self.fail(
                "device-skipped", "device skipped: %s", warning.message, device=warning.sys_path
            )
        new = {d.id: d for d in change.after_write}
        # Step 1: withdraw what is gone, mark what went unhealthy; add nothing yet.
        interim = []
        for old in self.board.devices.values():
            now = new.get(old.id)
            if now is None:
                continue
            interim.append(now if not now.healthy else old)
        self.board.publish(interim)
        self.devices = change.devices
        self.target = change.after_write
        self.sync(received)

    def sync(self, received: float | None = None) -> None:
        """Write the spec of ``self.devices``; on success publish ``self.target``."""
        self._cancel_retry()
        try:
            changed = self._write_spec()
        except Exception as exc:
            # Not published: the kubelet never sees a device the runtime cannot resolve.
            self.spec_ok = False
            self.failures += 1
            delay = min(self.agent.options.retry_max_seconds, 0.5 * 2 ** min(self.failures, 8))
            reason = "spec-write" if isinstance(exc, CdiGenError) else "internal"
            self.fail(reason, "spec write failed, retrying in %.1fs: %s", delay, exc)
            self.agent.metrics.spec_writes.labels(self.resource, "error").inc()
            self.retry = asyncio.get_running_loop().call_later(delay, self.sync)
            return
        self.failures = 0
        self.spec_ok = True
        if changed:
            self.agent.metrics.spec_writes.labels(self.resource, "written").inc()
        if self.rejected:
            self.board.publish([d for d in self.target if d.id not in self.rejected])
        else:
            self.board.publish(self.target)
        if received is not None:
            self.agent.metrics.hotplug_latency.observe(time.monotonic() - received)
        self._export_gauges()

    def _write_spec(self) -> bool:
        spec_dir = self.agent.options.spec_dir
        vendor, cls = self.agent.config.vendor, self.config.name
        entries = [e for e in map(self._entry, self.devices) if e is not None]
        if not entries:
            removed = writer.remove_spec(spec_dir, vendor, cls)
            if removed:
                log.info(
                    "spec removed: no devices left",
                    extra=fields(resource=self.resource, dir=str(spec_dir)),
                )
            return removed
        doc = assemble(f"{vendor}/{cls}", entries, target_version=self.config.cdi_version)
        changed = writer.write_bytes(spec_dir, vendor, cls, dump_document(doc))
        if changed:
            log.info(
                "spec written",
                extra=fields(
                    resource=self.resource,
                    devices=len(entries),
                    cdiVersion=doc["cdiVersion"],
                    file=str(spec_dir / writer.spec_filename(vendor, cls)),
                ),
            )
        return changed

    def _entry(self, device: DiscoveredDevice) -> DeviceEntry | None:
        """The device's validated entry, or None when it cannot be in this class's spec."""
        cached = self.entries.get(device.name)
        if cached is not None and cached[0].edits == device.edits:
            return cached[1]
        rejected = self.rejected.get(device.name)
        if rejected is not None and rejected[0] == device.edits:
            return None  # logged and counted when it was judged
        self.rejected.pop(device.name, None)
        try:
            entry = build_entry(device.name, device.edits.to_wire())
            if self.config.cdi_version is not None:
                # A pinned class: a device needing more than the pin would make the whole
                # file unreadable for the runtime the pin is for.
                choose_version(list(entry.requirements), self.config.cdi_version, device.name)
        except SpecError as exc:
            reason = "version" if isinstance(exc, VersionError) else "invalid-device"
            self.rejected[device.name] = (device.edits, reason)
            self.entries.pop(device.name, None)
            self.fail(
                reason,
                "device skipped: %s",
                str(exc).replace("\n", "; "),
                device=device.physical,
            )
            return None
        self.entries[device.name] = (device, entry)
        return entry

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

    def __init__(self, config: AgentConfig, options: AgentOptions) -> None:
        self.config = config
        self.options = options
        self.metrics = Metrics()
        self.discovery = Discovery(config)
        self.runners = {c.name: _ClassRunner(self, c) for c in config.classes}
        self.spec_cache = SpecCache(options.spec_dirs_for_runtime())
        self._stop = asyncio.Event()
        self._watcher: Any = None
        self._http: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
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
        if waiting:
            return False, "waiting for " + ", ".join(waiting)
        return True, "ready"

    async def run(self) -> None:
        """Start everything, follow udev until stopped, then shut down cleanly.

        Raises :class:`~cdi_gen.errors.DiscoveryError` when udev cannot be read at start.
        """
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.stop)
        try:
            await self._start()
            events = asyncio.create_task(self._follow_udev(), name="udev")
            stop = asyncio.create_task(self._stop.wait(), name="stop")
            done, _ = await asyncio.wait({events, stop}, return_when=asyncio.FIRST_COMPLETED)
            if events in done and events.exception() is not None:
                raise events.exception()  # type: ignore[misc]
            events.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await events
            stop.cancel()
        finally:
            await self._shutdown()
            for sig in STOP_SIGNALS:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.remove_signal_handler(sig)

    async def _start(self) -> None:
        from cdi_gen.sources.udev import UdevWatcher

        opts = self.options
        if opts.metrics_address:
            host, port = parse_address(opts.metrics_address)
            try:
                self._http = await serve_http(host, port, self.metrics, self.ready)
            except OSError as exc:  # in use, or an address this host does not have
                raise ConfigError(
                    f"--metrics-address {quote(opts.metrics_address)}: cannot listen: "
                    f"{os.strerror(exc.errno) if exc.errno else exc}"
                ) from None
            log.info(
                "serving /metrics /healthz /readyz", extra=fields(address=opts.metrics_address)
            )
        # Off the event loop and bounded: /healthz is already served, and the folder may be
        # slow or hold anything.
        try:
            await asyncio.wait_for(asyncio.to_thread(self._remove_stale_specs), FOLDER_SCAN_SECONDS)
        except TimeoutError:
            log.error(
                "stale spec scan of %s took over %gs; going on without it",
                opts.spec_dir,
                FOLDER_SCAN_SECONDS,
            )
        watcher = UdevWatcher(
            source=opts.udev_source or self.config.udev_source,  # type: ignore[arg-type]
            subsystems=self.discovery.subsystems,
            interest=self.discovery.interest,
            wants=self.discovery.wants,
            resync_seconds=self.config.resync_seconds,
        )
        records = watcher.start()
        self._watcher = watcher
        log.info(
            "udev monitor started",
            extra=fields(source=watcher.source, enumerated=len(records), classes=len(self.runners)),
        )
        for change in self.discovery.replace(records):
            self.runners[change.class_name].apply(change, None)
        if opts.kubelet:
            await self._start_plugins()
        self.started.set()

    def _remove_stale_specs(self) -> None:
        spec_dir = self.options.spec_dir
        removed_temps = writer.remove_stale_temps(spec_dir)
        if removed_temps:
            log.info("removed %d temporary files of an interrupted write", removed_temps)
        configured = {(self.config.vendor, c) for c in self.runners}
        for vendor, cls in writer.owned_specs(spec_dir):
            if (vendor, cls) not in configured:
                try:
                    writer.remove_spec(spec_dir, vendor, cls)
                except SpecWriteError as exc:
                    log.error("cannot remove stale spec: %s", exc)
                    continue
                log.info(
                    "stale spec removed: class no longer configured",
                    extra=fields(resource=f"{vendor}/{cls}", dir=str(spec_dir)),
                )

    async def _start_plugins(self) -> None:
        # grpc loads here, with the device plugin, and only when a kubelet is used.
        from cdi_gen.kubelet.allocation import Refusal
        from cdi_gen.kubelet.deviceplugin import DevicePlugin

        opts = self.options
        for runner in self.runners.values():
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
                    plugin_dir=opts.plugin_dir,
                    kubelet_socket=opts.kubelet_socket,
                    cdi_annotations=opts.cdi_annotations,
                    physical_policy=runner.config.sharing.policy,
                    one_slot_per_device=runner.config.sharing.fail_requests_greater_than_one,
                    on_allocate=on_allocate,
                    on_register=on_register,
                )
            except CdiGenError as exc:
                # Nothing a retry could change (a socket path too long): not ready for good.
                runner.plugin_error = str(exc)
                runner.fail("plugin-start", "device plugin cannot be created: %s", exc)
                continue
            if not await self._start_plugin(runner, 1):
                self._tasks.add(
                    asyncio.create_task(self._keep_starting(runner), name=f"start {resource}")
                )

    async def _start_plugin(self, runner: _ClassRunner, attempt: int) -> bool:
        """One attempt to serve the class's plugin; False (logged, counted) if it failed."""
        plugin = runner.plugin
        assert plugin is not None
        try:
            make_folder(self.options.plugin_dir)
            await plugin.start()
        except Exception as exc:
            # One class failing to serve must not stop the others; /readyz names it.
            runner.plugin_error = str(exc)
            runner.fail(
                "plugin-start", "device plugin failed to start (attempt %d): %s", attempt, exc
            )
            with contextlib.suppress(Exception):
                await plugin.stop(grace=0)
            return False
        if runner.plugin_error is not None:
            log.info("device plugin started", extra=fields(resource=runner.resource))
        runner.plugin_error = None
        return True

    async def _keep_starting(self, runner: _ClassRunner) -> None:
        """Retry a plugin that failed to start, with backoff, until it serves."""
        attempt = 1
        while True:
            delay = min(self.options.retry_max_seconds, 0.5 * 2 ** min(attempt - 1, 8))
            await asyncio.sleep(delay)
            attempt += 1
            if await self._start_plugin(runner, attempt):
                return

    async def _follow_udev(self) -> None:
        watcher = self._watcher
        async for batch in watcher.batches():
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
                watcher.request_resync()
                continue
            for change in changes:
                self.runners[change.class_name].apply(change, batch.received or None)

    async def _shutdown(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        plugins = [r.plugin for r in self.runners.values() if r.plugin is not None]
        for runner in self.runners.values():
            runner.board.close()
            runner._cancel_retry()
        await asyncio.gather(*(p.stop(grace=1.0) for p in plugins), return_exceptions=True)
        if self.options.cleanup_on_exit:
            for runner in self.runners.values():
                with contextlib.suppress(SpecWriteError):
                    if writer.remove_spec(
                        self.options.spec_dir, self.config.vendor, runner.config.name
                    ):
                        log.info("spec removed on exit", extra=fields(resource=runner.resource))
        if self._http is not None:
            self._http.close()
            await self._http.wait_closed()
        log.info("stopped")
