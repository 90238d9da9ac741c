"""What the API server checks in a ResourceSlice (``resource.k8s.io/v1``), as a test oracle.

Written from the rules the API server applies on create and update (Kubernetes
``pkg/apis/resource/validation``, limits from ``k8s.io/api/resource/v1``), for the fields
cdi-gen writes; a field we never write is refused here, so a new one must be added with its
rule. Where a limit differs between releases, the lower one is used. Lengths are Go's
``len()``: bytes of UTF-8.

:func:`slice_problems` checks one object, :func:`pool_problems` a whole pool (names unique
across its slices, every consumed counter set present); both return one line per problem,
empty when the API server would accept everything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL = re.compile(_LABEL)
DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_NUM = r"(0|[1-9][0-9]*)"
_PRE = r"(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_BUILD = r"[0-9A-Za-z-]+"
SEMVER = re.compile(rf"{_NUM}\.{_NUM}\.{_NUM}(-{_PRE}(\.{_PRE})*)?(\+{_BUILD}(\.{_BUILD})*)?")
QUANTITY = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?")

MAX_DEVICES = 128  # ResourceSliceMaxDevices
MAX_DEVICES_RESTRICTED = 64  # with taints or counter consumption
MAX_ATTRIBUTES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_ID = 32  # DeviceMaxIDLength: the C identifier of an attribute name
MAX_DOMAIN = 63  # DeviceMaxDomainLength, and DriverNameMaxLength
MAX_VALUE = 64  # DeviceAttributeMaxValueLength, bytes
MAX_TAINTS = 4  # DeviceTaintsMaxLength (4 when taints came, 16 later)
MAX_COUNTER_SETS = 8  # ResourceSliceMaxCounterSets
MAX_COUNTERS = 32  # per counter set, and per counter consumption
MAX_CONSUMPTIONS = 2  # ResourceSliceMaxDeviceCounterConsumptionsPerDevice
MAX_SUBDOMAIN = 253
INT64 = (-(2**63), 2**63 - 1)
EFFECTS = {"NoSchedule", "NoExecute", "None"}

_SPEC_FIELDS = {"driver", "pool", "nodeName", "devices", "sharedCounters"}
_DEVICE_FIELDS = {
    "name",
    "attributes",
    "capacity",
    "taints",
    "consumesCounters",
    "allowMultipleAllocations",
}


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _subdomain(text: object, limit: int = MAX_SUBDOMAIN) -> bool:
    return (
        isinstance(text, str)
        and 0 < _size(text) <= limit
        and DNS_SUBDOMAIN.fullmatch(text) is not None
    )


def _label(text: object) -> bool:
    return isinstance(text, str) and 0 < _size(text) <= 63 and DNS_LABEL.fullmatch(text) is not None


def _driver(text: object) -> bool:
    # ValidateCSIDriverName: a DNS subdomain (compared lower-cased) of at most 63 characters.
    return isinstance(text, str) and _subdomain(text.lower(), MAX_DOMAIN)


def _int64(value: object, low: int = INT64[0]) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= INT64[1]


def _qualified(name: str) -> str | None:
    """Why ``name`` is not an attribute or capacity name, or None."""
    parts = name.split("/")
    if len(parts) > 2:
        return "more than one '/'"
    if len(parts) == 2 and not _driver(parts[0]):
        return "domain is not a driver name"
    ident = parts[-1]
    if not (0 < len(ident) <= MAX_ID and C_IDENTIFIER.fullmatch(ident)):
        return f"not a C identifier of at most {MAX_ID} characters"
    return None


def _taint_key(key: object) -> bool:
    if not isinstance(key, str):
        return False
    prefix, slash, name = key.rpartition("/")
    if slash and not _subdomain(prefix):
        return False
    return 0 < len(name) <= 63 and LABEL_NAME.fullmatch(name) is not None


def _attribute_problems(at: str, value: object) -> list[str]:
    if not isinstance(value, Mapping) or len(value) != 1:
        return [f"{at}: exactly one of bool, int, string, version"]
    ((kind, v),) = value.items()
    if kind == "bool":
        return [] if isinstance(v, bool) else [f"{at}.bool: not a bool"]
    if kind == "int":
        return [] if _int64(v) else [f"{at}.int: not an int64: {v!r}"]
    if kind not in ("string", "version"):
        return [f"{at}: unknown type {kind!r}"]
    if not isinstance(v, str) or not _utf8(v):
        return [f"{at}.{kind}: not UTF-8 text"]
    out = []
    if _size(v) > MAX_VALUE:
        out.append(f"{at}.{kind}: {_size(v)} bytes, at most {MAX_VALUE}")
    if kind == "version" and not SEMVER.fullmatch(v):
        out.append(f"{at}.version: not semver 2.0.0: {v!r}")
    return out


def _counters_problems(at: str, counters: object) -> list[str]:
    if not isinstance(counters, Mapping) or not counters:
        return [f"{at}: required"]
    if len(counters) > MAX_COUNTERS:
        return [f"{at}: {len(counters)} counters, at most {MAX_COUNTERS}"]
    out = []
    for name, counter in counters.items():
        if not _label(name):
            out.append(f"{at}[{name!r}]: not a DNS label")
        value = counter.get("value") if isinstance(counter, Mapping) else None
        if not (isinstance(value, str) and QUANTITY.fullmatch(value)):
            out.append(f"{at}[{name!r}].value: not a quantity: {value!r}")
    return out


def _taint_problems(at: str, taints: Sequence[Mapping[str, Any]]) -> list[str]:
    out = [f"{at}: {len(taints)}, at most {MAX_TAINTS}"] if len(taints) > MAX_TAINTS else []
    for i, taint in enumerate(taints):
        if not _taint_key(taint.get("key")):
            out.append(f"{at}[{i}].key: not a label name: {taint.get('key')!r}")
        if taint.get("effect") not in EFFECTS:
            out.append(f"{at}[{i}].effect: {taint.get('effect')!r}")
        value = taint.get("value", "")
        if not (_size(value) <= 63 and LABEL_NAME.fullmatch(value or "a")):
            out.append(f"{at}[{i}].value: not a label value")
    return out


def _consumption_problems(at: str, uses: Sequence[Mapping[str, Any]]) -> list[str]:
    out = [f"{at}: {len(uses)}, at most {MAX_CONSUMPTIONS}"] if len(uses) > MAX_CONSUMPTIONS else []
    if len({u.get("counterSet") for u in uses}) != len(uses):
        out.append(f"{at}: a counter set named twice")
    for i, use in enumerate(uses):
        if not _label(use.get("counterSet")):
            out.append(f"{at}[{i}].counterSet: not a DNS label")
        out += _counters_problems(f"{at}[{i}].counters", use.get("counters"))
    return out


def _whole(value: object) -> int | None:
    """A quantity we write (a plain whole number), or None."""
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _capacity_problems(at: str, capacity: Mapping[str, Any], shared: bool) -> list[str]:
    """KEP-5075's rules for what we write: a whole ``value``; a ``requestPolicy`` only on
    a device with ``allowMultipleAllocations``, its ``default`` required with a
    ``validRange`` whose ``min`` is at most the value and whose step the default fits."""
    out = []
    for name, entry in capacity.items():
        where = f"{at}[{name!r}]"
        why = _qualified(name) if isinstance(name, str) else "not text"
        if why:
            out.append(f"{where}: {why}")
        value = _whole(entry.get("value"))
        if value is None:
            out.append(f"{where}.value: not a whole quantity: {entry.get('value')!r}")
            continue
        policy = entry.get("requestPolicy")
        if policy is None:
            continue
        if not shared:
            out.append(f"{where}.requestPolicy: only on a device with allowMultipleAllocations")
        default, valid = _whole(policy.get("default")), policy.get("validRange") or {}
        low, step = _whole(valid.get("min")), _whole(valid.get("step", "1"))
        if default is None or low is None or step is None or step == 0:
            out.append(f"{where}.requestPolicy: default, validRange.min and step required")
        elif not (low <= value and low <= default <= value and (default - low) % step == 0):
            out.append(f"{where}.requestPolicy: default {default} not in {low}..{value}/{step}")
    return out


def device_problems(at: str, device: Mapping[str, Any]) -> list[str]:
    """The problems of one entry of ``spec.devices``."""
    out = [f"{at}.{k}: not a field we expect" for k in device if k not in _DEVICE_FIELDS]
    if not _label(device.get("name")):
        out.append(f"{at}.name: not a DNS label: {device.get('name')!r}")
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES:
        out.append(
            f"{at}: {len(attributes) + len(capacity)} attributes and capacities, "
            f"at most {MAX_ATTRIBUTES}"
        )
    for name, value in attributes.items():
        why = _qualified(name) if isinstance(name, str) else "not text"
        if why:
            out.append(f"{at}.attributes[{name!r}]: {why}")
        out += _attribute_problems(f"{at}.attributes[{name!r}]", value)
    shared = device.get("allowMultipleAllocations", False)
    if not isinstance(shared, bool):
        out.append(f"{at}.allowMultipleAllocations: not a boolean: {shared!r}")
    out += _capacity_problems(f"{at}.capacity", capacity, shared is True)
    out += _taint_problems(f"{at}.taints", device.get("taints") or [])
    out += _consumption_problems(f"{at}.consumesCounters", device.get("consumesCounters") or [])
    return out


def _node_selection(spec: Mapping[str, Any]) -> list[str]:
    chosen = [
        k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if k in spec
    ]
    if chosen != ["nodeName"]:
        return [f"spec: exactly one node selection, we use nodeName; got {chosen}"]
    return [] if _subdomain(spec["nodeName"]) else ["spec.nodeName: not a DNS subdomain"]


def _meta_problems(obj: Mapping[str, Any]) -> list[str]:
    out = []
    if obj.get("apiVersion") != "resource.k8s.io/v1" or obj.get("kind") != "ResourceSlice":
        out.append("apiVersion/kind")
    meta = obj.get("metadata") or {}
    if not _subdomain(meta.get("name")):
        out.append(f"metadata.name: not a DNS subdomain: {meta.get('name')!r}")
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        if not all(ref.get(k) for k in ("apiVersion", "kind", "name", "uid")):
            out.append(f"metadata.ownerReferences[{i}]: apiVersion, kind, name, uid required")
    return out


def _pool_fields(spec: Mapping[str, Any]) -> list[str]:
    out = [f"spec.{k}: not a field we expect" for k in spec if k not in _SPEC_FIELDS]
    if not _driver(spec.get("driver")):
        out.append(f"spec.driver: not a driver name: {spec.get('driver')!r}")
    pool = spec.get("pool") or {}
    name = pool.get("name")
    if not (
        isinstance(name, str)
        and 0 < _size(name) <= MAX_SUBDOMAIN
        and all(_subdomain(p) for p in name.split("/"))
    ):
        out.append(f"spec.pool.name: {name!r}")
    if not _int64(pool.get("generation"), 0):
        out.append(f"spec.pool.generation: {pool.get('generation')!r}")
    if not _int64(pool.get("resourceSliceCount"), 1):
        out.append(f"spec.pool.resourceSliceCount: {pool.get('resourceSliceCount')!r}")
    return out + _node_selection(spec)


def _devices_problems(devices: Sequence[Mapping[str, Any]]) -> list[str]:
    restricted = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    limit = MAX_DEVICES_RESTRICTED if restricted else MAX_DEVICES
    out = [f"spec.devices: {len(devices)}, at most {limit}"] if len(devices) > limit else []
    names = [d.get("name") for d in devices]
    if len(set(names)) != len(names):
        out.append("spec.devices: a name twice")
    for i, device in enumerate(devices):
        out += device_problems(f"spec.devices[{i}]", device)
    return out


def _counter_sets_problems(sets: Sequence[Mapping[str, Any]]) -> list[str]:
    out = []
    if len(sets) > MAX_COUNTER_SETS:
        out.append(f"spec.sharedCounters: {len(sets)}, at most {MAX_COUNTER_SETS}")
    if len({c.get("name") for c in sets}) != len(sets):
        out.append("spec.sharedCounters: a name twice")
    for i, counter_set in enumerate(sets):
        if not _label(counter_set.get("name")):
            out.append(f"spec.sharedCounters[{i}].name: not a DNS label")
        out += _counters_problems(f"spec.sharedCounters[{i}].counters", counter_set.get("counters"))
    return out


def slice_problems(obj: Mapping[str, Any]) -> list[str]:
    """Why the API server would refuse ``obj`` as a ResourceSlice (empty: it would not)."""
    try:
        json.dumps(obj, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        return [f"not encodable as JSON: {exc}"]
    spec = obj.get("spec") or {}
    devices = spec.get("devices") or []
    counter_sets = spec.get("sharedCounters") or []
    out = _meta_problems(obj) + _pool_fields(spec)
    if devices and counter_sets:
        out.append("spec: only one of sharedCounters and devices")
    return out + _devices_problems(devices) + _counter_sets_problems(counter_sets)


def pool_problems(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every slice's problems, then the pool's own: one driver, pool, generation and count
    across its slices, device and counter set names unique in it, every consumed counter set
    defined in it."""
    out = [f"slice {i}: {p}" for i, s in enumerate(slices) for p in slice_problems(s)]
    pools = {
        (s["spec"]["driver"], s["spec"]["pool"]["name"], s["spec"]["pool"]["generation"])
        for s in slices
    }
    if len(pools) != 1:
        out.append(f"slices of more than one pool or generation: {sorted(pools)}")
    if any(s["spec"]["pool"]["resourceSliceCount"] != len(slices) for s in slices):
        out.append("resourceSliceCount is not the number of slices")
    devices = [d for s in slices for d in s["spec"].get("devices") or ()]
    names = [d["name"] for d in devices]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        out.append(f"device names twice in the pool: {twice[:5]}")
    sets = [c["name"] for s in slices for c in s["spec"].get("sharedCounters") or ()]
    if len(set(sets)) != len(sets):
        out.append("counter set names twice in the pool")
    for d in devices:
        for use in d.get("consumesCounters") or ():
            if use["counterSet"] not in sets:
                out.append(f"{d['name']}: consumes undefined counter set {use['counterSet']!r}")
    return out
