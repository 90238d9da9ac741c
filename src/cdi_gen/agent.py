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
:mod:`cdi_gen.entry`): re-writing a class's spec after an event costs about one serialisation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdi_gen import writer
from cdi_gen.codec import dump_document
from cdi_gen.config import AgentConfig, ClassConfig
from cdi_gen.discovery import ClassChange, DiscoveredDevice, Discovery
from cdi_gen.entry import DeviceEntry, assemble, build_entry
from cdi_gen.errors import CdiGenError, SpecWriteError
from cdi_gen.logs import fields
from cdi_gen.metrics import Metrics, parse_address, serve_http
from cdi_gen.registry import SpecCache
from cdi_gen.sharing import expand_change
from cdi_gen.state import AdvertisedDevice, DeviceBoard

log = logging.getLogger("cdi_gen.agent")

DEFAULT_SPEC_DIR = Path("/var/run/cdi")
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """Everything ``cdi-gen run`` takes besides the config."""

    spec_dir: Path = DEFAULT_SPEC_DIR
    plugin_dir: Path = DEFAULT_PLUGIN_DIR
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
            return self.runtime_spec_dirs
        etc = Path("/etc/cdi")
        return (self.spec_dir,) if self.spec_dir == etc else (etc, self.spec_dir)


@dataclass(slots=True)
class _ClassRunner:
    """One class: its board, its plugin, its cached entries and its pending spec write."""

    agent: Agent
    config: ClassConfig
    board: DeviceBoard = field(default_factory=DeviceBoard)
    plugin: Any = None
    entries: dict[str, tuple[DiscoveredDevice, DeviceEntry]] = field(default_factory=dict)
    devices: tuple[DiscoveredDevice, ...] = ()
    target: tuple[AdvertisedDevice, ...] = ()
    spec_ok: bool = False
    retry: asyncio.TimerHandle | None = None
    failures: int = 0

    @property
    def resource(self) -> str:
        return f"{self.agent.config.vendor}/{self.config.name}"

    def apply(self, change: ClassChange, received: float | None) -> None:
        """Bring the board and the spec file to ``change`` in the safe order."""
        # Logged per physical device: a shared device is one event, not one line per slot.
        self._log_transitions(change)
        change = expand_change(change, self.config.sharing.replicas)
        for name in change.removed:
            self.entries.pop(name, None)
        for warning in change.warnings:
            log.warning(
                "device skipped: %s",
                warning.message,
                extra=fields(resource=self.resource, device=warning.sys_path),
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
        except SpecWriteError as exc:
            self.spec_ok = False
            self.failures += 1
            delay = min(self.agent.options.retry_max_seconds, 0.5 * 2 ** min(self.failures, 8))
            log.error(
                "spec write failed, retrying in %.1fs: %s",
                delay,
                exc,
                extra=fields(resource=self.resource),
            )
            self.agent.metrics.spec_writes.labels(self.resource, "error").inc()
            self.retry = asyncio.get_running_loop().call_later(delay, self.sync)
            return
        self.failures = 0
        self.spec_ok = True
        if changed:
            self.agent.metrics.spec_writes.labels(self.resource, "written").inc()
        self.board.publish(self.target)
        if received is not None:
            self.agent.metrics.hotplug_latency.observe(time.monotonic() - received)
        self._export_gauges()

    def _write_spec(self) -> bool:
        spec_dir = self.agent.options.spec_dir
        vendor, cls = self.agent.config.vendor, self.config.name
        if not self.devices:
            removed = writer.remove_spec(spec_dir, vendor, cls)
            if removed:
                log.info(
                    "spec removed: no devices left",
                    extra=fields(resource=self.resource, dir=str(spec_dir)),
                )
            return removed
        entries = [self._entry(d) for d in self.devices]
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

    def _entry(self, device: DiscoveredDevice) -> DeviceEntry:
        cached = self.entries.get(device.name)
        if cached is not None and cached[0].edits == device.edits:
            return cached[1]
        entry = build_entry(device.name, device.edits.to_wire())
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
    """The node agent. ``await agent.run()`` until :meth:`stop` or SIGTERM/SIGINT."""

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
        self.started = asyncio.Event()

    def stop(self) -> None:
        """Ask :meth:`run` to shut down (safe from a signal handler)."""
        self._stop.set()

    def ready(self) -> tuple[bool, str]:
        """For ``/readyz``: every spec in place and every plugin registered."""
        if not self.started.is_set():
            return False, "starting"
        waiting = [
            r.resource
            for r in self.runners.values()
            if not r.spec_ok or (r.plugin is not None and r.plugin.registrations == 0)
        ]
        if waiting:
            return False, "waiting for " + ", ".join(waiting)
        return True, "ready"

    async def run(self) -> None:
        """Start everything, follow udev until stopped, then shut down cleanly.

        Raises :class:`~cdi_gen.errors.DiscoveryError` when udev cannot be read at start.
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
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
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.remove_signal_handler(sig)

    async def _start(self) -> None:
        from cdi_gen.udev import UdevWatcher

        opts = self.options
        if opts.metrics_address:
            host, port = parse_address(opts.metrics_address)
            self._http = await serve_http(host, port, self.metrics, self.ready)
            log.info(
                "serving /metrics /healthz /readyz", extra=fields(address=opts.metrics_address)
            )
        self._remove_stale_specs()
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
        from cdi_gen.plugin import DevicePlugin

        opts = self.options
        opts.plugin_dir.mkdir(parents=True, exist_ok=True)
        for runner in self.runners.values():
            resource = runner.resource

            def on_allocate(outcome: str, reason: str, resource: str = resource) -> None:
                self.metrics.allocations.labels(resource, outcome).inc()
                if outcome != "ok":
                    self.metrics.allocation_failures.labels(resource, reason or outcome).inc()

            def on_register(ok: bool, error: str | None, resource: str = resource) -> None:
                self.metrics.registrations.labels(resource, "ok" if ok else "error").inc()

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
            try:
                await runner.plugin.start()
            except CdiGenError as exc:
                # One class failing to serve must not stop the others.
                log.error("device plugin failed to start: %s", exc, extra=fields(resource=resource))
                runner.plugin = None

    async def _follow_udev(self) -> None:
        watcher = self._watcher
        async for batch in watcher.batches():
            if batch.full:
                self.metrics.resyncs.labels("resync").inc()
                changes = self.discovery.replace(batch.records)
            else:
                for record in batch.records:
                    self.metrics.udev_events.labels(record.action or "change").inc()
                changes = self.discovery.apply(batch.records)
            for change in changes:
                self.runners[change.class_name].apply(change, batch.received or None)

    async def _shutdown(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
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
