"""What the slice publisher keeps of each of our ResourceSlices, and how it compares them.

A slice of 128 devices is tens of kilobytes as a dict, and copies of every slice were most of
what the DRA agent held beyond its imports; :class:`HeldSlice` keeps its uid, its
resourceVersion and the times its taints were added, and :func:`slice_digest` stands for what
decides whether a slice must be written (its owner and spec, without the ``timeAdded`` the API
server fills in). :func:`dropped_fields` tells which feature-gated fields the API server
dropped from what was sent (:data:`GATES`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import orjson

from cdi_gen.dra.plugin.slices import Slice

__all__ = ["GATES", "HeldSlice", "dropped_fields", "keep_taint_times", "slice_digest"]

#: Feature gates whose fields the API server drops when they are off, by our name for them.
GATES = {
    "taints": "DRADeviceTaints (device taints dropped: unhealthy and gone devices stay "
    "allocatable)",
    "counters": "DRAPartitionableDevices (shared counters dropped: slots are published as "
    "plain devices, composite classes as their parts alone)",
    "capacity": "DRAConsumableCapacity (allowMultipleAllocations dropped since the agent "
    "started: a shared device goes to one claim at a time until the agent restarts)",
}


def _devices(obj: Slice) -> list[dict[str, Any]]:
    # Slices from the API server may come from another writer: skip what is not a device.
    devices = (obj.get("spec") or {}).get("devices") or []
    return [d for d in devices if isinstance(d, dict)]


def _taints(device: dict[str, Any]) -> list[dict[str, Any]]:
    taints = device.get("taints") or []
    return [t for t in taints if isinstance(t, dict)] if isinstance(taints, list) else []


def dropped_fields(sent: Slice, got: Slice) -> set[str]:
    """Which gated fields ``sent`` had and ``got`` (the API server's answer) lacks."""
    out: set[str] = set()
    sent_devices, got_devices = _devices(sent), {d.get("name"): d for d in _devices(got)}
    for device in sent_devices:
        back = got_devices.get(device.get("name"), {})
        if device.get("taints") and not back.get("taints"):
            out.add("taints")
        if device.get("consumesCounters") and not back.get("consumesCounters"):
            out.add("counters")
        if device.get("allowMultipleAllocations") and not back.get("allowMultipleAllocations"):
            out.add("capacity")
    if (sent.get("spec") or {}).get("sharedCounters") and not (got.get("spec") or {}).get(
        "sharedCounters"
    ):
        out.add("counters")
    return out


def _untimed(device: Any) -> Any:
    """``device`` without its taints' ``timeAdded`` (a copy only when it has one)."""
    if not isinstance(device, dict):
        return device
    taints = device.get("taints")
    if not isinstance(taints, list) or not any(
        isinstance(t, dict) and "timeAdded" in t for t in taints
    ):
        return device
    bare = [
        {k: v for k, v in t.items() if k != "timeAdded"} if isinstance(t, dict) else t
        for t in taints
    ]
    return {**device, "taints": bare}


def slice_digest(obj: Slice) -> bytes:
    """What decides whether a slice must be written, as a digest: its owner and its spec,
    without the taints' ``timeAdded`` that the API server fills in (key order aside)."""
    spec = obj.get("spec") or {}
    spec = dict(spec) if isinstance(spec, dict) else {"": spec}
    if isinstance(spec.get("devices"), list):
        spec["devices"] = [_untimed(d) for d in spec["devices"]]
    for key in ("devices", "sharedCounters"):
        if not spec.get(key):
            spec.pop(key, None)
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    try:
        text = orjson.dumps([owners, spec], option=orjson.OPT_SORT_KEYS)
    except TypeError:
        # orjson refuses integers beyond 64 bits, which another writer's slice may hold.
        text = json.dumps([owners, spec], sort_keys=True).encode()
    return hashlib.blake2b(text, digest_size=16).digest()


#: A taint of a device: (device name, key, effect).
_TaintKey = tuple[Any, Any, Any]


@dataclass(frozen=True, slots=True)
class HeldSlice:
    """What is kept of one of our slices as the API server last showed it."""

    uid: str | None
    resource_version: str | None
    #: When each taint was added (usually none).
    taint_times: dict[_TaintKey, Any]

    @classmethod
    def of(cls, obj: Slice) -> HeldSlice:
        meta = obj["metadata"]
        times = {
            (d.get("name"), t.get("key"), t.get("effect")): t["timeAdded"]
            for d in _devices(obj)
            for t in _taints(d)
            if t.get("timeAdded")
        }
        return cls(meta.get("uid"), meta.get("resourceVersion"), times)


def keep_taint_times(obj: Slice, current: HeldSlice | None) -> None:
    """Carry over the time each existing taint was added: a NoExecute taint's
    ``tolerationSeconds`` count from it, and a rewrite of the slice is no new taint."""
    if current is None or not current.taint_times:
        return
    times = current.taint_times
    for device in _devices(obj):
        for taint in _taints(device):
            when = times.get((device["name"], taint["key"], taint["effect"]))
            if when is not None:
                taint["timeAdded"] = when
