"""What the device plugin answers, as pure functions of the advertised devices.

The gRPC layer (:mod:`cdi_gen.deviceplugin.server`) only translates between wire messages and these
functions, so the rules the kubelet relies on can be tested without sockets:

* :func:`check_request`: every requested ID is known, healthy and asked for once;
* :func:`preferred_allocation`: the advisory pick for GetPreferredAllocation;
* :func:`build_cdi_annotations`: the ``cdi.k8s.io/`` annotation for runtimes that read CDI
  devices only from annotations (containerd 1.7.0/1.7.1, CRI-O < 1.28).
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Literal

from cdi_gen.errors import CdiGenError, quote
from cdi_gen.model import AdvertisedDevice
from cdi_gen.names import MAX_SEGMENT_LEN, is_k8s_qualified_name

#: Prefix the runtimes' CDI library scans container annotations for.
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
#: Longest annotation name after the prefix (a Kubernetes qualified name).
MAX_ANNOTATION_NAME_LEN = MAX_SEGMENT_LEN
#: Hex digits of the per-response annotation ID: unique enough within one container.
_ANNOTATION_ID_LEN = 12

PhysicalPolicy = Literal["pack", "spread"]
#: No device ID we advertise is longer: IDs are CDI device names (slot names included).
MAX_DEVICE_ID_LEN = MAX_SEGMENT_LEN


class AllocationRefusal(enum.StrEnum):
    """Why a request was refused; the plugin maps each to a gRPC status code."""

    UNKNOWN = "unknown"
    DUPLICATE = "duplicate"
    UNHEALTHY = "unhealthy"
    UNRESOLVED = "unresolved"
    SAME_PHYSICAL = "same-physical"
    TOO_LONG = "too-long"


class AllocationError(CdiGenError):
    """A container request cannot be granted. Never leaves the plugin: it becomes a gRPC status.

    ``reason`` says which rule failed, ``device_id`` which ID (empty when the spec lookup
    failed for several), ``message`` is the full sentence sent to the kubelet.
    """

    def __init__(self, reason: AllocationRefusal, device_id: str, message: str) -> None:
        super().__init__(reason, device_id, message)
        self.reason = reason
        self.device_id = device_id
        self.message = message

    def __str__(self) -> str:
        return self.message


def check_id_lengths(device_ids: Iterable[str], resource: str) -> None:
    """Raise :class:`AllocationError` for the first ID longer than any device name can be.

    Checked before anything else looks at the IDs, so that a hostile 1 MB ID is quoted
    truncated and never reaches a status message or a log line whole.
    """
    for device_id in device_ids:
        if len(device_id) > MAX_DEVICE_ID_LEN:
            raise AllocationError(
                AllocationRefusal.TOO_LONG,
                device_id[:MAX_DEVICE_ID_LEN],
                f"device ID {quote(device_id, 32)} for resource {resource} is "
                f"{len(device_id)} characters long, longer than {MAX_DEVICE_ID_LEN} "
                "(the longest CDI device name)",
            )


def check_request(
    device_ids: Sequence[str],
    devices: Mapping[str, AdvertisedDevice],
    resource: str,
    *,
    one_per_physical: bool = False,
) -> None:
    """Raise :class:`AllocationError` for the first requested ID that cannot be granted.

    IDs are checked in request order; an ID is refused when it is longer than any device
    name (see :func:`check_id_lengths`), not advertised, repeated
    within the request, or advertised as unhealthy. With ``one_per_physical`` (a shared
    class whose slots make no sense twice in one container) an ID is also refused when an
    earlier ID of the request is a slot of the same physical device.
    """
    check_id_lengths(device_ids, resource)
    seen: set[str] = set()
    physical_of: dict[str, str] = {}
    for device_id in device_ids:
        device = devices.get(device_id)
        if device is None:
            raise AllocationError(
                AllocationRefusal.UNKNOWN,
                device_id,
                f"unknown device {device_id!r} for resource {resource}",
            )
        if device_id in seen:
            raise AllocationError(
                AllocationRefusal.DUPLICATE,
                device_id,
                f"device {device_id!r} requested more than once for resource {resource}",
            )
        if not device.healthy:
            raise AllocationError(
                AllocationRefusal.UNHEALTHY,
                device_id,
                f"device {device_id!r} of resource {resource} is unhealthy",
            )
        if one_per_physical and device.physical:
            other = physical_of.get(device.physical)
            if other is not None:
                raise AllocationError(
                    AllocationRefusal.SAME_PHYSICAL,
                    device_id,
                    f"devices {other!r} and {device_id!r} of resource {resource} are slots of "
                    f"the same device {device.physical}; this class allows one slot per "
                    "container",
                )
            physical_of[device.physical] = device_id
        seen.add(device_id)


def natural_key(device_id: str) -> tuple[tuple[str | int, ...], str]:
    """Sort key that orders ``loop9`` before ``loop10``; the ID itself breaks ties."""
    parts = re.split(r"(\d+)", device_id)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), device_id


def preferred_allocation(
    available: Iterable[str],
    must_include: Iterable[str],
    size: int,
    devices: Mapping[str, AdvertisedDevice],
    *,
    physical: PhysicalPolicy = "pack",
) -> list[str]:
    """Choose ``size`` IDs out of ``available`` for one container (GetPreferredAllocation).

    The answer holds every ``must_include`` ID that is available (first, in natural order),
    then healthy devices packed on the fewest NUMA nodes (nodes the must-include IDs already
    use come first; when one node can take the rest, the smallest such node is used so large
    ones stay whole), then any other available ID only if healthy ones run out. Inside a NUMA
    node, ``physical="pack"`` fills the physical device with the fewest free slots first and
    ``"spread"`` takes one slot per physical device in turn. The result never repeats an ID,
    never leaves ``available`` and depends only on the set of inputs, not their order. It is
    shorter than ``size`` only when fewer IDs are available. Never raises for any input.
    """
    pool = set(available)
    if size <= 0 or not pool:
        return []
    chosen = sorted({d for d in must_include if d in pool}, key=natural_key)[:size]
    taken = set(chosen)
    rest = pool - taken
    healthy = [d for d in rest if (dev := devices.get(d)) is not None and dev.healthy]
    used_nodes = {dev.numa_node for d in chosen if (dev := devices.get(d)) is not None}
    chosen += _pack_numa(healthy, size - len(chosen), devices, used_nodes, physical)
    if len(chosen) < size:
        others = sorted(rest.difference(chosen), key=natural_key)
        chosen += others[: size - len(chosen)]
    return chosen


def _node_key(node: int | None) -> tuple[bool, int]:
    return node is None, node or 0


def _pack_numa(
    candidates: Collection[str],
    need: int,
    devices: Mapping[str, AdvertisedDevice],
    used_nodes: Collection[int | None],
    physical: PhysicalPolicy,
) -> list[str]:
    groups: dict[int | None, list[str]] = {}
    for device_id in candidates:
        groups.setdefault(devices[device_id].numa_node, []).append(device_id)
    ordered = {node: _order_physical(ids, devices, physical) for node, ids in groups.items()}
    picked: list[str] = []
    # Nodes the must-include devices sit on are part of the allocation already.
    for node in sorted(set(used_nodes) & ordered.keys(), key=_node_key):
        picked += ordered.pop(node)[: need - len(picked)]
    while len(picked) < need and ordered:
        left = need - len(picked)
        fitting = [n for n in ordered if len(ordered[n]) >= left]
        if fitting:
            node = min(fitting, key=lambda n: (len(ordered[n]), _node_key(n)))
        else:
            node = min(ordered, key=lambda n: (-len(ordered[n]), _node_key(n)))
        picked += ordered.pop(node)[:left]
    return picked


def _order_physical(
    ids: list[str], devices: Mapping[str, AdvertisedDevice], physical: PhysicalPolicy
) -> list[str]:
    slots: dict[str, list[str]] = {}
    for device_id in ids:
        slots.setdefault(devices[device_id].physical, []).append(device_id)
    for members in slots.values():
        members.sort(key=natural_key)
    if physical == "pack":
        # The most used physical device (fewest free slots) fills up first.
        order = sorted(slots, key=lambda p: (len(slots[p]), natural_key(p)))
        return [d for p in order for d in slots[p]]
    order = sorted(slots, key=lambda p: (-len(slots[p]), natural_key(p)))
    result: list[str] = []
    for turn in range(max(len(m) for m in slots.values())):
        result += [slots[p][turn] for p in order if turn < len(slots[p])]
    return result


def annotation_key(plugin_name: str, device_id: str) -> str:
    """Return ``cdi.k8s.io/<plugin_name>_<device_id>`` under the runtimes' annotation rules.

    ``/`` in ``device_id`` becomes ``_``. Raises :class:`ValueError` quoting the name when
    either part is empty or the name is longer than 63 characters, does not start and end
    with a letter or digit, or holds a character other than ``A-Za-z0-9_.-``.
    """
    if not plugin_name or not device_id:
        raise ValueError(
            f"CDI annotation needs a plugin name and a device ID, got {plugin_name!r}, "
            f"{device_id!r}"
        )
    name = f"{plugin_name}_{device_id.replace('/', '_')}"
    if len(name) > MAX_ANNOTATION_NAME_LEN:
        raise ValueError(
            f"CDI annotation name {name!r} is longer than {MAX_ANNOTATION_NAME_LEN} characters"
        )
    if not is_k8s_qualified_name(name):
        raise ValueError(
            f"CDI annotation name {name!r} should be A-Z a-z 0-9 _ . - "
            "starting and ending with a letter or digit"
        )
    return CDI_ANNOTATION_PREFIX + name


def build_cdi_annotations(vendor: str, cls: str, qualified: Sequence[str]) -> dict[str, str]:
    """Return the one annotation naming ``qualified`` CDI devices for one container.

    The plugin name is ``<vendor>.<class>`` (cut to fit the 63-character limit) and the ID
    is a digest of the names, so the key is stable for the same answer (Allocate stays
    idempotent) and distinct from other resources' keys in the same container. The value is
    the names joined by commas. Raises :class:`ValueError` when no name is given or the key
    cannot be formed.
    """
    if not qualified:
        raise ValueError("CDI annotation needs at least one device name")
    digest = hashlib.blake2b(",".join(qualified).encode(), digest_size=16).hexdigest()
    device_id = digest[:_ANNOTATION_ID_LEN]
    room = MAX_ANNOTATION_NAME_LEN - 1 - len(device_id)
    plugin_name = re.sub(r"[^A-Za-z0-9]+$", "", f"{vendor}.{cls}"[:room])
    return {annotation_key(plugin_name, device_id): ",".join(qualified)}
