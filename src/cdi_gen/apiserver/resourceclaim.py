"""A ResourceClaim as the API server answers it, reduced to what NodePrepareResources needs
(:class:`~cdi_gen.model.ClaimView`), every field checked.

An object not shaped as a claim is one :class:`~cdi_gen.errors.ClaimError` naming the claim
and the field.
"""

from __future__ import annotations

from typing import Any

from cdi_gen.errors import ClaimError, quote
from cdi_gen.model import AllocatedDevice, ClaimView, ConfigEntry
from cdi_gen.names import is_dns_label, is_dns_subdomain

__all__ = ["POD_CLAIM_NAME", "claim_view"]

#: Set by the API server on a claim made from a ResourceClaimTemplate: the pod's name for it.
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"


def claim_view(obj: object) -> ClaimView:
    """A ResourceClaim (as a dict) reduced to what NodePrepareResources needs.

    Raises :class:`ClaimError` naming the claim and the field when ``obj`` is not shaped
    as one: a field of the wrong type, a result without ``request``, ``driver``, ``pool``
    or ``device``.
    """
    meta = _field(obj, "metadata", dict, "a ResourceClaim", {})
    namespace, name = meta.get("namespace"), meta.get("name")
    shown = f"{namespace}/{name}"
    # Names the API server gave as Kubernetes names read as they are; anything else is quoted.
    plain = isinstance(namespace, str) and isinstance(name, str)
    plain = plain and is_dns_label(str(namespace)) and is_dns_subdomain(str(name))
    ref = f"ResourceClaim {shown if plain else quote(shown)}"
    namespace = _field(meta, "namespace", str, ref, "")
    name = _field(meta, "name", str, ref, "")
    uid = _field(meta, "uid", str, ref, "")
    status = _field(obj, "status", dict, ref, {})
    allocation = _field(status, "allocation", dict, ref, None)
    results: tuple[AllocatedDevice, ...] | None = None
    config: tuple[ConfigEntry, ...] = ()
    if allocation is not None:
        devices = _field(allocation, "devices", dict, ref, {})
        entries = _field(devices, "results", list, ref, [])
        results = tuple(
            _result(entry, f"{ref}: status.allocation.devices.results[{i}]")
            for i, entry in enumerate(entries)
        )
        configs = _field(devices, "config", list, f"{ref}: status.allocation.devices", [])
        config = tuple(
            entry
            for i, doc in enumerate(configs)
            if (entry := _config(doc, i, f"{ref}: status.allocation.devices.config[{i}]"))
        )
    annotations = _field(meta, "annotations", dict, ref, {})
    pod_claim_name = _field(annotations, POD_CLAIM_NAME, str, f"{ref}: annotations", None)
    if pod_claim_name is not None and not is_dns_label(pod_claim_name):
        # It becomes a folder of the path the pod's containers read device metadata from.
        raise ClaimError(
            f"{ref}: annotation {POD_CLAIM_NAME} {quote(pod_claim_name)} is not a pod's claim "
            "name: want a DNS label"
        )
    return ClaimView(
        namespace=namespace,
        name=name,
        uid=uid,
        results=results,
        config=config,
        pod_claim_name=pod_claim_name,
        pods=_pods(status.get("reservedFor")),
    )


def _pods(reserved: object) -> tuple[tuple[str, str], ...]:
    """The pods of ``status.reservedFor`` as (name, UID). Only Events are addressed with
    them, so an entry that is not a pod with a name and UID is passed over, never an error."""
    if not isinstance(reserved, list):
        return ()
    out = []
    for entry in reserved:
        if not isinstance(entry, dict) or entry.get("resource") != "pods":
            continue
        name, uid = entry.get("name"), entry.get("uid")
        core = entry.get("apiGroup") in ("", None)
        if core and isinstance(name, str) and is_dns_subdomain(name) and isinstance(uid, str):
            out += [(name, uid)] if uid else []
    return tuple(out)


_KINDS: dict[type[Any], str] = {
    dict: "an object",
    list: "a list",
    str: "a string",
    bool: "a boolean",
}


def _field(doc: object, key: str, kind: type[Any], where: str, default: Any) -> Any:
    """``doc[key]`` if it is a ``kind`` (``default`` when absent or null)."""
    if not isinstance(doc, dict):
        raise ClaimError(f"{where}: want an object, got {quote(doc)}")
    value = doc.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        want = _KINDS.get(kind, kind.__name__)
        raise ClaimError(f"{where}: {key}: want {want}, got {quote(value)}")
    return value


def _result(entry: object, where: str) -> AllocatedDevice:
    fields = {}
    for key in ("request", "driver", "pool", "device"):
        value = _field(entry, key, str, where, None)
        if value is None:
            raise ClaimError(f"{where}: has no {key!r}; every allocation result names one")
        fields[key] = value
    return AllocatedDevice(
        **fields,
        share_id=_field(entry, "shareID", str, where, None),
        admin_access=_field(entry, "adminAccess", bool, where, False),
    )


def _config(doc: object, index: int, where: str) -> ConfigEntry | None:
    """One ``config`` entry of the allocation; None when it is not opaque (a kind of
    configuration newer than this reader: no driver of ours could use it)."""
    source = _field(doc, "source", str, where, "")
    requests = _field(doc, "requests", list, where, [])
    if not all(isinstance(r, str) for r in requests):
        raise ClaimError(f"{where}: requests: want a list of strings, got {quote(requests)}")
    opaque = _field(doc, "opaque", dict, where, None)
    if opaque is None:
        return None
    driver = _field(opaque, "driver", str, f"{where}.opaque", None)
    if driver is None:
        raise ClaimError(f"{where}.opaque: has no 'driver'; every opaque entry names one")
    return ConfigEntry(
        source=source,
        driver=driver,
        requests=tuple(requests),
        parameters=opaque.get("parameters"),
        index=index,
    )
