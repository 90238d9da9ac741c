"""The node's pool as ResourceSlice objects (``resource.k8s.io/v1``), as plain dicts.

One pool per node, named after the node, published by one driver in as many slices as the
API's limits need:

- a slice holds at most 128 devices, or 64 when any of its devices has taints or consumes
  counters; plain devices and restricted ones (tainted, or slots of a shared device) are
  chunked apart, so one device turning unhealthy does not halve the slices of the others;
- ``sharedCounters`` and ``devices`` may not share a slice, and a slice holds at most 8
  counter sets: the counter sets of shared devices come in slices of their own;
- every slice carries the pool's ``generation`` and ``resourceSliceCount``, so the scheduler
  uses only a complete pool of the newest generation;
- device names are unique in the pool: the pool's names are unique by construction, and a
  duplicate that reached here anyway is left out rather than make the API refuse a slice.

Slice names are deterministic (``<node>-<driver>-<index>``, shortened with a hash when too
long): the publisher updates a slice in place instead of creating and deleting, and adopts
the slices a previous run of the agent left.

A shared device (``sharing.replicas: N``) becomes a counter set ``{slots: N}`` named after
the physical device, and each of its N slot devices consumes one ``slots`` of it. With the
``DRAPartitionableDevices`` gate off the API server drops both fields and the slots remain N
plain devices, which allocate the same way. Where the API server serves consumable capacity
(:mod:`~cdi_gen.dra.plugin.capacity`), a shared device is instead one device with
``allowMultipleAllocations`` and a ``shares: N`` capacity (no counters; chunked as a plain
device).

A composite group (``group.offer: both``: a disk and its partitions, an adapter and its
ports) is its whole and each part as devices, and counter sets named after the whole with one
counter per part (the part's device name, value 1): each part consumes its own counter and
the whole consumes every one, so the scheduler gives the whole or any parts, never both, and
parts stay independent. One counter per part, rather than one count of all, keeps any order
of slice writes safe while parts come and go: a counter without its consumers yet excludes
nothing it should not, and a device naming a counter not yet (or no longer) published makes
the pool invalid, so nothing of it is allocated meanwhile. A set holds at most 32 counters
and a device consumes from at most 2 sets, so a whole counts at most 64 parts; parts beyond
them are left out (never offered without their counter). Parts whose whole is not in the
pool consume nothing: they exclude no one.

Taints (``DRADeviceTaints``): a gone device kept with ``whenGone: taint`` is tainted
``<driver>/gone:NoExecute`` (pods using it are evicted); one kept with ``whenGone:
unhealthy`` is ``<driver>/gone:NoSchedule``; an unhealthy present device is
``<driver>/unhealthy:NoSchedule``. A taint is what keeps the scheduler off a device that stays
in the slice; without the gate nothing does, which the publisher reports.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cdi_gen.model import PoolDevice, attribute_wire
from cdi_gen.names import hashed_label

__all__ = [
    "API_VERSION",
    "MAX_COUNTER_SETS",
    "MAX_DEVICES",
    "MAX_DEVICES_RESTRICTED",
    "MAX_INT_ATTRIBUTE",
    "MAX_PARTS",
    "MAX_STRING_ATTRIBUTE",
    "SHARES_CAPACITY",
    "Slice",
    "build_slices",
    "composite_set_name",
    "composites",
    "counter_set_name",
    "device_capacity",
    "device_taints",
    "slice_name",
]

API_VERSION = "resource.k8s.io/v1"
#: Devices in one slice (ResourceSliceMaxDevices).
MAX_DEVICES = 128
#: Devices in one slice when any of them has taints or consumes counters.
MAX_DEVICES_RESTRICTED = 64
#: Counter sets in one slice (ResourceSliceMaxCounterSets).
MAX_COUNTER_SETS = 8
#: Longest string (or version) attribute value a ResourceSlice accepts, in bytes of UTF-8
#: (DeviceAttributeMaxValueLength, checked with Go's len(), which counts bytes).
MAX_STRING_ATTRIBUTE = 64
#: Largest int attribute (int64); a larger number makes the whole slice undecodable.
MAX_INT_ATTRIBUTE = 2**63 - 1
#: Counters in one counter set (ResourceSliceMaxCountersPerCounterSet).
MAX_COUNTERS_PER_SET = 32
#: Counter sets one device consumes from (ResourceSliceMaxDeviceCounterConsumptionsPerDevice).
MAX_CONSUMPTIONS = 2
#: Parts a composite whole counts, and so the most parts of one group the pool offers.
MAX_PARTS = MAX_COUNTERS_PER_SET * MAX_CONSUMPTIONS
#: Longest object name (a DNS subdomain).
_MAX_NAME = 253
#: The counter every shared device's set holds, and each slot consumes one of.
SLOTS_COUNTER = "slots"
#: The capacity of a shareable device that each claim consumes a part of.
SHARES_CAPACITY = "shares"

Slice = dict[str, Any]


def slice_name(node: str, driver: str, index: int) -> str:
    """The name of the pool's ``index``-th slice: ``<node>-<driver>-<index>``.

    Node and driver names are DNS subdomains, so the joined name is one as long as it fits
    in 253 characters; a longer one keeps its start and gets a hash of the whole, so two
    long node names that share a prefix do not collide.
    """
    suffix = f"-{index}"
    base = f"{node}-{driver}"
    if len(base) + len(suffix) <= _MAX_NAME:
        return base + suffix
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    keep = base[: _MAX_NAME - len(suffix) - len(digest) - 1].rstrip(".-")
    return f"{keep}-{digest}{suffix}"


def counter_set_name(device: PoolDevice) -> str:
    """The counter set of a shared device's slots: its class and physical device as a DNS
    label, hashed from both apart (a class has no NUL), so two physical devices, of one
    class or of two, never share a set."""
    key = f"{device.class_name}\0{device.physical}".encode("utf-8", "surrogatepass")
    return hashed_label(f"{device.class_name}-{device.physical}", key)


def composite_set_name(whole: PoolDevice, index: int) -> str:
    """The ``index``-th counter set of a composite whole's parts: the whole's name (unique in
    the pool) and the index as a DNS label, hashed from both apart from any slot set's."""
    key = f"parts\0{whole.name}\0{index}".encode("utf-8", "surrogatepass")
    return hashed_label(f"{whole.name}-parts-{index}", key)


#: Per device name, what it consumes; the counter sets; the parts left out.
Composites = tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]], set[str]]


def composites(devices: Sequence[PoolDevice]) -> Composites:
    """The counters of the pool's composite groups (see the module's docstring)."""
    wholes: dict[tuple[str, str], PoolDevice] = {}
    parts: dict[tuple[str, str], list[PoolDevice]] = {}
    for d in devices:
        if d.composite:
            key = (d.class_name, d.composite)
            if d.part:
                parts.setdefault(key, []).append(d)
            else:
                wholes.setdefault(key, d)
    consumes: dict[str, list[dict[str, Any]]] = {}
    sets: list[dict[str, Any]] = []
    left_out: set[str] = set()
    for key, whole in wholes.items():
        its = parts.get(key, [])
        left_out.update(p.name for p in its[MAX_PARTS:])
        uses = []
        for index, chunk in enumerate(_chunks(its[:MAX_PARTS], MAX_COUNTERS_PER_SET)):
            name = composite_set_name(whole, index)
            # Fresh dicts each: a slice is a tree its writer may change in place.
            sets.append({"name": name, "counters": {p.name: {"value": "1"} for p in chunk}})
            uses.append({"counterSet": name, "counters": {p.name: {"value": "1"} for p in chunk}})
            for p in chunk:
                consumes[p.name] = [{"counterSet": name, "counters": {p.name: {"value": "1"}}}]
        if uses:
            consumes[whole.name] = uses
    return consumes, sets, left_out


def device_capacity(shares: int) -> dict[str, Any]:
    """The ``capacity`` of a device with ``shares`` shares: a claim takes one unless it asks
    for more, any whole number up to all of them."""
    return {
        SHARES_CAPACITY: {
            "value": str(shares),
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}},
        }
    }


def device_taints(driver: str, device: PoolDevice) -> list[dict[str, str]]:
    """The taints of one device (none for a healthy present device)."""
    if device.gone:
        effect = "NoExecute" if device.taint_when_gone else "NoSchedule"
        return [{"key": f"{driver}/gone", "effect": effect}]
    if not device.healthy:
        return [{"key": f"{driver}/unhealthy", "effect": "NoSchedule"}]
    return []


def _device(
    driver: str, device: PoolDevice, consumes: Mapping[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": device.name}
    if device.attributes:
        # The driver's own names unqualified: its domain is implied, and a qualified key is
        # limited to a 63-character domain that a driver name may exceed. Names of another
        # domain (Kubernetes' standard ones) must be written qualified, and already are.
        out["attributes"] = {k: attribute_wire(v) for k, v in sorted(device.attributes.items())}
    taints = device_taints(driver, device)
    if taints:
        out["taints"] = taints
    if device.shares > 1:
        out["allowMultipleAllocations"] = True
        out["capacity"] = device_capacity(device.shares)
    if device.slots > 1:
        out["consumesCounters"] = [
            {"counterSet": counter_set_name(device), "counters": {SLOTS_COUNTER: {"value": "1"}}}
        ]
    elif device.name in consumes:
        out["consumesCounters"] = consumes[device.name]
    return out


def _restricted(device: dict[str, Any]) -> bool:
    return "taints" in device or "consumesCounters" in device


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _counter_sets(devices: Sequence[PoolDevice]) -> list[dict[str, Any]]:
    sets: dict[str, int] = {}
    for d in devices:
        if d.slots > 1:
            sets.setdefault(counter_set_name(d), d.slots)
    return [
        {"name": name, "counters": {SLOTS_COUNTER: {"value": str(slots)}}}
        for name, slots in sets.items()
    ]


def _first_of_each_name(devices: Sequence[PoolDevice]) -> list[PoolDevice]:
    seen: set[str] = set()
    out = []
    for d in devices:
        if d.name not in seen:
            seen.add(d.name)
            out.append(d)
    return out


def build_slices(
    driver: str,
    node: str,
    devices: Sequence[PoolDevice],
    generation: int,
    *,
    node_uid: str | None,
) -> list[Slice]:
    """The ResourceSlices of the node's pool at ``generation``: plain devices first (128 a
    slice), then tainted or counter-consuming ones (64 a slice), then the counter sets (8 a
    slice: slots' sets, then composite groups'). An empty pool is one slice without devices,
    so the pool (and its generation) stays visible. The Node owns every slice when its
    ``node_uid`` is known, so the slices go with the Node."""
    unique = _first_of_each_name(devices)
    consumes, part_sets, left_out = composites(unique)
    if left_out:
        unique = [d for d in unique if d.name not in left_out]
    entries = [_device(driver, d, consumes) for d in unique]
    plain = [e for e in entries if not _restricted(e)]
    restricted = [e for e in entries if _restricted(e)]
    specs: list[dict[str, Any]] = [{"devices": list(c)} for c in _chunks(plain, MAX_DEVICES)]
    specs += [{"devices": list(c)} for c in _chunks(restricted, MAX_DEVICES_RESTRICTED)]
    counter_sets = _counter_sets(unique) + part_sets
    specs += [{"sharedCounters": list(c)} for c in _chunks(counter_sets, MAX_COUNTER_SETS)]
    if not specs:
        specs = [{}]
    metadata_base: dict[str, Any] = {}
    if node_uid is not None:
        metadata_base["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
    out: list[Slice] = []
    for index, content in enumerate(specs):
        spec: dict[str, Any] = {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": len(specs)},
        }
        spec.update(content)
        out.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": {"name": slice_name(node, driver, index), **metadata_base},
                "spec": spec,
            }
        )
    return out
