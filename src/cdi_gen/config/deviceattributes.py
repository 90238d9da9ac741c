"""The DRA device attributes cdi-gen sets itself: one table, read by the config and the pool.

A class's own ``attributes`` may not reuse a name of :data:`BUILT_IN` (so a device's
``class`` always is its class), and the pool builder
(:mod:`cdi_gen.dra.driver.poolentries`) sets no other name than those of the table and the
class's own (``tests/unit/test_pool.py`` builds a device with every source present and
holds the two equal).

Two kinds of entry, told apart by a domain:

- the driver's own (no domain, a C identifier a class could also write): the config refuses
  them in a class, and each takes one of the :data:`MAX_DEVICE_ATTRIBUTES` a device may carry
  from every class (:data:`MAX_CLASS_ATTRIBUTES` are left for its own);
- Kubernetes' standard ones (``resource.kubernetes.io``, see :mod:`cdi_gen.discovery.topology`):
  a class cannot write a domain, and they take only the room the class's own leave, in the
  order of :data:`STANDARD` (those claims align on first).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "BUILT_IN",
    "CDI_NAME",
    "CLASS",
    "DRIVER",
    "KERNEL_NAME",
    "MAX_CLASS_ATTRIBUTES",
    "MAX_DEVICE_ATTRIBUTES",
    "MODEL",
    "NUMA",
    "NUMA_NODE",
    "OWN",
    "PART",
    "PCIE_ROOT",
    "PCI_BUS_ID",
    "SERIAL",
    "SLOT",
    "STANDARD",
    "STANDARD_DOMAIN",
    "SUBSYSTEM",
    "VENDOR",
]

#: The domain Kubernetes reserves for the attributes it defines.
STANDARD_DOMAIN = "resource.kubernetes.io"

CLASS = "class"
CDI_NAME = "cdiName"
SUBSYSTEM = "subsystem"
KERNEL_NAME = "kernelName"
DRIVER = "driver"
VENDOR = "vendor"
MODEL = "model"
SERIAL = "serial"
#: The driver's own NUMA node, any int64 (claims already deployed select on it), beside the
#: standard :data:`NUMA_NODE`.
NUMA = "numaNode"
SLOT = "slot"
#: Whether a device of a composite class (``group.offer: both``) is one part (true) or the
#: whole (false); never on a device with a slot (the config refuses sharing there).
PART = "part"
PCIE_ROOT = f"{STANDARD_DOMAIN}/pcieRoot"
NUMA_NODE = f"{STANDARD_DOMAIN}/numaNode"
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"

#: Every attribute the pool sets itself, and where its value comes from.
BUILT_IN: Mapping[str, str] = MappingProxyType(
    {
        CLASS: "the device's class",
        CDI_NAME: "its fully-qualified CDI name",
        SUBSYSTEM: "udev: its first record's subsystem",
        KERNEL_NAME: "udev: its first record's kernel name",
        DRIVER: "udev: the driver of its first record or the nearest parent with one",
        VENDOR: "udev: ID_VENDOR_FROM_DATABASE, else ID_VENDOR",
        MODEL: "udev: ID_MODEL_FROM_DATABASE, else ID_MODEL",
        SERIAL: "udev: ID_SERIAL_SHORT, else ID_SERIAL",
        NUMA: "sysfs: the numa_node of the nearest PCI device",
        SLOT: "which slot of a shared device it is (sharing.replicas > 1)",
        PART: "a part (true) or the whole (false), with group.offer both",
        PCIE_ROOT: "the root complex of the nearest PCI device",
        NUMA_NODE: "the NUMA node, where Linux can have it",
        PCI_BUS_ID: "the BDF of the nearest PCI device",
    }
)
#: The driver's own built-in names: refused in a class, each one slot of every device.
OWN: frozenset[str] = frozenset(name for name in BUILT_IN if "/" not in name)
#: The standard names, in the order the pool adds them while there is room.
STANDARD: tuple[str, ...] = tuple(name for name in BUILT_IN if "/" in name)

#: Most attributes and capacities one device of a ResourceSlice may carry
#: (ResourceSliceMaxAttributesAndCapacitiesPerDevice); one more and the slice is refused.
MAX_DEVICE_ATTRIBUTES = 32
#: Most attributes of a class's own: what is left once every built-in one of the driver's
#: own that a device can carry is counted (the pool sets at most those before the standard
#: ones), so that no device can go over the limit. :data:`SLOT` and :data:`PART` are never on
#: one device, so they count once.
MAX_CLASS_ATTRIBUTES = MAX_DEVICE_ATTRIBUTES - (len(OWN) - 1)
