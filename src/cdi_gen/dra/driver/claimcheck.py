"""What NodePrepareResources answers for one claim: the checks and the devices (pure).

The generic part reads the claim the kubelet names through a
:class:`~cdi_gen.dra.plugin.claims.ClaimReader` (the agent's, over the API server) and checks
that it is that claim; :func:`prepare_claim` decides, from that
:class:`~cdi_gen.model.ClaimView` and a snapshot of the node's device pool, which devices
the claim gets or why it cannot have them. Only this driver's allocation results count: a
claim may hold devices of other drivers, which their own drivers prepare.

A device published with consumable capacity (``shares`` > 1) is allocated in shares, each
result with its own ``shareID``, several of them possibly in one claim; every share is
answered with that ID and the device's one CDI name. A share ID must be what the API stores
there, a UID (:data:`~cdi_gen.names.K8S_UUID_RULE`): any other value, empty included, is
refused before anything else is looked at, so a result either has no share or a share with a
UID, alike in the answer, the status and the checkpoint. A share ID is refused on a device the
node publishes unshared (a share holds nothing in the checkpoint, so it must not get round
an exclusive device), as is a result of a shareable device without one, or one ID twice.
A claim allocated before the node published its shared device in the other form (slots or
capacity, chosen as the agent starts) is refused saying so.

:func:`overlapping` names the devices a composite group's whole or part shares nodes with
(the part's whole; the whole's parts), which the preparer holds against other claims too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cdi_gen.discovery.sharing import slot_device
from cdi_gen.dra.driver.refusal import DriverRefusal
from cdi_gen.dra.plugin.claims import ClaimRefused, PreparedDevice
from cdi_gen.errors import quote
from cdi_gen.model import AllocatedDevice, ClaimView, PoolDevice
from cdi_gen.names import K8S_UUID_RULE, is_dns_label, is_k8s_uuid

__all__ = ["MAX_ALLOCATION_RESULTS", "is_request_name", "overlapping", "prepare_claim"]

#: The API's limit on ``status.allocation.devices.results`` of one claim (resource/v1
#: ``AllocationResultsMaxSize``). A claim over it is not one the API server stores; refusing
#: it bounds what one prepared claim records in the checkpoint.
MAX_ALLOCATION_RESULTS = 32


def overlapping(devices: Mapping[str, PoolDevice], name: str) -> list[str]:
    """The devices of the pool that share nodes with device ``name``: for a composite
    group's part, its whole; for the whole, its parts; none for any other device."""
    device = devices.get(name)
    if device is None or not device.composite:
        return []
    return [
        other.name
        for other in devices.values()
        if other.composite == device.composite
        and other.class_name == device.class_name
        and other.name != name
        and not (other.part and device.part)
    ]


def _check_device(
    label: str, result: AllocatedDevice, pool_name: str, devices: Mapping[str, PoolDevice]
) -> PoolDevice:
    where = (
        f"{label}: device {quote(result.device)} (pool {quote(result.pool)}) "
        f"of request {quote(result.request)}"
    )
    if result.pool != pool_name:
        raise ClaimRefused(
            DriverRefusal.OTHER_POOL,
            f"{where} is in another pool; this node's pool is {quote(pool_name)}",
        )
    device = devices.get(result.device)
    if device is None:
        raise ClaimRefused(
            DriverRefusal.UNKNOWN_DEVICE,
            f"{where} is not in this node's pool{_published_otherwise(result, devices)}",
        )
    if device.gone:
        raise ClaimRefused(DriverRefusal.GONE, f"{where} is gone from the node")
    if not device.healthy:
        raise ClaimRefused(DriverRefusal.UNHEALTHY, f"{where} is unhealthy")
    return device


def _slot_of(name: str) -> str | None:
    try:
        return slot_device(name)
    except ValueError:
        return None


def _published_otherwise(result: AllocatedDevice, devices: Mapping[str, PoolDevice]) -> str:
    """Why a device the claim names is unknown when the node publishes it in the other
    form now: a shared device is one device with shares where the API server keeps
    consumable capacity and N slots where it does not, asked as the agent starts, so a
    claim allocated before a switch names a device that is no more (empty if not so)."""
    again = "the claim was allocated before; re-create it (or its pod) to have it allocated again"
    whole = _slot_of(result.device)
    shared = devices.get(whole) if whole is not None else None
    if result.share_id is None and shared is not None and shared.shares > 1:
        return (
            f": it is a slot of device {quote(whole)}, which this node publishes by consumable "
            f"capacity since its agent started; {again}"
        )
    if result.share_id is None:
        return ""
    slots = sorted(n for n, d in devices.items() if d.slots > 1 and _slot_of(n) == result.device)
    if slots:
        return (
            f": this node publishes it as {len(slots)} slots ({quote(slots[0])} ...) since its "
            f"agent started, where the API server drops consumable capacity; {again}"
        )
    return ""


def _check_shares(label: str, results: Sequence[tuple[AllocatedDevice, PoolDevice]]) -> None:
    seen: set[tuple[str, str]] = set()
    for result, device in results:
        where = f"{label}: device {quote(result.device)} of request {quote(result.request)}"
        share = result.share_id
        if share is None:
            if device.shares > 1:
                raise ClaimRefused(
                    DriverRefusal.INVALID_SHARE,
                    f"{where} is shared by capacity, yet its allocation has no shareID",
                )
            continue
        if device.shares <= 1:
            raise ClaimRefused(
                DriverRefusal.INVALID_SHARE,
                f"{where} has shareID {quote(share)}, yet this node publishes it unshared",
            )
        if (result.device, share) in seen:
            raise ClaimRefused(
                DriverRefusal.INVALID_SHARE, f"{where}: shareID {quote(share)} is given twice"
            )
        seen.add((result.device, share))


def is_request_name(request: str) -> bool:
    """Whether ``request`` is what an allocation result may name: a request (a DNS label)
    or a subrequest of one (``main/sub``, two DNS labels), as the API validates them."""
    main, slash, sub = request.partition("/")
    return is_dns_label(main) and (not slash or is_dns_label(sub))


def _check_names(label: str, results: Sequence[AllocatedDevice]) -> None:
    """Refuse names from the API server that paths and messages are built from: request
    names and share IDs (the pod's claim name, a folder inside the container, is checked
    where the claim is decoded: :mod:`~cdi_gen.apiserver.resourceclaim`)."""
    for result in results:
        if not is_request_name(result.request):
            raise ClaimRefused(
                DriverRefusal.INVALID_REQUEST,
                f"{label}: its allocation names request {quote(result.request)}: want a DNS "
                "label, or two joined by '/' for a subrequest (1-63 characters of a-z 0-9 -, "
                "starting and ending alphanumeric)",
            )
        share = result.share_id
        if share is not None and not is_k8s_uuid(share):
            raise ClaimRefused(
                DriverRefusal.INVALID_SHARE,
                f"{label}: device {quote(result.device)} of request {quote(result.request)}: "
                f"shareID {quote(share, 60)} is not a share ID: want {K8S_UUID_RULE}",
            )


def prepare_claim(
    label: str,
    claim: ClaimView,
    *,
    driver: str,
    pool_name: str,
    devices: Mapping[str, PoolDevice],
) -> list[PreparedDevice]:
    """The devices to answer for ``claim``, named ``label`` in messages.

    ``claim`` is what the API server answered, checked by the generic part to be the claim
    the kubelet named (:func:`~cdi_gen.dra.plugin.claims.check_read`); ``devices`` one
    snapshot of the pool (name -> device). Each of this driver's allocation results becomes
    one device, in the allocation's order. Raises :class:`ClaimRefused` naming the claim,
    the device and the rule when the claim is not allocated, has more results than the API
    allows, has no device of this driver, names a request that is not a request name, names
    a device this node cannot give, or a share that does not fit the device (see the module
    docstring).
    """
    if claim.results is None:
        raise ClaimRefused(DriverRefusal.NOT_ALLOCATED, f"{label}: not allocated")
    if len(claim.results) > MAX_ALLOCATION_RESULTS:
        raise ClaimRefused(
            DriverRefusal.TOO_MANY_RESULTS,
            f"{label}: its allocation has {len(claim.results)} results; the API allows at "
            f"most {MAX_ALLOCATION_RESULTS} per claim",
        )
    ours = [r for r in claim.results if r.driver == driver]
    if not ours:
        raise ClaimRefused(
            DriverRefusal.NO_DEVICES,
            f"{label}: its allocation has no device of driver {quote(driver)}",
        )
    _check_names(label, ours)
    checked = [(r, _check_device(label, r, pool_name, devices)) for r in ours]
    _check_shares(label, checked)
    prepared = []
    for result, device in checked:
        prepared.append(
            PreparedDevice(
                request_names=(result.request,),
                pool=result.pool,
                device=result.device,
                cdi_device_ids=(device.cdi_name,),
                share_id=result.share_id,
                admin_access=result.admin_access,
            )
        )
    return prepared
