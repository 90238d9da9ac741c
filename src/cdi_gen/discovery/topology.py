"""Where a device sits on the PCI bus, from its udev record: the attributes Kubernetes
standardised so that devices of different drivers can be aligned (``matchAttribute``).

The names are those of Kubernetes' ``deviceattribute`` package (KEP-4381), in the reserved
``resource.kubernetes.io`` domain (named in :mod:`cdi_gen.config.deviceattributes`, the
table of every attribute the pool sets itself); the values are derived as its Linux helpers
derive them:

- ``pciBusID``: the extended BDF of the nearest PCI device at or above the record
  (``dddd:bb:dd.f``, lower-case hex: anything else is no BDF);
- ``pcieRoot``: the root complex of that PCI device, the first element of its sysfs path below
  ``/sys/devices`` (``pci0000:00``); a path outside ``/sys/devices/pci…`` or not ending in the
  BDF gives none;
- ``numaNode`` (KEP-6072, an int): the NUMA node of the device, which the udev source reads
  from that same PCI device's sysfs ``numa_node`` (:attr:`DeviceRecord.numa_node`); none for
  -1 (no affinity: the helper refuses it, as -1 would align every such device) or a number
  beyond the nodes Linux can have (:func:`standard_numa_node`).

Pure: a record already carries the sysfs paths of its parents, so nothing here reads sysfs.
A device made of several records (a group) gets an attribute only where all its records
agree, so a claim aligned on it never gets a member that sits elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from cdi_gen.config.deviceattributes import NUMA_NODE, PCI_BUS_ID, PCIE_ROOT, STANDARD_DOMAIN
from cdi_gen.model import DeviceRecord

__all__ = [
    "NUMA_NODE",
    "PCIE_ROOT",
    "PCI_BUS_ID",
    "STANDARD_DOMAIN",
    "device_topology",
    "is_pci_bus_id",
    "pcie_root",
    "record_topology",
    "standard_numa_node",
]

#: Linux has at most 1024 NUMA nodes (NODES_SHIFT ≤ 10); Kubernetes' helper refuses more.
MAX_NUMA_NODES = 1024

#: The BDF the helper accepts: 4, 2, 2 and 1 lower-case hex digits (no longer PCI domains).
_BDF_RE = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")
_DEVICES = "/sys/devices/"


def is_pci_bus_id(text: str) -> bool:
    """Whether ``text`` is an extended BDF as the standard attribute spells it."""
    return _BDF_RE.fullmatch(text) is not None


def pcie_root(sys_path: str, bdf: str) -> str | None:
    """The root complex (``pci<domain>:<bus>``) of the PCI device ``bdf`` at ``sys_path``,
    or None unless the path lies under ``/sys/devices/pci…`` and ends in the BDF."""
    if not sys_path.startswith(_DEVICES):
        return None
    parts = sys_path[len(_DEVICES) :].split("/")
    # The root is a directory of its own: the device is at least one level below it.
    if len(parts) < 2 or parts[-1] != bdf or not parts[0].startswith("pci") or "" in parts:
        return None
    return parts[0]


def standard_numa_node(numa_node: int | None) -> int | None:
    """The value of ``resource.kubernetes.io/numaNode`` for a device on ``numa_node``: None
    (leave it out) for no node, a negative one or one beyond :data:`MAX_NUMA_NODES`."""
    if numa_node is None or not 0 <= numa_node < MAX_NUMA_NODES:
        return None
    return numa_node


def record_topology(record: DeviceRecord) -> dict[str, str]:
    """The standard PCI attributes of one record: none without a PCI device at or above it
    or when that device's name is no BDF; no root when its path is not below one."""
    chain: list[tuple[str | None, str, str]] = [
        (record.subsystem, record.sys_name, record.sys_path)
    ]
    chain += [(p.subsystem, p.sys_name, p.sys_path) for p in record.parents]
    for subsystem, sys_name, sys_path in chain:
        if subsystem != "pci":
            continue
        # Only the nearest PCI device counts: a bridge above a malformed one is another device.
        if not is_pci_bus_id(sys_name):
            return {}
        out = {PCI_BUS_ID: sys_name}
        root = pcie_root(sys_path, sys_name)
        if root is not None:
            out[PCIE_ROOT] = root
        return out
    return {}


def device_topology(records: Iterable[DeviceRecord]) -> dict[str, str]:
    """The standard PCI attributes of a device made of ``records``: each one all of them
    share (none for no records)."""
    found = [record_topology(r) for r in records]
    if not found:
        return {}
    first, *rest = found
    return {k: v for k, v in first.items() if all(other.get(k) == v for other in rest)}
