"""Network interfaces that left the host's network namespace, told from interfaces that are gone.

When a runtime moves an interface into a pod's network namespace (CDI ``netDevices``), the
kernel sends the host's namespace a ``remove`` uevent for it, with the same properties
(``INTERFACE``, ``IFINDEX``, ``DEVPATH``) as the one an unplug sends, and the new namespace an
``add``. Its ``/sys/class/net`` entry disappears from the host's sysfs either way. What the
host can still see, read from sysfs alone (no namespace entered):

- an interface with a device behind it (a USB NIC, a CAN adapter, a PCI function): the
  parent device's ``net/`` folder. The kernel keeps that folder while any interface of the
  device exists, in any namespace, and removes it with the last one (an unplug, an unbind);
  so the folder still there when the interface left it is an interface that lives on
  elsewhere. (A device's interface cannot be deleted alone, but through its driver; with a
  sibling interface on the host the folder says nothing of the one removed.)
- a virtual interface (``/sys/devices/virtual/net``): an interface left on the host that
  links to it (its ``iflink``): a veth's peer. The kernel deletes a veth's two ends together
  and keeps the ifindex across a move, so a host interface whose ``iflink`` is the moved
  one's ifindex means it exists in another namespace. A virtual interface without such a
  peer (a macvlan, a VLAN) cannot be told from a deleted one and counts as gone.

The kernel returns a physical interface (and a CAN one, whose link type asks for it) to the
host when the namespace is destroyed (an ``add`` under the name it had there, or
``dev<ifindex>`` if that is taken) and destroys a virtual one with it. :class:`NetWhereabouts`
turns a ``remove`` of an interface that lives on into an ``away`` record (its last record, kept
as it was: the device stays published), re-checks the interfaces away on every later ``remove``
uevent and on each enumeration, and reports one that returned under another name (told by its
ifindex, or as the one interface of its device away; a ``change`` of a sibling interface is no
return) as removed under its old one, one whose device is gone as ``remove`` (an unplug: the
class's ``whenGone``) and a virtual one destroyed with its namespace as ``ended`` (withdrawn,
whatever ``whenGone`` says).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable

from cdi_gen.model import NET_SUBSYSTEM, DeviceRecord
from cdi_gen.sources import property_int

__all__ = ["AWAY", "ENDED", "NetWhereabouts", "lives_elsewhere"]

log = logging.getLogger(__name__)

#: The action of a record of an interface that left the host and lives on elsewhere.
AWAY = "away"
#: The action of a record of a virtual interface destroyed with the namespace it was in.
ENDED = "ended"

#: At most this many interfaces are read to find a veth's peer: a node has one per pod
#: (the CNI's veth ends) and a few more; the kernel's bound is far above.
_MAX_INTERFACES = 1 << 16


def _read_int(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            return property_int(f.read(32).decode("ascii", "replace").strip())
    except OSError:
        return None


def _virtual(sys_path: str, sysfs: str) -> bool:
    return sys_path.startswith(f"{sysfs}/devices/virtual/")


def lives_elsewhere(sys_path: str, ifindex: int | None, sysfs: str = "/sys") -> bool:
    """Whether the interface removed from the host at ``sys_path`` still exists in another
    network namespace (see the module docstring for what the kernel leaves to see);
    ``sysfs`` is where the host's sysfs is mounted."""
    if os.path.lexists(sys_path):
        return False  # still here: its remove was of another moment
    if not _virtual(sys_path, sysfs):
        glue = os.path.dirname(sys_path)  # <device>/net
        return os.path.basename(glue) == "net" and os.path.isdir(glue)
    if ifindex is None:
        return False
    class_net = f"{sysfs}/class/net"
    try:
        names = os.listdir(class_net)[:_MAX_INTERFACES]
    except OSError:
        return False
    # One read per interface: only one that links to it has its own ifindex read.
    return any(
        _read_int(f"{class_net}/{name}/iflink") == ifindex
        and _read_int(f"{class_net}/{name}/ifindex") != ifindex
        for name in names
    )


def _ifindex(record: DeviceRecord) -> int | None:
    return property_int(record.properties.get("IFINDEX"))


#: The actions of an interface (re)appearing on the host: a return is an ``add`` (and a
#: ``move`` when udev or the runtime renames it); a ``change`` is of one that stayed.
_ARRIVALS = frozenset({None, "add", "move"})


class NetWhereabouts:
    """The interfaces of interest that left the host, and their last records.

    Fed every net record the watcher passes on (:meth:`seen`, :meth:`removed`), told of
    every ``remove`` uevent (:meth:`recheck`) and of each enumeration (:meth:`enumerated`);
    each answers the records to deliver. ``sysfs`` is where the host's sysfs is mounted.
    """

    def __init__(self, sysfs: str = "/sys") -> None:
        self.sysfs = sysfs
        self._last: dict[str, DeviceRecord] = {}
        self.away: dict[str, DeviceRecord] = {}

    def seen(self, record: DeviceRecord) -> list[DeviceRecord]:
        """An interface added or changed: its record, after the removal under its old path
        of an interface away that came back under another."""
        if record.subsystem != NET_SUBSYSTEM:
            return [record]
        out = []
        path = self._returned(record)
        if path is not None:
            old = self.away.pop(path)
            log.info("network interface %s is back on the host", record.sys_name)
            if path != record.sys_path:
                out.append(self._gone(old, "remove"))
        self._last[record.sys_path] = record
        out.append(record)
        return out

    def _returned(self, record: DeviceRecord) -> str | None:
        """The path of the interface away that ``record`` is, back: the same path; else the
        same ifindex (a move keeps it where it is free) of the same kind (virtual) or device
        (its ``net/`` folder); else, for a device with one interface away, that one (the
        pod's namespace may have given it another ifindex)."""
        if record.sys_path in self.away or record.action not in _ARRIVALS:
            return record.sys_path if record.sys_path in self.away else None
        virtual = _virtual(record.sys_path, self.sysfs)
        folder = os.path.dirname(record.sys_path)
        same = [
            p
            for p in self.away
            if _virtual(p, self.sysfs) == virtual and (virtual or os.path.dirname(p) == folder)
        ]
        by_index = [p for p in same if _ifindex(self.away[p]) == _ifindex(record)]
        if by_index:
            return by_index[0]
        return same[0] if len(same) == 1 and not virtual else None

    def removed(self, record: DeviceRecord) -> DeviceRecord:
        """An interface's ``remove``: its last record as ``away`` when it lives on in another
        namespace, else the remove."""
        last = self._last.pop(record.sys_path, None)
        if record.subsystem != NET_SUBSYSTEM or last is None:
            return record
        if not lives_elsewhere(record.sys_path, _ifindex(record), self.sysfs):
            return record
        log.info("network interface %s left the host's network namespace", record.sys_name)
        self.away[record.sys_path] = last
        return dataclasses.replace(last, action=AWAY)

    def forget(self, sys_path: str) -> None:
        """An interface renamed on the host: its old path is no longer one."""
        self._last.pop(sys_path, None)

    def recheck(self) -> list[DeviceRecord]:
        """The interfaces away that no longer exist anywhere, as their final records."""
        out = []
        for path, last in list(self.away.items()):
            if not lives_elsewhere(path, _ifindex(last), self.sysfs):
                del self.away[path]
                out.append(self._gone(last, ENDED if _virtual(path, self.sysfs) else "remove"))
        return out

    def enumerated(self, records: Iterable[DeviceRecord]) -> list[DeviceRecord]:
        """A full enumeration: the interfaces in it, then the last record of each interface
        still away (as ``away``), so that the enumeration does not drop them."""
        out = list(records)
        nets = [r for r in out if r.subsystem == NET_SUBSYSTEM]
        for r in nets:
            self.seen(r)  # an interface back under another name leaves the away set
        self.recheck()
        self._last = {r.sys_path: r for r in nets}
        out += [dataclasses.replace(r, action=AWAY) for r in self.away.values()]
        return out

    def _gone(self, last: DeviceRecord, action: str) -> DeviceRecord:
        why = "is gone with its namespace" if action == ENDED else "is gone (unplugged)"
        log.info("network interface %s that was away %s", last.sys_name, why)
        return DeviceRecord(
            sys_path=last.sys_path,
            subsystem=last.subsystem,
            sys_name=last.sys_name,
            properties=last.properties,
            action=action,
        )
