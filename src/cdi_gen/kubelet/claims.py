"""What NodePrepareResources answers for one claim: the checks and the devices (pure).

The kubelet sends only a claim's namespace, name and UID; the driver reads the claim through
a :class:`ClaimReader` (the agent's, over the API server) and :func:`prepare_claim` decides,
from that :class:`~cdi_gen.model.ClaimView` and a snapshot of the node's device pool, which
devices the claim gets or why it cannot have them. Only this driver's allocation results
count: a claim may hold devices of other drivers, which their own drivers prepare.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from cdi_gen.errors import ClaimError, quote
from cdi_gen.model import AllocatedDevice, ClaimView, PoolDevice

__all__ = [
    "ClaimReader",
    "ClaimRefused",
    "PreparedDevice",
    "Refusal",
    "claim_label",
    "prepare_claim",
]


class ClaimReader(Protocol):
    """Reads a ResourceClaim for NodePrepareResources.

    Called on the gRPC server's threads, never on the event loop; blocking is allowed (and
    bounded by the implementation). Raises :class:`~cdi_gen.errors.ClaimError` naming the
    claim when it cannot be read (not found, API server unreachable or refusing).
    """

    def read_claim(self, namespace: str, name: str) -> ClaimView: ...


class Refusal(enum.StrEnum):
    """Why a claim is not prepared; also the ``reason`` of the prepare metrics hook."""

    NO_UID = "no-uid"
    UID_MISMATCH = "uid-mismatch"
    NOT_ALLOCATED = "not-allocated"
    NO_DEVICES = "no-devices"
    OTHER_POOL = "other-pool"
    UNKNOWN_DEVICE = "unknown-device"
    GONE = "gone"
    UNHEALTHY = "unhealthy"


class ClaimRefused(ClaimError):  # noqa: N818 - a refusal, like files.FileRefused
    """The claim was read but cannot be prepared here; ``reason`` says which rule."""

    def __init__(self, reason: Refusal, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources answers it."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


def claim_label(namespace: str, name: str, uid: str) -> str:
    """How messages and logs name a claim: ``ns/name (uid u)``, values quoted when odd."""
    ref = f"{namespace}/{name}"
    shown = ref if ref.isprintable() and len(ref) <= 2 * 63 + 1 else quote(ref)
    return f"claim {shown} (uid {quote(uid)})"


def _check_device(
    label: str, result: AllocatedDevice, pool_name: str, devices: Mapping[str, PoolDevice]
) -> PoolDevice:
    where = (
        f"{label}: device {quote(result.device)} (pool {quote(result.pool)}) "
        f"of request {quote(result.request)}"
    )
    if result.pool != pool_name:
        raise ClaimRefused(
            Refusal.OTHER_POOL,
            f"{where} is in another pool; this node's pool is {quote(pool_name)}",
        )
    device = devices.get(result.device)
    if device is None:
        raise ClaimRefused(Refusal.UNKNOWN_DEVICE, f"{where} is not in this node's pool")
    if device.gone:
        raise ClaimRefused(Refusal.GONE, f"{where} is gone from the node")
    if not device.healthy:
        raise ClaimRefused(Refusal.UNHEALTHY, f"{where} is unhealthy")
    return device


def prepare_claim(
    uid: str,
    claim: ClaimView,
    *,
    driver: str,
    pool_name: str,
    devices: Mapping[str, PoolDevice],
) -> list[PreparedDevice]:
    """The devices to answer for the claim the kubelet asked for by ``uid``.

    ``claim`` is what the API server holds under the kubelet's namespace/name, ``devices``
    one snapshot of the pool (name -> device). Each of this driver's allocation results
    becomes one device, in the allocation's order. Raises :class:`ClaimRefused` naming the
    claim, the device and the rule when the claim is not the one asked for, is not
    allocated, has no device of this driver, or names a device this node cannot give.
    """
    label = claim_label(claim.namespace, claim.name, uid)
    if not uid:
        raise ClaimRefused(Refusal.NO_UID, f"{label}: the request carries no claim UID")
    if claim.uid != uid:
        raise ClaimRefused(
            Refusal.UID_MISMATCH,
            f"{label}: the API server's claim of that name has uid {quote(claim.uid)} "
            "(deleted and re-created?)",
        )
    if claim.results is None:
        raise ClaimRefused(Refusal.NOT_ALLOCATED, f"{label}: not allocated")
    ours = [r for r in claim.results if r.driver == driver]
    if not ours:
        raise ClaimRefused(
            Refusal.NO_DEVICES,
            f"{label}: its allocation has no device of driver {quote(driver)}",
        )
    prepared = []
    for result in ours:
        device = _check_device(label, result, pool_name, devices)
        prepared.append(
            PreparedDevice(
                request_names=(result.request,),
                pool=result.pool,
                device=result.device,
                cdi_device_ids=(device.cdi_name,),
                share_id=result.share_id,
            )
        )
    return prepared
