"""udev as plain data: device records, enumeration and the netlink monitor.

This is the only module that imports pyudev (which ships no types and whose objects read
sysfs lazily); everything else sees frozen :class:`DeviceRecord` values, so discovery is pure
and unit tests feed recorded data (``udevadm info --export-db`` text or JSON).

Ordering matters for correctness: :meth:`UdevWatcher.start` opens the netlink monitor *before*
enumerating, so an event that happens in between is queued rather than lost. Events are read
on the asyncio loop from an ``add_reader`` callback that drains ``poll(timeout=0)``; whatever
is pending when the consumer wakes is delivered as one batch, so a burst coalesces while a
single event is delivered at once. A receive error (ENOBUFS after an event storm overflowed
the socket) and a slow timer both trigger a full re-enumeration, delivered as a ``full`` batch.

The kernel source gets raw uevents (no ``ID_*`` properties) and works without udevd. It must
never get ``filter_by()``: with libudev 252 that silently drops events, removes above all.
Filtering happens here, in Python, for both sources.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyudev

from cdi_gen.errors import DiscoveryError
from cdi_gen.model import DeviceRecord, ParentRecord, RecordWants, servable
from cdi_gen.paths import UDEV_RUN_DIR
from cdi_gen.sources import RecordBatch, property_int

if TYPE_CHECKING:
    # The monitor runs on a loop; the one-shot commands only enumerate and never pay for
    # importing asyncio (about 25 ms of their start).
    import asyncio

__all__ = [
    "UdevWatcher",
    "enumerate_records",
    "record_from_device",
    "resolve_source",
    "udevd_running",
]

log = logging.getLogger(__name__)

Source = Literal["auto", "udev", "kernel"]
#: Large enough for a storm of thousands of uevents; SO_RCVBUFFORCE needs CAP_NET_ADMIN,
#: and without it the kernel default applies and a storm ends in ENOBUFS and a resync.
RECEIVE_BUFFER = 16 * 1024 * 1024
_DRIVER_ACTIONS = frozenset({"bind", "unbind", "change", "move"})


# ---------------------------------------------------------------------------------------------
# Records from pyudev
# ---------------------------------------------------------------------------------------------


def _text(raw: Any) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8", "replace").rstrip("\n")
        except Exception:  # pragma: no cover - bytes.decode with "replace" does not raise
            return None
    return str(raw)


def _attribute(device: Any, name: str) -> str | None:
    try:
        return _text(device.attributes.get(name))
    except (OSError, KeyError, UnicodeDecodeError):
        return None


def _numa(value: str | None) -> int | None:
    n = property_int(value)
    return n if n is not None and n >= 0 else None  # -1: no NUMA affinity


def _numa_node(chain: Iterable[Any]) -> int | None:
    """The NUMA node of the first device of ``chain`` (it, then its parents upwards): the
    ``numa_node`` of the nearest PCI device in it, as Kubernetes' helper reads it for the
    device's ``pciBusID``. That one decides, -1 (no affinity) or garbage included: a bridge
    above it is another device, which must not stand in for it. Without a PCI device, the
    nearest device with a ``numa_node`` of its own (a dax or nd region) decides alike."""
    stated: int | None = None
    found = False
    for device in chain:
        if device.subsystem == "pci":
            return _numa(_attribute(device, "numa_node"))
        if not found:
            value = _attribute(device, "numa_node")
            if value is not None:
                found, stated = True, _numa(value)
    return stated


def _with_parents(device: Any) -> Iterator[Any]:
    while device is not None:
        yield device
        device = device.parent


def record_from_device(
    device: Any, wants: RecordWants = RecordWants(), action: str | None = None
) -> DeviceRecord:
    """Build a record from a pyudev Device (reads sysfs unless the action is ``remove``)."""
    props: dict[str, str] = {}
    for key in device.properties:
        value = _text(device.properties.get(key))
        if value is not None:
            props[key] = value
    removed = action == "remove"
    major, minor = property_int(props.get("MAJOR")), property_int(props.get("MINOR"))
    devnode = device.device_node
    parents: list[ParentRecord] = []
    numa: int | None = None
    attributes: dict[str, str] = {}
    if not removed:
        for name in wants.attributes:
            value = _attribute(device, name)
            if value is not None:
                attributes[name] = value
        numa = _numa_node(_with_parents(device))
        parent = device.parent
        while parent is not None:
            pattrs = {}
            for name in wants.parent_attributes:
                value = _attribute(parent, name)
                if value is not None:
                    pattrs[name] = value
            parents.append(
                ParentRecord(
                    sys_path=parent.sys_path,
                    sys_name=parent.sys_name,
                    subsystem=parent.subsystem,
                    devtype=parent.device_type,
                    driver=parent.driver,
                    attributes=pattrs,
                )
            )
            parent = parent.parent
    return DeviceRecord(
        sys_path=device.sys_path,
        subsystem=device.subsystem or props.get("SUBSYSTEM", ""),
        sys_name=device.sys_name,
        sys_number=device.sys_number,
        devnode=devnode,
        devtype=device.device_type,
        major=major,
        minor=minor,
        driver=None if removed else device.driver,
        properties=props,
        attributes=attributes,
        parents=tuple(parents),
        numa_node=numa,
        node_exists=bool(devnode) and not removed and os.path.exists(devnode),
        action=action,
    )


Interest = Callable[[str, str], bool]
"""``(subsystem, sys_name) -> bool``: whether a device can match any rule (cheap prefilter)."""


def _everything(subsystem: str, sys_name: str) -> bool:
    return True


def enumerate_records(
    context: Any | None = None,
    *,
    subsystems: Iterable[str] | None = None,
    interest: Interest = _everything,
    wants: RecordWants = RecordWants(),
) -> list[DeviceRecord]:
    """Every device with a device node, and every network interface, as records. Raises
    DiscoveryError if sysfs is unreadable.

    ``subsystems`` narrows the enumeration (libudev does the filtering, which is safe for
    enumeration, unlike for a kernel monitor).
    """
    ctx = context if context is not None else pyudev.Context()
    out: list[DeviceRecord] = []
    try:
        if subsystems is None:
            devices: Iterable[Any] = ctx.list_devices()
        else:
            devices = (d for s in sorted(set(subsystems)) for d in ctx.list_devices(subsystem=s))
        for device in devices:
            if not servable(device.subsystem, device.device_node) or not interest(
                device.subsystem or "", device.sys_name
            ):
                continue
            try:
                out.append(record_from_device(device, wants))
            except (OSError, pyudev.DeviceNotFoundError) as exc:
                # Gone while we looked: its remove event follows.
                log.debug("skipping %s: %s", device.sys_path, exc)
    except OSError as exc:
        raise DiscoveryError(f"cannot enumerate udev devices: {exc}") from exc
    return out


def udevd_running(run_dir: Path = UDEV_RUN_DIR) -> bool:
    """Whether udevd answers on its control socket.

    ``/run/udev`` alone is not proof: it outlives udevd, and a udev-source monitor without
    udevd receives nothing, silently. A refused connection is proof of absence; a socket we
    may not open (not root) counts as running when the database directory exists.
    """
    control = run_dir / "control"
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        try:
            sock.connect(str(control))
        except PermissionError:
            return (run_dir / "data").is_dir()
        except OSError:
            return False
    return True


def _take_socket_error(fd: int) -> int:
    """Read (and so clear) the pending error of the socket ``fd``; 0 if none or unknown."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return 0
    try:
        return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    except OSError:
        return 0
    finally:
        sock.close()


def resolve_source(source: Source, run_dir: Path = UDEV_RUN_DIR) -> Literal["udev", "kernel"]:
    """``auto`` → ``udev`` when udevd runs (its control socket answers), else ``kernel``."""
    if source == "auto":
        return "udev" if udevd_running(run_dir) else "kernel"
    if source not in ("udev", "kernel"):
        raise ValueError(f"invalid udev source {source!r}: expected auto, udev or kernel")
    return source


# ---------------------------------------------------------------------------------------------
# The watcher
# ---------------------------------------------------------------------------------------------


class UdevWatcher:
    """Enumeration plus netlink monitor, delivering :class:`RecordBatch` es on an asyncio loop.

    Usage::

        watcher = UdevWatcher(source="auto", subsystems=cfg.subsystems, wants=wants)
        initial = watcher.start()           # monitor first, then enumeration
        async for batch in watcher.batches():
            ...                             # batch.full: replace; else apply the events
        watcher.close()

    Only devices with a device node are reported. A bind/unbind/change/move of a device
    without one (a PCI function getting its driver) is turned into ``change`` records of the
    known devices below it, since their DRIVERS and ATTRS may have changed with it.
    """

    def __init__(
        self,
        *,
        source: Source = "auto",
        subsystems: Iterable[str] | None = None,
        interest: Interest = _everything,
        wants: RecordWants = RecordWants(),
        resync_seconds: float = 300.0,
        receive_buffer: int = RECEIVE_BUFFER,
        context: Any | None = None,
    ) -> None:
        self.source = resolve_source(source)
        self.subsystems = frozenset(subsystems) if subsystems is not None else None
        self.interest = interest
        self.wants = wants
        self.resync_seconds = resync_seconds
        self.receive_buffer = receive_buffer
        self._context = context if context is not None else pyudev.Context()
        self._monitor: Any | None = None
        self._known: set[str] = set()
        self._pending: list[DeviceRecord] = []
        self._resync = False
        self._wakeup: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._received = 0.0
        self._paused = False
        #: Full enumerations after the first, and receive failures (tests read them).
        self.resyncs = 0
        self.receive_errors = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> list[DeviceRecord]:
        """Open and start the monitor, then enumerate; return the enumerated records.

        Raises DiscoveryError when netlink or sysfs cannot be used.
        """
        try:
            monitor = pyudev.Monitor.from_netlink(self._context, source=self.source)
            with contextlib.suppress(OSError, AttributeError):
                monitor.set_receive_buffer_size(self.receive_buffer)
            monitor.start()
        except (OSError, ValueError) as exc:
            raise DiscoveryError(f"cannot open the {self.source} netlink monitor: {exc}") from exc
        self._monitor = monitor
        return self._enumerate()

    def _enumerate(self) -> list[DeviceRecord]:
        records = enumerate_records(
            self._context, subsystems=self.subsystems, interest=self.interest, wants=self.wants
        )
        self._known = {r.sys_path for r in records}
        return records

    def fileno(self) -> int:
        if self._monitor is None:
            raise DiscoveryError("the udev watcher is not started")
        return int(self._monitor.fileno())

    def close(self) -> None:
        """Stop reading; safe to call twice. A running :meth:`batches` ends."""
        if self._loop is not None and self._monitor is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._monitor.fileno())
        self._monitor = None
        if self._wakeup is not None:
            self._wakeup.set()

    def request_resync(self) -> None:
        """Ask for a full enumeration at the next wakeup (e.g. after discovery failed)."""
        self._resync = True
        if self._wakeup is not None:
            self._wakeup.set()

    # -- reading -------------------------------------------------------------------------------

    def _wanted(self, device: Any) -> bool:
        subsystem = device.subsystem or ""
        if self.subsystems is not None and subsystem not in self.subsystems:
            return False
        return self.interest(subsystem, device.sys_name)

    def _handle(self, device: Any) -> None:
        action = device.action or "change"
        sys_path = device.sys_path
        if action == "move":
            old = device.properties.get("DEVPATH_OLD")
            if old and f"/sys{old}" in self._known:
                self._known.discard(f"/sys{old}")
                self._pending.append(
                    DeviceRecord(
                        sys_path=f"/sys{old}",
                        subsystem=device.subsystem or "",
                        sys_name=old.rsplit("/", 1)[-1],
                        action="remove",
                    )
                )
        if servable(device.subsystem, device.device_node) and self._wanted(device):
            try:
                record = record_from_device(device, self.wants, action)
            except (OSError, pyudev.DeviceNotFoundError) as exc:
                log.debug("udev event for vanished %s: %s", sys_path, exc)
                record = DeviceRecord(
                    sys_path=sys_path,
                    subsystem=device.subsystem or "",
                    sys_name=device.sys_name,
                    action="remove",
                )
            if record.action == "remove":
                self._known.discard(sys_path)
            else:
                self._known.add(sys_path)
            self._pending.append(record)
            return
        if action in _DRIVER_ACTIONS or action == "remove":
            prefix = sys_path + "/"
            for child in sorted(p for p in self._known if p.startswith(prefix)):
                self._refresh(child)

    def _refresh(self, sys_path: str) -> None:
        try:
            device = pyudev.Devices.from_sys_path(self._context, sys_path)
            record = record_from_device(device, self.wants, "change")
        except (OSError, pyudev.DeviceNotFoundError):
            return  # its own remove event comes
        self._pending.append(record)

    def drain(self) -> int:
        """Read every pending event without blocking; return how many were read."""
        monitor = self._monitor
        if monitor is None:
            return 0
        count = 0
        while True:
            try:
                device = monitor.poll(timeout=0)
            except OSError as exc:
                self._receive_failed(monitor, exc)
                break
            if device is None:
                break
            count += 1
            try:
                self._handle(device)
            except Exception:
                # A malformed event must not stop the stream: log it and carry on.
                log.exception("bad udev event for %s", getattr(device, "sys_path", "?"))
        if count:
            self._received = self._received or time.monotonic()
        if (count or self._resync) and self._wakeup is not None:
            self._wakeup.set()
        return count

    def _receive_failed(self, monitor: Any, exc: OSError) -> None:
        """The socket overflowed (ENOBUFS) or broke: clear the error, pause, re-enumerate.

        pyudev's poll() raises on POLLERR before it ever receives, and the kernel keeps the
        socket's error pending until someone reads it, so without SO_ERROR every later poll
        fails the same way and the reader callback spins. The reader stays paused until the
        re-enumeration: events queued meanwhile are read after it and stay correct.
        """
        code = _take_socket_error(monitor.fileno()) or exc.errno
        reason = os.strerror(code) if code else str(exc)
        level = logging.WARNING if code == errno.ENOBUFS else logging.ERROR
        log.log(level, "udev monitor lost events (%s); re-enumerating", reason)
        self.receive_errors += 1
        self._resync = True
        if self._loop is not None and not self._paused:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(monitor.fileno())
            self._paused = True

    async def batches(self) -> AsyncGenerator[RecordBatch, None]:
        """Yield batches until :meth:`close`. Call :meth:`start` first.

        Each batch holds everything read since the previous one; a ``full`` batch (after a
        receive error, on the resync timer or :meth:`request_resync`) is a complete
        enumeration that replaces all earlier records.
        """
        if self._monitor is None:
            raise DiscoveryError("call UdevWatcher.start() before batches()")
        import asyncio

        loop = asyncio.get_running_loop()
        self._loop = loop
        self._wakeup = asyncio.Event()
        fd = self._monitor.fileno()
        loop.add_reader(fd, self.drain)
        self.drain()  # events queued between start() and now
        next_resync = loop.time() + self.resync_seconds
        try:
            while self._monitor is not None:
                timeout = max(0.0, next_resync - loop.time())
                try:
                    # Not wait_for, which on Python 3.11 loses a cancellation that comes as
                    # the event is set (and this loop would then never end).
                    async with asyncio.timeout(timeout):
                        await self._wakeup.wait()
                except TimeoutError:
                    self._resync = True
                self._wakeup.clear()
                if self._monitor is None:
                    break
                if self._resync:
                    self._pending.clear()
                    if not self._paused:
                        self.drain()  # what is queued now is older than the enumeration below
                    self._pending.clear()
                    self._resync = False
                    self.resyncs += 1
                    next_resync = loop.time() + self.resync_seconds
                    # On the loop, not in a thread: the reader callback shares the pyudev
                    # context and the known set. A few tens of ms, every few minutes.
                    records = self._enumerate()
                    if self._paused:
                        self._paused = False
                        loop.add_reader(fd, self.drain)
                    yield RecordBatch(tuple(records), full=True, received=time.monotonic())
                    continue
                if self._pending:
                    pending, self._pending = self._pending, []
                    received, self._received = self._received, 0.0
                    yield RecordBatch(tuple(pending), received=received)
        finally:
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(fd)
