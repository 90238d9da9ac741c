"""The domain types every layer shares: device records, discovered and advertised devices,
and the change of one class.

Plain frozen values with no I/O and no adapter behind them (importing this module loads
neither pyudev nor grpc): udev records come in from :mod:`cdi_gen.sources`, discovery turns
them into :class:`DiscoveredDevice` s and :class:`ClassChange` s, and the kubelet side sees
:class:`AdvertisedDevice` s.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

__all__ = [
    "AdvertisedDevice",
    "AllocatedDevice",
    "AttributeValue",
    "ClaimView",
    "ClassChange",
    "ConfigEntry",
    "DeviceRecord",
    "DiscoveredDevice",
    "DiscoveryWarning",
    "NodeInfo",
    "ParentRecord",
    "PoolDevice",
    "RecordWants",
    "attribute_wire",
]

#: One shared empty mapping for the many devices without templated attributes.
NO_ATTRIBUTES: Mapping[str, str] = MappingProxyType({})

#: A DRA device attribute as the driver publishes it: an int, a bool or a string (ResourceSlices
#: also know semantic versions, which no attribute of ours is).
AttributeValue = int | bool | str


def attribute_wire(value: AttributeValue) -> dict[str, Any]:
    """An attribute in the API's form (``{"int": 3}``), as ResourceSlices and the device
    metadata files (KEP-5304) both spell it."""
    # bool before int: True is an int to Python, a different attribute type to the API.
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One device node of a device: where it is on the host, and its numbers now."""

    host_path: str
    container_path: str
    major: int | None
    minor: int | None
    type: Literal["b", "c"]
    sys_path: str


@dataclass(frozen=True, slots=True)
class DiscoveredDevice:
    """One CDI device of a class: a matched record, or a group of them."""

    name: str
    class_name: str
    #: sys_path of the record, or of the grouping parent; the physical identity of the device.
    physical: str
    nodes: tuple[NodeInfo, ...]
    numa_node: int | None
    healthy: bool
    #: The rule that matched each member, in udev notation, e.g. ``SUBSYSTEM=="block", ...``.
    rules: tuple[str, ...]
    #: Its wire ``containerEdits`` (camelCase, as the spec holds them): the one form kept per
    #: device, which its spec entry holds by reference. Never mutated once built.
    edits: Mapping[str, Any]
    records: tuple[DeviceRecord, ...] = field(compare=False, default=())
    #: Its node disappeared and the class keeps it (``whenGone: unhealthy`` or ``taint``).
    gone: bool = False
    #: The class's templated DRA attributes, rendered (those that rendered).
    attributes: Mapping[str, str] = field(default_factory=lambda: NO_ATTRIBUTES)
    #: Of a class that offers a group's whole and its parts (``group.offer: both``): the
    #: group's identity (the whole's ``physical``), shared by the whole and its parts.
    composite: str = ""
    #: One node of such a group, offered alone; the whole has False.
    part: bool = False

    def advertised(self) -> AdvertisedDevice:
        return AdvertisedDevice(
            id=self.name,
            healthy=self.healthy,
            numa_node=self.numa_node,
            physical=self.physical,
            gone=self.gone,
        )


@dataclass(frozen=True, slots=True)
class DiscoveryWarning:
    """A matched device that was skipped, and why (the log line says it all)."""

    class_name: str
    sys_path: str
    message: str

    def __str__(self) -> str:
        return f"class {self.class_name!r}: device {self.sys_path}: {self.message}"


@dataclass(frozen=True, slots=True)
class ClassChange:
    """The result of feeding records for one class whose device set changed.

    The agent keeps its invariant by publishing :meth:`before_write` of what it advertises,
    writing the spec of ``devices`` (or removing it when empty), then publishing
    ``after_write``.
    """

    class_name: str
    devices: tuple[DiscoveredDevice, ...]
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    #: Warnings that are new since the previous change of this class.
    warnings: tuple[DiscoveryWarning, ...] = ()
    after_write: tuple[AdvertisedDevice, ...] = ()

    def before_write(self, advertised: Iterable[AdvertisedDevice]) -> list[AdvertisedDevice]:
        """What to advertise while the spec is rewritten, given what is ``advertised`` now.

        Every advertised device that is still present, marked unhealthy if it became so;
        nothing new yet. Computed from what is advertised, not from the previous change: a
        spec write that failed left the previous list unpublished.
        """
        now = {d.id: d for d in self.after_write}
        return [
            new if not new.healthy else old
            for old in advertised
            if (new := now.get(old.id)) is not None
        ]


@dataclass(frozen=True, slots=True)
class AdvertisedDevice:
    """One device as the kubelet sees it.

    ``id`` is the CDI device name (unqualified) and also the kubelet device ID, so the
    qualified CDI name is always ``<vendor>/<class>=<id>``. ``physical`` names the physical
    device behind it: several IDs share one when a device is shared in slots.
    """

    id: str
    healthy: bool = True
    numa_node: int | None = None
    physical: str = ""
    #: Kept while its node is missing (``whenGone``); always unhealthy then.
    gone: bool = False


@dataclass(frozen=True, slots=True)
class PoolDevice:
    """One device as a DRA driver publishes it in the node's ResourceSlices.

    ``name`` is the device's name in the pool, a DNS label unique on the node (class and CDI
    name, see :func:`cdi_gen.dra.driver.poolentries.device_name`); ``cdi_name`` the
    fully-qualified CDI name NodePrepareResources answers with. ``attributes`` are unqualified
    (the driver's domain is implied), except those of another domain, which are fully
    qualified (``resource.kubernetes.io/pcieRoot``). A slot of a shared device has ``slots``
    > 1 and shares ``physical`` with the device's other slots; a shared device published once
    with consumable capacity has ``shares`` > 1 instead (and ``slots`` 1). The whole of a
    composite group and its parts share ``composite``.
    """

    name: str
    cdi_name: str
    class_name: str
    physical: str
    healthy: bool = True
    gone: bool = False
    #: ``whenGone: taint``: while gone, published with a NoExecute taint (pods evicted).
    taint_when_gone: bool = False
    numa_node: int | None = None
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    slots: int = 1
    #: Claims that may hold the device at once, one share each by default (KEP-5075).
    shares: int = 1
    #: A group's whole or one of its parts (``group.offer: both``): the group's identity,
    #: the same for the whole and its parts; empty for any other device.
    composite: str = ""
    #: One part of such a group (the whole has False): it excludes the whole, and the whole
    #: excludes it, through counters (:mod:`cdi_gen.dra.plugin.slices`).
    part: bool = False


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One entry of a ResourceClaim's ``status.allocation.devices.results``."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    #: ``adminAccess: true``: the device is given to this claim while others hold it too.
    admin_access: bool = False


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One opaque entry of a ResourceClaim's ``status.allocation.devices.config``.

    ``source`` is ``FromClass`` or ``FromClaim``; ``requests`` the requests it is limited to
    (empty: all); ``parameters`` the driver's own document, as JSON decoded it (checked by
    the driver it is for, never here).
    """

    source: str
    driver: str
    requests: tuple[str, ...] = ()
    parameters: object = field(default=None, compare=False, hash=False)
    #: Its index in the allocation's config list, for messages.
    index: int = 0


@dataclass(frozen=True, slots=True)
class ClaimView:
    """What NodePrepareResources needs of a ResourceClaim read from the API server."""

    namespace: str
    name: str
    uid: str
    #: Every allocation result (any driver's); None when the claim is not allocated.
    results: tuple[AllocatedDevice, ...] | None
    #: The allocation's opaque configuration entries (any driver's), in the API's order.
    config: tuple[ConfigEntry, ...] = ()
    #: The pod's name for the claim when a template made it (the claim's
    #: ``resource.kubernetes.io/pod-claim-name`` annotation), else None.
    pod_claim_name: str | None = None
    #: The pods the claim is reserved for (``status.reservedFor``), as (name, UID): whom an
    #: Event about its devices is for.
    pods: tuple[tuple[str, str], ...] = ()


#: The subsystem of network interfaces: the one kind of device served without a device node
#: (the runtime moves an interface by name into the container, CDI ``netDevices``).
NET_SUBSYSTEM = "net"


def servable(subsystem: str | None, devnode: str | None) -> bool:
    """Whether a device can be handed to a container: it has a node, or is an interface."""
    return bool(devnode) or subsystem == NET_SUBSYSTEM


@dataclass(frozen=True, slots=True)
class ParentRecord:
    """One ancestor of a device: enough for DRIVERS/ATTRS matching and grouping."""

    sys_path: str
    sys_name: str
    subsystem: str | None = None
    devtype: str | None = None
    driver: str | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """What udev knows of one device at one moment (an enumeration or an event).

    ``attributes`` holds only the sysfs attributes the config asks for (reading every
    attribute of every device costs more than the rest together); ``parents`` runs from
    the immediate parent up. ``action`` is None for enumerated devices, else the uevent
    action (add, remove, change, bind, unbind, move), or one of
    :mod:`cdi_gen.sources.netns` for a network interface: ``away`` (moved into another
    network namespace; its last record, kept) or ``ended`` (destroyed with that namespace).
    A ``remove`` record carries only what the uevent said: sysfs is already gone.
    """

    sys_path: str
    subsystem: str
    sys_name: str
    sys_number: str | None = None
    devnode: str | None = None
    devtype: str | None = None
    major: int | None = None
    minor: int | None = None
    driver: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    attributes: Mapping[str, str] = field(default_factory=dict)
    parents: tuple[ParentRecord, ...] = ()
    #: The NUMA node of the nearest PCI device at or above the record (without one, of the
    #: nearest device with a node); None for -1 or none (see cdi_gen.sources.udev).
    numa_node: int | None = None
    node_exists: bool = True
    action: str | None = None

    @property
    def drivers(self) -> Iterator[str]:
        """The driver of the device, then of each parent (udev DRIVERS order)."""
        if self.driver:
            yield self.driver
        for p in self.parents:
            if p.driver:
                yield p.driver


@dataclass(frozen=True, slots=True)
class RecordWants:
    """The sysfs attributes worth reading for a config (see ``ClassConfig.wanted_*``)."""

    attributes: frozenset[str] = frozenset()
    parent_attributes: frozenset[str] = frozenset()
