"""The driver's pool entries: a DRA class's devices as :class:`~cdi_gen.model.PoolDevice`.

:func:`pool_devices` maps a class's advertised devices to pool entries: a DNS-label name
unique on the node (:func:`device_name`), the fully-qualified CDI name, and the attributes a
DeviceClass or a claim can select on, taken from udev (the first record of the device), and
where the device sits on the PCI bus and which NUMA node it is on under the names Kubernetes
standardised (``resource.kubernetes.io/pcieRoot``, ``numaNode`` and ``pciBusID``, see
:mod:`cdi_gen.discovery.topology`), so that a claim can align it with another driver's
devices. The driver's own ``numaNode`` stays beside the standard one: claims already deployed
select on it. Every name it sets itself is one of :mod:`cdi_gen.config.deviceattributes`,
the table a class's own attributes are checked against.

Every entry fits what the API server accepts in a ResourceSlice: a value that does not (a
string over 64 bytes, a number beyond int64) is left out, never the device; so are the
standard attributes where the class's own ones leave no room within the 32 a device may carry.

:func:`shared_once` turns a shared class's slots into one entry per device for consumable
capacity (:mod:`cdi_gen.dra.plugin.capacity`); :func:`parts_alone` leaves out the wholes of
composite groups where the API server keeps no counters (:mod:`cdi_gen.dra.plugin.counters`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping

from cdi_gen.config import deviceattributes as attribute
from cdi_gen.config.deviceattributes import MAX_DEVICE_ATTRIBUTES
from cdi_gen.config.models import ClassConfig
from cdi_gen.discovery.sharing import slot_device
from cdi_gen.discovery.topology import device_topology, standard_numa_node
from cdi_gen.dra.plugin.slices import MAX_INT_ATTRIBUTE, MAX_STRING_ATTRIBUTE
from cdi_gen.model import AdvertisedDevice, AttributeValue, DiscoveredDevice, PoolDevice
from cdi_gen.names import hashed_label, is_kept_label, qualified_name

__all__ = [
    "PoolCache",
    "PoolEntries",
    "device_name",
    "parts_alone",
    "pool_devices",
    "shared_once",
]

#: udev properties for the descriptive attributes, best first: the hardware database's
#: names are the readable ones; the ID_* of the device itself are what USB/SCSI report.
_PROPERTY_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    attribute.VENDOR: ("ID_VENDOR_FROM_DATABASE", "ID_VENDOR"),
    attribute.MODEL: ("ID_MODEL_FROM_DATABASE", "ID_MODEL"),
    attribute.SERIAL: ("ID_SERIAL_SHORT", "ID_SERIAL"),
}


def device_name(class_name: str, device_id: str, classes: Collection[str]) -> str:
    """A device's name in the pool: ``<class>-<CDI device name>`` when that is a DNS label
    (without ``--``) that no other of the node's ``classes`` could also produce, else a
    readable form plus ``--`` and a hash of the pair.

    The class is part of it because two classes may name devices alike (``loop0``) and a
    pool holds every class of the node. Joined with ``-``, two pairs can spell one name
    (class ``ab`` device ``cd-c``, class ``ab-cd`` device ``c``): such a name belongs to the
    longest class it starts with (``ab-cd``), and the other pair is hashed, so its key
    ``<class>/<device>`` (``/`` is in neither grammar) tells every pair apart. Names depend
    only on the pair and the configured class names, so they are stable across restarts;
    a device plugin class counts too, so ``--api`` does not rename devices.
    """
    text = f"{class_name}-{device_id}"
    if is_kept_label(text) and not any(
        len(other) > len(class_name) and text.startswith(f"{other}-") for other in classes
    ):
        return text
    return hashed_label(text, f"{class_name}/{device_id}".encode("utf-8", "surrogatepass"))


def _fits(value: str) -> bool:
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: not UTF-8, which is all the API stores
        return False
    return 0 < size <= MAX_STRING_ATTRIBUTE


def _udev_attributes(device: DiscoveredDevice) -> dict[str, AttributeValue]:
    out: dict[str, AttributeValue] = {}
    if not device.records:
        return out
    record = device.records[0]
    driver = next(record.drivers, None)
    for key, value in (
        (attribute.SUBSYSTEM, record.subsystem),
        (attribute.KERNEL_NAME, record.sys_name),
        (attribute.DRIVER, driver),
    ):
        if value and _fits(value):
            out[key] = value
    for key, props in _PROPERTY_ATTRIBUTES.items():
        value = next((v for p in props if (v := record.properties.get(p, "").strip())), "")
        if _fits(value):
            out[key] = value
    return out


def _add_standard(
    attributes: dict[str, AttributeValue], device: DiscoveredDevice | None, numa: int | None
) -> None:
    # The class's own attributes were bounded before these names existed: a config that uses
    # all of its room keeps working, and only the standard attributes that fit are added,
    # those claims align on first (the table's order: the root, the NUMA node, the bus ID).
    topology = {} if device is None else device_topology(device.records)
    values: dict[str, AttributeValue | None] = {
        **topology,
        attribute.NUMA_NODE: standard_numa_node(numa),
    }
    # A name the table lacks comes last, never dropped: the pool's test then names it.
    for key in (*attribute.STANDARD, *(k for k in values if k not in attribute.STANDARD)):
        value = values.get(key)
        if value is None or (isinstance(value, str) and not _fits(value)):
            continue
        if len(attributes) < MAX_DEVICE_ATTRIBUTES:
            attributes[key] = value


#: What :func:`pool_devices` built for each device ID last time, and from what: a class of a
#: thousand devices changes one device per event, and the other entries are kept.
PoolCache = dict[str, tuple[AdvertisedDevice, DiscoveredDevice | None, int | None, PoolDevice]]


def _pool_device(
    vendor: str,
    config: ClassConfig,
    adv: AdvertisedDevice,
    found: DiscoveredDevice | None,
    slot: int | None,
    *,
    classes: Collection[str],
) -> PoolDevice:
    # A value over the API's limits is left out rather than cut: a cut serial or model is
    # another value, which a selector could match on the wrong device.
    attributes: dict[str, AttributeValue] = {attribute.CLASS: config.name}
    cdi = qualified_name(vendor, config.name, adv.id)
    if _fits(cdi):
        attributes[attribute.CDI_NAME] = cdi
    if found is not None:
        attributes.update(_udev_attributes(found))
        attributes.update((k, v) for k, v in found.attributes.items() if _fits(v))
    if adv.numa_node is not None and 0 <= adv.numa_node <= MAX_INT_ATTRIBUTE:
        attributes[attribute.NUMA] = adv.numa_node
    if slot is not None:
        attributes[attribute.SLOT] = slot
    if found is not None and found.composite:
        attributes[attribute.PART] = found.part
    _add_standard(attributes, found, adv.numa_node)
    return PoolDevice(
        name=device_name(config.name, adv.id, classes),
        cdi_name=cdi,
        class_name=config.name,
        physical=adv.physical,
        healthy=adv.healthy,
        gone=adv.gone,
        taint_when_gone=config.when_gone == "taint",
        numa_node=adv.numa_node,
        attributes=attributes,
        slots=config.sharing.replicas,
        composite="" if found is None else found.composite,
        part=found is not None and found.part,
    )


def pool_devices(
    vendor: str,
    config: ClassConfig,
    advertised: Iterable[AdvertisedDevice],
    discovered: Mapping[str, DiscoveredDevice],
    cache: PoolCache | None = None,
    *,
    classes: Collection[str],
) -> list[PoolDevice]:
    """The pool entries of one class: each advertised device (by ID, with its health) and
    what discovery knows of it (``discovered`` by device name; slots share the physical
    device's records). Attributes that do not fit a ResourceSlice are left out. ``classes``
    are the names of every class of the config (see :func:`device_name`).

    With ``cache`` (one per class, kept by the caller), a device whose advertised state and
    discovered object (discovery hands out the same object while a device is unchanged) are
    those of the last call is not built again; the cache then holds exactly this call's
    devices."""
    out: list[PoolDevice] = []
    shared = config.sharing.replicas > 1
    seen: dict[str, int] = {}
    fresh: PoolCache = {}
    for adv in advertised:
        found = discovered.get(adv.id)
        slot = None
        if shared:
            slot = seen.get(adv.physical, 0)
            seen[adv.physical] = slot + 1
        last = None if cache is None else cache.get(adv.id)
        if last is not None and last[0] == adv and last[1] is found and last[2] == slot:
            device = last[3]
        else:
            device = _pool_device(vendor, config, adv, found, slot, classes=classes)
        fresh[adv.id] = (adv, found, slot, device)
        out.append(device)
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    return out


def shared_once(devices: Iterable[PoolDevice], *, classes: Collection[str]) -> list[PoolDevice]:
    """One class's pool entries with each shared device's slots replaced by the device
    itself, once, named as its pool name would be unshared (``classes`` as for
    :func:`device_name`), its shares the number of slots; the first slot's CDI name and
    attributes, without ``slot``. Unshared devices pass as they are."""
    out: list[PoolDevice] = []
    seen: set[str] = set()
    for device in devices:
        if device.slots <= 1:
            out.append(device)
            continue
        if device.physical in seen:
            continue
        seen.add(device.physical)
        name = slot_device(device.cdi_name.partition("=")[2])
        out.append(
            dataclasses.replace(
                device,
                name=device_name(device.class_name, name, classes),
                attributes={k: v for k, v in device.attributes.items() if k != attribute.SLOT},
                shares=device.slots,
                slots=1,
            )
        )
    return out


class PoolEntries:
    """The pool entries of every class of a config with ``vendor`` and ``classes`` (every
    class name, see :func:`device_name`), each class's kept from one call to the next and
    built again only where a device changed."""

    def __init__(self, vendor: str, classes: Collection[str]) -> None:
        self.vendor = vendor
        self.classes = tuple(classes)
        #: Per class: the pool entries last built, reused while their device is unchanged.
        self._cache: dict[str, PoolCache] = {}
        #: Shared devices as one entry each with consumable capacity (the API server serves
        #: it), else as their slots.
        self.by_capacity = False
        #: A composite group's whole beside its parts (the API server keeps counters), else
        #: the parts alone: never a whole and its parts free at once without counters.
        self.partitionable = False

    def build(
        self,
        config: ClassConfig,
        advertised: Iterable[AdvertisedDevice],
        discovered: Mapping[str, DiscoveredDevice],
    ) -> tuple[PoolDevice, ...]:
        """``config``'s class as pool entries (see :func:`pool_devices`)."""
        cache = self._cache.setdefault(config.name, {})
        devices = pool_devices(
            self.vendor, config, advertised, discovered, cache, classes=self.classes
        )
        return tuple(self.shared(self.whole_or_parts(devices)))

    def current(self, config: ClassConfig) -> tuple[PoolDevice, ...]:
        """``config``'s class as its last :meth:`build` made it, published as now decided
        (after the start's questions, or a field the API server dropped)."""
        devices = [entry[3] for entry in self._cache.get(config.name, {}).values()]
        return tuple(self.shared(self.whole_or_parts(devices)))

    def shared(self, devices: Iterable[PoolDevice]) -> Iterable[PoolDevice]:
        """One class's entries as shared devices are published: by capacity or as slots."""
        return shared_once(devices, classes=self.classes) if self.by_capacity else devices

    def whole_or_parts(self, devices: Iterable[PoolDevice]) -> Iterable[PoolDevice]:
        """One class's entries as composite groups are published: with counters, all;
        without, each whole that has parts left out (see :func:`parts_alone`)."""
        return devices if self.partitionable else parts_alone(devices)


def parts_alone(devices: Iterable[PoolDevice]) -> list[PoolDevice]:
    """``devices`` without the wholes of composite groups that have a part among them: where
    no counters keep them apart, the parts are offered and the whole is not (a whole without
    parts overlaps nothing and stays)."""
    devices = list(devices)
    with_parts = {(d.class_name, d.composite) for d in devices if d.composite and d.part}
    return [
        d
        for d in devices
        if not (d.composite and not d.part and (d.class_name, d.composite) in with_parts)
    ]
