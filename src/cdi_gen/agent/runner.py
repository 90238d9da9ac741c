"""One class of the node agent: its changes, in order, to its spec file and its frontend.

A :class:`ClassRunner` applies its class's changes (from
:class:`~cdi_gen.discovery.inventory.Discovery`) on a task of its own, so a class that waits
(for the API server, a slow folder) never delays another, in the order that keeps the runtime
and the kubelet consistent:

1. withdraw every device that is gone or became unhealthy (and wait, bounded, for a sink that
   publishes asynchronously),
2. write the class's spec file (or remove it when no device is left),
3. publish the new list.

Each step publishes once, to the class's one list: a device-plugin class's
:class:`~cdi_gen.deviceplugin.board.DeviceBoard` (its plugin serves it), or a DRA class's
:class:`~cdi_gen.agent.frontend.DeviceSink` (the node's DRA driver). A spec write that fails
is retried through a :class:`~cdi_gen.retry.Retry` and leaves step 3 undone. The runner is
given what it needs (its config, the spec folder, the agent's :class:`~cdi_gen.retry.Tools`,
its frontend); it never holds the agent.

A class with ``whenBack`` ``restart`` or ``follow`` is given a
:class:`~cdi_gen.agent.whenback.BackPolicy`: each change's devices that came back with other
numbers (:class:`~cdi_gen.agent.comebacks.Comebacks`) are handed to it once their new spec is
written, as background work of their own, so the class's next change never waits for them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cdi_gen.agent.comebacks import Comeback, Comebacks
from cdi_gen.agent.frontend import DeviceSink, Frontend
from cdi_gen.cdi import specnames
from cdi_gen.cdi.codec import dump_document
from cdi_gen.cdi.store import SpecStore
from cdi_gen.config.models import ClassConfig
from cdi_gen.deviceplugin.board import DeviceBoard
from cdi_gen.discovery.sharing import expand_change
from cdi_gen.discovery.spec import AGENT_FOLDERS, LeftOut, Verdicts, class_spec, within
from cdi_gen.errors import CdiGenError
from cdi_gen.logs import fields
from cdi_gen.model import AdvertisedDevice, ClassChange, DiscoveredDevice
from cdi_gen.retry import Failures, Retry, Tools, describe

if TYPE_CHECKING:
    from cdi_gen.agent.whenback import BackPolicy
    from cdi_gen.cdi.runtimes import Ceiling

__all__ = ["ClassRunner"]

log = logging.getLogger("cdi_gen.agent.agent")


@dataclass(slots=True)
class ClassRunner:
    """One class: its list, its frontend, its devices' verdicts and its pending spec write.

    ``vendor`` and ``config`` name the class; its spec goes to ``spec_dir`` (written for
    ``instance``, see :func:`~cdi_gen.cdi.writer.sync_spec`). Its devices are published to
    ``board`` (a device-plugin class) or ``sink`` (a DRA class), one of them. ``frontend``
    serves it to the kubelet (None when no kubelet is used: host mode).
    """

    config: ClassConfig
    vendor: str
    spec_dir: Path
    instance: str | None
    tools: Tools
    board: DeviceBoard | None = None
    sink: DeviceSink | None = None
    #: Where the class's spec is written, and kept for the DRA driver's claim specs.
    specs: SpecStore = field(default_factory=SpecStore)
    frontend: Frontend | None = None
    #: Each device's entry, or why it is left out, judged once per edits (see class_spec).
    verdicts: Verdicts = field(default_factory=dict)
    devices: tuple[DiscoveredDevice, ...] = ()
    target: tuple[AdvertisedDevice, ...] = ()
    spec_ok: bool = False
    retry: asyncio.TimerHandle | None = None
    #: The spec write's retry loop (made from ``tools`` on the first failure).
    retrying: Retry | None = None
    #: What the class advertises now (the last list published).
    advertised: tuple[AdvertisedDevice, ...] = ()
    #: The devices the last spec left out: kept out of the list too.
    left_out: frozenset[str] = frozenset()
    #: Those left out for what this node has (its runtimes, its host paths): for /readyz.
    node_left_out: tuple[LeftOut, ...] = ()
    #: The node's runtimes' newest cdiVersion, when known: unpinned, a device needing more
    #: is left out (see class_spec).
    ceiling: Ceiling | None = None
    #: How a required extra host path is looked for (None: not looked for): only where the
    #: agent sees the host's folders, also in a pod.
    exists: Callable[[str], bool] | None = field(
        default_factory=lambda: within(AGENT_FOLDERS, os.path.exists)
    )
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: The class's changes waiting for :meth:`follow`, in the order discovery made them.
    changes: asyncio.Queue[tuple[ClassChange, float | None]] = field(default_factory=asyncio.Queue)

    #: The class's ``whenBack`` as this agent applies it (None: ``keep``, nothing watched).
    back: BackPolicy | None = None
    #: The removed devices' last nodes, and which devices came back.
    comebacks: Comebacks = field(default_factory=Comebacks)
    #: Devices that came back, handed to ``back`` after the next spec write that succeeds.
    returned: list[Comeback] = field(default_factory=list)

    #: Counts and logs this class's failures (made from ``tools`` and the resource).
    fail: Failures = field(init=False)

    def __post_init__(self) -> None:
        self.fail = Failures(self.tools.metrics, self.resource)

    @property
    def resource(self) -> str:
        return f"{self.vendor}/{self.config.name}"

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
        if self.back is not None:
            # Before sharing expands it: a device comes back, not each of its slots.
            self.returned += self.comebacks.of(change)
        change = expand_change(change, self.config.sharing.replicas)
        for name in change.removed:
            self.verdicts.pop(name, None)  # judged, and logged, afresh if it comes back
        for warning in change.warnings:
            self.fail(
                "device-skipped", "device skipped: %s", warning.message, device=warning.sys_path
            )
        # Step 1: withdraw what is gone, mark what went unhealthy; add nothing yet.
        before = tuple(change.before_write(self.advertised))
        self.devices = change.devices
        self.target = change.after_write
        if self._publish(before) and self.sink is not None:
            await self.sink.withdrawn()
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
            retrying = self.retrying = self.retrying or Retry(
                self.tools.backoff(), failures=self.fail
            )
            retrying.failed(
                describe(exc),
                "spec write failed (attempt %(attempt)d), retrying in %(delay).1fs: %(why)s",
                reason="spec-write" if isinstance(exc, CdiGenError) else "internal",
            )
            self.tools.metrics.spec_writes.labels(self.resource, "error").inc()
            self.retry = asyncio.get_running_loop().call_later(retrying.delay, self._retry)
            return
        if self.retrying is not None:
            self.retrying.succeeded()
        self.spec_ok = True
        if changed:
            self.tools.metrics.spec_writes.labels(self.resource, "written").inc()
        published = (
            tuple(d for d in self.target if d.id not in self.left_out)
            if self.left_out
            else self.target
        )
        self._publish(published)
        self._hand_back()
        if received is not None:
            self.tools.metrics.hotplug_latency.observe(time.monotonic() - received)
        self._export_gauges()

    def _publish(self, devices: tuple[AdvertisedDevice, ...]) -> bool:
        """Publish ``devices`` as the class's list, once; whether a sink that learns of it
        later changed (a withdrawal then worth waiting for)."""
        self.advertised = devices
        if self.board is not None:
            self.board.publish(devices)
        if self.sink is None:
            return False
        return self.sink.publish(self.config, devices, {d.name: d for d in self.devices})

    def _hand_back(self) -> None:
        """The devices that came back, now in the spec, to the class's ``whenBack``."""
        back, returned, self.returned = self.back, self.returned, []
        if back is None:
            return
        for comeback in returned:
            self.tools.spawn(_handled(back, comeback), f"whenBack {self.resource} {comeback.name}")

    def _retry(self) -> None:
        self.retry = None
        self.tools.spawn(self.sync(), f"retry {self.resource}")

    async def _write_spec(self) -> bool:
        """Write (or, without devices, remove) the class's spec; True if the file changed.

        Built on the loop from cached verdicts (cheap), written in a thread (the fsyncs).
        """
        spec_dir = self.spec_dir
        vendor, cls = self.vendor, self.config.name
        spec = class_spec(
            vendor,
            self.config,
            self.devices,
            cache=self.verdicts,
            ceiling=self.ceiling,
            exists=self.exists,
        )
        self.left_out = frozenset(d.device for d in spec.left_out)
        self.node_left_out = tuple(d for d in spec.left_out if d.node)
        for left in spec.fresh:  # each logged and counted once, when it is judged
            self.fail(left.reason, "%s", left, device=left.physical)
        doc = spec.document
        data = None if doc is None else dump_document(doc)
        instance = self.instance
        outcome = await asyncio.to_thread(
            functools.partial(self.specs.sync, instance=instance), spec_dir, vendor, cls, data
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
                    file=str(spec_dir / specnames.spec_filename(vendor, cls)),
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
        m = self.tools.metrics
        # What the kubelet is offered: a device left out of the spec is discovered, not offered.
        healthy = sum(1 for d in self.advertised if d.healthy)
        m.devices.labels(self.resource, "Healthy").set(healthy)
        m.devices.labels(self.resource, "Unhealthy").set(len(self.advertised) - healthy)
        m.physical_devices.labels(self.resource).set(len({d.physical for d in self.target}))

    def _cancel_retry(self) -> None:
        if self.retry is not None:
            self.retry.cancel()
            self.retry = None

    def waiting(self) -> list[str]:
        """For ``/readyz``: what this class still waits for (empty when ready)."""
        waiting = [] if self.spec_ok else [f"{self.resource} (spec not written)"]
        why = self.frontend.waiting() if self.frontend is not None else None
        return waiting if why is None else [why, *waiting]

    def degraded(self) -> str | None:
        """For ``/readyz``, still ready: the devices this node leaves out (an older runtime,
        a missing host path), or None. Not unready: the class serves its other devices, and
        an unready agent would stall a DaemonSet's rollout on a node that cannot change."""
        sink = self.sink.degraded(self.config) if self.sink is not None else None
        if not self.node_left_out:
            return None if sink is None else f"{self.resource} ({sink})"
        why = sorted({d.node for d in self.node_left_out})
        n = len(self.node_left_out)
        more = "" if sink is None else f"; {sink}"
        return (
            f"{self.resource} ({n} device{'s' if n > 1 else ''} left out: {', '.join(why)}{more})"
        )

    async def start(self) -> None:
        """Start the class's frontend (retried on the agent's group); raises only what
        :meth:`~cdi_gen.agent.frontend.Frontend.start` does (the agent exits)."""
        if self.frontend is not None:
            await self.frontend.start()

    def close(self) -> None:
        """Stopping: end ListAndWatch's waits on the board and any pending retry."""
        if self.board is not None:
            self.board.close()
        self._cancel_retry()

    async def stop(self) -> None:
        """Stop the class's frontend; never raises."""
        if self.frontend is not None:
            await self.frontend.stop()


async def _handled(back: BackPolicy, comeback: Comeback) -> None:
    await back.handle(comeback)
