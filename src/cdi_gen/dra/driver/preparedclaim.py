"""A prepared DRA claim as the driver records it, and its JSON form (no I/O).

:class:`PreparedClaim` names a claim (namespace, name), the devices it was answered
(:class:`~cdi_gen.dra.plugin.claims.PreparedDevice`: requests, pool, device, CDI names, share
ID, admin access) and the transient specs written for it (:class:`SpecName`: kind and
transient ID). :func:`claim_doc` is its entry in the checkpoint
(:mod:`~cdi_gen.dra.driver.checkpoint`, by UID under ``claims``), :func:`parse_claims` reads
them back, refusing with ValueError naming the field.

:func:`read_claim_record` reads the claim record a cdi-gen before checkpoint format 5 wrote
into its claim specs' owner records (the entry with ``uid``, and ``bootId``): read only to
adopt such claims into the checkpoint at start, it can go once no agent of before format 5
remains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdi_gen.dra.plugin.claims import PreparedDevice
from cdi_gen.errors import quote

__all__ = ["PreparedClaim", "SpecName", "claim_doc", "parse_claims", "read_claim_record"]


@dataclass(frozen=True, slots=True)
class SpecName:
    """The name of a transient spec written for one claim, ``<vendor>-<class>@<transient>.json``:
    its kind (``vendor/class``) and transient ID."""

    kind: str
    transient: str


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """One prepared claim as recorded: who it is, the devices it was answered and the
    transient specs written for it."""

    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    specs: tuple[SpecName, ...] = ()

    @property
    def requests(self) -> list[str]:
        """The requests its devices were allocated for, device by device (what its device
        metadata files are named after)."""
        return [r for d in self.devices for r in d.request_names]


def _device_doc(device: PreparedDevice) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "requestNames": list(device.request_names),
        "pool": device.pool,
        "device": device.device,
        "cdiDeviceIds": list(device.cdi_device_ids),
    }
    if device.share_id is not None:
        doc["shareId"] = device.share_id
    if device.admin_access:
        doc["adminAccess"] = True
    return doc


def claim_doc(claim: PreparedClaim) -> dict[str, Any]:
    """The claim's entry in the checkpoint (``specs`` only when it has specs of its own)."""
    doc: dict[str, Any] = {
        "namespace": claim.namespace,
        "name": claim.name,
        "devices": [_device_doc(d) for d in claim.devices],
    }
    if claim.specs:
        doc["specs"] = [{"kind": s.kind, "transient": s.transient} for s in claim.specs]
    return doc


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: want a list of strings, got {quote(value)}")
    return tuple(value)


def _string(doc: Mapping[str, object], key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key}: want a string, got {quote(value)}")
    return value


def _parse_device(doc: object, where: str) -> PreparedDevice:
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: want an object, got {quote(doc)}")
    share_id = doc.get("shareId")
    if share_id is not None and not isinstance(share_id, str):
        raise ValueError(f"{where}.shareId: want a string, got {quote(share_id)}")
    admin = doc.get("adminAccess", False)
    if not isinstance(admin, bool):
        raise ValueError(f"{where}.adminAccess: want a boolean, got {quote(admin)}")
    return PreparedDevice(
        request_names=_strings(doc.get("requestNames"), f"{where}.requestNames"),
        pool=_string(doc, "pool", where),
        device=_string(doc, "device", where),
        cdi_device_ids=_strings(doc.get("cdiDeviceIds"), f"{where}.cdiDeviceIds"),
        share_id=share_id,
        admin_access=admin,
    )


def _parse_specs(doc: object, where: str) -> tuple[SpecName, ...]:
    if doc is None:
        return ()
    if not isinstance(doc, list):
        raise ValueError(f"{where}: want a list, got {quote(doc)}")
    specs = []
    for i, entry in enumerate(doc):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at}: want an object, got {quote(entry)}")
        specs.append(SpecName(_string(entry, "kind", at), _string(entry, "transient", at)))
    return tuple(specs)


def _parse_claim(entry: object, where: str) -> PreparedClaim:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: want an object, got {quote(entry)}")
    devices = entry.get("devices")
    if not isinstance(devices, list):
        raise ValueError(f"{where}.devices: want a list, got {quote(devices)}")
    return PreparedClaim(
        namespace=_string(entry, "namespace", where),
        name=_string(entry, "name", where),
        devices=tuple(_parse_device(d, f"{where}.devices[{i}]") for i, d in enumerate(devices)),
        specs=_parse_specs(entry.get("specs"), f"{where}.specs"),
    )


def parse_claims(doc: object) -> dict[str, PreparedClaim]:
    """The checkpoint's ``claims`` by UID; raises ValueError naming the field."""
    if not isinstance(doc, dict):
        raise ValueError(f"claims: want an object, got {quote(doc)}")
    return {uid: _parse_claim(entry, f"claims[{quote(uid)}]") for uid, entry in doc.items()}


def read_claim_record(doc: object) -> tuple[str, PreparedClaim]:
    """The UID and claim of a claim record in an owner record (see the module docstring);
    raises ValueError naming the field."""
    if not isinstance(doc, dict):
        raise ValueError(f"want an object, got {quote(doc)}")
    claim = _parse_claim(doc, "record")
    if not claim.specs:
        raise ValueError("record.specs: a claim recorded with its specs names them")
    return _string(doc, "uid", "record"), claim
