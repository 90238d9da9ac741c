"""A DRA claim's own CDI spec: its class's devices with the claim's configuration applied (pure).

A claim whose configuration (:mod:`cdi_gen.config.claimconfig`) selects some of its devices
gets, per class, a transient spec ``<vendor>-<class>_<tag>.json`` holding one device per
configured device: the class device's edits with every device node's ``uid``, ``gid``,
``fileMode`` and ``permissions`` set from the configuration and its environment variables
added (replacing the class's of the same name). The kubelet is answered with those devices'
names, so only that claim's containers get them; the class's spec stays as it is for every
other claim. The spec's ``cdiVersion`` is the class spec's: nothing the configuration sets
needs a newer one, and a class pinned for its runtime stays readable by it.

The devices are named ``claim-<tag>-<n>``, the claim's tag and the device's place among the
claim's devices (a letter first: a name starting with a digit needs cdiVersion 0.5.0): unique
on the node (two specs of one kind must never define one name, or the
runtime drops both), within the CDI length limit whatever the device's own name, and stable
for a claim prepared again.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.config.claimconfig import DeviceConfig
from cdi_gen.errors import Problem, SpecError, quote

__all__ = [
    "MAX_PLAIN_TAG",
    "claim_device_name",
    "claim_spec",
    "claim_tag",
    "configured_edits",
    "device_index",
]

#: Longest claim UID used as it is in names; a longer one (the kubelet allows 128) is hashed,
#: so that ``claim-<tag>-<n>`` stays within the 63 characters of a CDI device name.
MAX_PLAIN_TAG = 48


def claim_tag(uid: str) -> str:
    """The claim's part of its spec's and devices' names: its UID (a Kubernetes UUID), or a
    hash of it when it is longer than :data:`MAX_PLAIN_TAG`."""
    if len(uid) <= MAX_PLAIN_TAG:
        return uid
    return "h" + hashlib.sha256(uid.encode()).hexdigest()[:40]


def claim_device_name(uid: str, index: int) -> str:
    """The name of the claim's ``index``-th device in its own spec."""
    return f"claim-{claim_tag(uid)}-{index}"


def configured_edits(edits: Mapping[str, Any], config: DeviceConfig) -> dict[str, Any]:
    """A copy of the wire ``containerEdits`` with ``config`` applied: its device node fields
    on every device node, its environment variables replacing those of the same name."""
    out = copy.deepcopy(dict(edits))
    nodes = config.device_nodes
    if nodes is not None:
        fields = nodes.model_dump(by_alias=True, exclude_none=True)
        out["deviceNodes"] = [{**node, **fields} for node in out.get("deviceNodes") or []]
    if config.env:
        kept = [e for e in out.get("env") or [] if e.partition("=")[0] not in config.env]
        out["env"] = kept + [f"{name}={value}" for name, value in config.env.items()]
    return out


def device_index(class_spec: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The class spec's wire devices by name (a caller keeping the spec keeps this too)."""
    return {
        d["name"]: d
        for d in class_spec.get("devices") or []
        if isinstance(d, Mapping) and isinstance(d.get("name"), str)
    }


def claim_spec(
    class_spec: Mapping[str, Any],
    devices: Sequence[tuple[str, str, DeviceConfig]],
    mounts: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    *,
    index: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The wire spec document of one claim's configured devices of one class.

    ``class_spec`` is the class's spec document as written; ``devices`` holds, per configured
    device, the class device's name, its name in the claim's spec and its configuration;
    ``mounts`` wire mounts to add, by the device's name in the claim's spec (the device
    metadata files); ``index`` the class spec's :func:`device_index`, when kept.
    Raises :class:`~cdi_gen.errors.SpecError` naming the device when the class spec does not
    hold it (it left the spec since the pool was read) or the result is not a valid spec.
    """
    kind = class_spec.get("kind")
    by_name = device_index(class_spec) if index is None else index
    entries = []
    for device, name, config in devices:
        found = by_name.get(device)
        if found is None:
            why = "not in the class's spec (removed since the claim was allocated?)"
            raise SpecError([Problem(f"devices[{quote(device)}]", why)], str(kind))
        if name in by_name:
            why = f"the claim's device name {quote(name)} is taken by the class's spec"
            raise SpecError([Problem(f"devices[{quote(device)}]", why)], str(kind))
        edits = configured_edits(found.get("containerEdits") or {}, config)
        extra = (mounts or {}).get(name)
        if extra:
            edits["mounts"] = [*(edits.get("mounts") or []), *map(dict, extra)]
        entries.append(build_entry(name, edits))
    doc = assemble(str(kind), entries, target_version=class_spec.get("cdiVersion"))
    if class_spec.get("containerEdits"):
        # Injected with any device of the class: a device of the claim's spec too.
        doc["containerEdits"] = copy.deepcopy(class_spec["containerEdits"])
    return doc
