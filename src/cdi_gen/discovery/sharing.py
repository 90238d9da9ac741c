"""Shared devices: one physical device advertised as N slots that N containers may hold.

Extended resources are integers and the kubelet gives a device ID to one container at a time,
so a class like ``kvm`` that advertised its single node would let one pod per node use it.
With ``sharing: {replicas: N}`` each physical device becomes N IDs, ``<device>-0`` to
``<device>-<N-1>``, stable across restarts. Each slot is its own CDI device with the physical
device's edits: every name the plugin returns exists in the spec, is a valid CDI name, and
several slots of one device injected into one container simply name the same node.

Slots inherit the physical device's health and NUMA node and carry its identity in
``physical``, so a removal withdraws all of them (in the agent's usual spec-last order) and
GetPreferredAllocation can spread or pack them across physical devices.

Where the API server serves consumable capacity (KEP-5075), the DRA driver publishes a shared
device once instead, with N shares a claim asks for by amount; it finds the device's name
again from any of its slots (:func:`slot_device`), and every share gets the first slot's CDI
entry (the slots' edits are the device's, so any one of them would do).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from cdi_gen.errors import InvalidNameError
from cdi_gen.model import AdvertisedDevice, ClassChange, DiscoveredDevice, DiscoveryWarning
from cdi_gen.names import validate_device_name


def slot_names(device: str, replicas: int) -> list[str]:
    """The IDs of ``device``'s slots; raise :class:`InvalidNameError` if one is not a valid
    CDI device name (too long once the suffix is added)."""
    names = [f"{device}-{slot}" for slot in range(replicas)]
    validate_device_name(names[-1])  # the longest suffix
    return names


def slot_device(slot: str) -> str:
    """The name of the device whose slot ID is ``slot`` (``kvm-3`` -> ``kvm``): the
    suffix :func:`slot_names` added, taken off again."""
    device, dash, number = slot.rpartition("-")
    if not dash or not device or not number.isdigit():
        raise ValueError(f"{slot!r} is not a slot ID (<device>-<number>)")
    return device


def _expand(device_name: str, replicas: int) -> list[str] | None:
    try:
        return slot_names(device_name, replicas)
    except InvalidNameError:
        return None


def expand_devices(
    devices: Iterable[DiscoveredDevice], replicas: int
) -> tuple[tuple[DiscoveredDevice, ...], tuple[DiscoveryWarning, ...]]:
    """Each device replaced by its slots; devices whose slot names would be invalid are
    skipped with a warning."""
    out: list[DiscoveredDevice] = []
    warnings: list[DiscoveryWarning] = []
    for device in devices:
        names = _expand(device.name, replicas)
        if names is None:
            warnings.append(
                DiscoveryWarning(
                    device.class_name,
                    device.physical,
                    f"slot name {device.name}-{replicas - 1!s} is not a valid CDI device name "
                    f"(at most 63 characters); device {device.name!r} skipped",
                )
            )
            continue
        out += [dataclasses.replace(device, name=name) for name in names]
    return tuple(out), tuple(warnings)


def expand_advertised(
    devices: Iterable[AdvertisedDevice], replicas: int
) -> tuple[AdvertisedDevice, ...]:
    """Each advertised device replaced by its slots (same health, NUMA node and physical)."""
    out: list[AdvertisedDevice] = []
    for device in devices:
        names = _expand(device.id, replicas)
        if names is not None:
            out += [dataclasses.replace(device, id=name) for name in names]
    return tuple(out)


def expand_change(change: ClassChange, replicas: int) -> ClassChange:
    """The same change seen through slots: every device name becomes its N slot names."""
    if replicas <= 1:
        return change
    devices, warnings = expand_devices(change.devices, replicas)

    def names(of: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n for name in of for n in (_expand(name, replicas) or ()))

    fresh = tuple(w for w in warnings if w not in change.warnings)
    return dataclasses.replace(
        change,
        devices=devices,
        added=names(change.added),
        removed=names(change.removed),
        changed=names(change.changed),
        warnings=change.warnings + fresh,
        after_write=expand_advertised(change.after_write, replicas),
    )
