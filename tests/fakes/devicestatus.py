"""The fake API server's server-side apply of a ResourceClaim's ``status.devices``: each field
manager owns the entries it applied (a list map keyed by driver, pool, device and shareID);
applying anew replaces its set, so the entries it leaves out go."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]
#: Per field manager, the keys of the entries it owns.
Owners = dict[str, set[tuple[Any, ...]]]


def apply_status(
    claim: Obj, owners: Owners, query: dict[str, list[str]], body: Obj, drop: bool
) -> tuple[int, Obj]:
    """The answer to a PATCH (apply) of ``claim``'s status: refused when the body's UID is
    not the claim's (a precondition) or no field manager is named."""
    uid = body.get("metadata", {}).get("uid")
    if uid is not None and uid != claim.get("metadata", {}).get("uid"):
        return 409, _failure(409, "Conflict", "Precondition failed: UID in precondition")
    manager = query.get("fieldManager", [""])[0]
    if not manager:
        return 400, _failure(400, "BadRequest", "PATCH: fieldManager is required for apply")
    apply_devices(claim, owners, manager, body.get("status", {}).get("devices") or [], drop)
    return 200, claim


def _failure(code: int, reason: str, message: str) -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
            "message": message, "code": code}  # fmt: skip


def device_key(entry: Obj) -> tuple[Any, ...]:
    return tuple(entry.get(k) for k in ("driver", "pool", "device", "shareID"))


def apply_devices(claim: Obj, owners: Owners, manager: str, applied: list[Obj], drop: bool) -> None:
    """Apply ``manager``'s ``applied`` entries to ``claim`` (changed in place); with
    ``drop``, as an API server with DRAResourceClaimDeviceStatus off, keep none."""
    released = owners.get(manager, set()) - {device_key(d) for d in applied}
    status = claim.setdefault("status", {})
    kept = [d for d in status.get("devices", []) if device_key(d) not in released]
    by_key = {device_key(d): d for d in kept}
    for entry in applied:
        by_key[device_key(entry)] = entry
    owners[manager] = {device_key(d) for d in applied}
    if by_key and not drop:
        status["devices"] = list(by_key.values())
    else:
        status.pop("devices", None)
