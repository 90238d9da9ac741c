"""What NodePrepareResources answers for one claim: the checks and the devices (pure), and
the :class:`ClaimPreparer` protocol between the DRA driver's gRPC side and its state.

The kubelet sends only a claim's namespace, name and UID; the driver reads the claim through
a :class:`ClaimReader` (the agent's, over the API server) and :func:`prepare_claim` decides,
from that :class:`~cdi_gen.model.ClaimView` and a snapshot of the node's device pool, which
devices the claim gets or why it cannot have them. Only this driver's allocation results
count: a claim may hold devices of other drivers, which their own drivers prepare.

The kubelet's namespace, name and UID are input too: :func:`check_reference` refuses them
unless they are Kubernetes names (and a UID of sane shape) before anything is read, since
they become a path on the API server.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from cdi_gen.errors import ClaimError, quote
from cdi_gen.model import AllocatedDevice, ClaimView, PoolDevice
from cdi_gen.names import is_dns_label, is_dns_subdomain

__all__ = [
    "MAX_ALLOCATION_RESULTS",
    "MAX_UID_LEN",
    "ClaimPreparer",
    "ClaimReader",
    "ClaimRef",
    "ClaimRefused",
    "PrepareResult",
    "PreparedDevice",
    "Refusal",
    "check_reference",
    "claim_label",
    "is_request_name",
    "prepare_claim",
]

#: The API's limit on ``status.allocation.devices.results`` of one claim (resource/v1
#: ``AllocationResultsMaxSize``). A claim over it is not one the API server stores; refusing
#: it bounds what one prepared claim records in the checkpoint.
MAX_ALLOCATION_RESULTS = 32
#: Longest claim UID accepted from the kubelet: the API server makes UUIDs (36 characters).
MAX_UID_LEN = 128
_UID_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


class ClaimReader(Protocol):
    """Reads ResourceClaims for NodePrepareResources.

    Called on the gRPC server's threads, never on the event loop. ``read_claims`` reads
    every ``(namespace, name)`` of ``refs`` at once and returns, in their order, each claim
    or the :class:`~cdi_gen.errors.ClaimError` naming it and why it cannot be read (not
    found, API server unreachable or refusing, an answer that is not a claim, no answer
    within ``timeout`` seconds). It returns within ``timeout`` (plus a little): the caller
    passes what is left of its own caller's deadline.
    """

    def read_claims(
        self, refs: Sequence[tuple[str, str]], timeout: float
    ) -> list[ClaimView | ClaimError]: ...


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepare/UnprepareResources."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """What preparing one claim gave: its devices, or ``error`` (one line naming the claim
    and the rule; ``""`` when prepared) and ``reason``, the ``on_prepare`` metrics reason
    (``""``, a :class:`Refusal` value, ``"claim-read"``, ``"checkpoint"`` or
    ``"internal"``)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
    reason: str = ""


class ClaimPreparer(Protocol):
    """The DRA driver's state behind its kubelet service: which claims are prepared, and
    with which devices. The gRPC side (:mod:`~cdi_gen.kubelet.draplugin`) checks the
    requests' shape and answers; everything it answers comes from here.

    Called on the gRPC server's threads. ``claims`` have passed :func:`check_reference`.
    ``timeout`` is what the caller's deadline leaves for the work (reading claims, waiting
    for another call on the same claim); an implementation returns within it plus the time
    to record, answering a claim it could not get to with an error the kubelet retries.
    Neither method raises for one claim: every claim gets its own result.
    """

    def load(self) -> None:
        """Read what survives restarts, before the kubelet is served. Raises
        :class:`~cdi_gen.errors.CdiGenError` naming the file and why when it cannot."""
        ...

    @property
    def count(self) -> int:
        """How many claims are prepared now."""
        ...

    def prepare(self, claims: Sequence[ClaimRef], timeout: float) -> list[PrepareResult]:
        """Each claim's devices (the same answer again for a claim prepared earlier), or
        why not, in the order of ``claims``."""
        ...

    def unprepare(self, claims: Sequence[ClaimRef], timeout: float) -> list[str]:
        """Forget each claim (one never prepared is already unprepared); per claim ``""``
        or the error, in the order of ``claims``."""
        ...


class Refusal(enum.StrEnum):
    """Why a claim is not prepared; also the ``reason`` of the prepare metrics hook."""

    INVALID_NAME = "invalid-name"
    INVALID_UID = "invalid-uid"
    NO_UID = "no-uid"
    TOO_MANY_RESULTS = "too-many-results"
    UID_MISMATCH = "uid-mismatch"
    NAME_MISMATCH = "name-mismatch"
    INVALID_REQUEST = "invalid-request"
    NOT_ALLOCATED = "not-allocated"
    NO_DEVICES = "no-devices"
    OTHER_POOL = "other-pool"
    UNKNOWN_DEVICE = "unknown-device"
    GONE = "gone"
    UNHEALTHY = "unhealthy"
    UNRESOLVED = "unresolved"
    IN_USE = "in-use"
    INVALID_CONFIG = "invalid-config"
    CLAIM_SPEC = "claim-spec"
    WIDENS_CLASS = "widens-class"


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
    #: Given with ``adminAccess``: it does not hold the device against other claims.
    admin_access: bool = False


def claim_label(namespace: str, name: str, uid: str) -> str:
    """How messages and logs name a claim: ``ns/name (uid u)``, values quoted when odd."""
    ref = f"{namespace}/{name}"
    shown = ref if ref.isprintable() and len(ref) <= 2 * 63 + 1 else quote(ref)
    return f"claim {shown} (uid {quote(uid)})"


def check_reference(namespace: str, name: str, uid: str) -> None:
    """Refuse (:class:`ClaimRefused`) a claim reference that is not a Kubernetes one.

    ``namespace`` must be a DNS label and ``name`` a DNS subdomain, as the API server
    requires of a ResourceClaim; both become a URL path, where ``..``, ``/`` or ``*`` would
    reach other objects with the agent's credentials. ``uid`` keys the checkpoint: 1-128
    characters of ``A-Z a-z 0-9 - _ .``, alphanumeric at both ends.
    """
    label = claim_label(namespace, name, uid)
    if not uid:
        raise ClaimRefused(Refusal.NO_UID, f"{label}: the request carries no claim UID")
    if len(uid) > MAX_UID_LEN or _UID_RE.fullmatch(uid) is None:
        raise ClaimRefused(
            Refusal.INVALID_UID,
            f"{label}: uid {quote(uid)} is not a claim UID: want 1-{MAX_UID_LEN} characters "
            "of A-Z a-z 0-9 - _ . starting and ending alphanumeric",
        )
    if not is_dns_label(namespace):
        raise ClaimRefused(
            Refusal.INVALID_NAME,
            f"{label}: namespace {quote(namespace)} is not a Kubernetes namespace name: want "
            "a DNS label (1-63 characters of a-z 0-9 -, starting and ending alphanumeric)",
        )
    if not is_dns_subdomain(name):
        raise ClaimRefused(
            Refusal.INVALID_NAME,
            f"{label}: name {quote(name)} is not a ResourceClaim name: want a DNS subdomain "
            "(1-253 characters of a-z 0-9 - ., labels starting and ending alphanumeric)",
        )


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


def is_request_name(request: str) -> bool:
    """Whether ``request`` is what an allocation result may name: a request (a DNS label)
    or a subrequest of one (``main/sub``, two DNS labels), as the API validates them."""
    main, slash, sub = request.partition("/")
    return is_dns_label(main) and (not slash or is_dns_label(sub))


def _check_names(label: str, claim: ClaimView, results: Sequence[AllocatedDevice]) -> None:
    """Refuse names from the API server that paths and messages are built from: request
    names, and the pod's name for a claim made from a template (a folder inside the
    container)."""
    for result in results:
        if not is_request_name(result.request):
            raise ClaimRefused(
                Refusal.INVALID_REQUEST,
                f"{label}: its allocation names request {quote(result.request)}: want a DNS "
                "label, or two joined by '/' for a subrequest (1-63 characters of a-z 0-9 -, "
                "starting and ending alphanumeric)",
            )
    pod_claim = claim.pod_claim_name
    if pod_claim is not None and not is_dns_label(pod_claim):
        raise ClaimRefused(
            Refusal.INVALID_NAME,
            f"{label}: annotation resource.kubernetes.io/pod-claim-name {quote(pod_claim)} is "
            "not a pod's claim name: want a DNS label",
        )


def prepare_claim(
    ref: ClaimRef,
    claim: ClaimView,
    *,
    driver: str,
    pool_name: str,
    devices: Mapping[str, PoolDevice],
) -> list[PreparedDevice]:
    """The devices to answer for the claim the kubelet asked for as ``ref``.

    ``claim`` is what the API server answered for the kubelet's namespace/name, ``devices``
    one snapshot of the pool (name -> device). Each of this driver's allocation results
    becomes one device, in the allocation's order. Raises :class:`ClaimRefused` naming the
    claim, the device and the rule when the claim is not the one asked for (namespace, name
    and UID: the answer names files and paths), is not allocated, has more results than the
    API allows, has no device of this driver, names a request that is not a request name,
    or names a device this node cannot give.
    """
    uid = ref.uid
    label = claim_label(ref.namespace, ref.name, uid)
    if not uid:
        raise ClaimRefused(Refusal.NO_UID, f"{label}: the request carries no claim UID")
    if (claim.namespace, claim.name) != (ref.namespace, ref.name):
        raise ClaimRefused(
            Refusal.NAME_MISMATCH,
            f"{label}: the API server answered claim {quote(claim.namespace)}/"
            f"{quote(claim.name)}, not the one asked for",
        )
    if claim.uid != uid:
        raise ClaimRefused(
            Refusal.UID_MISMATCH,
            f"{label}: the API server's claim of that name has uid {quote(claim.uid)} "
            "(deleted and re-created?)",
        )
    if claim.results is None:
        raise ClaimRefused(Refusal.NOT_ALLOCATED, f"{label}: not allocated")
    if len(claim.results) > MAX_ALLOCATION_RESULTS:
        raise ClaimRefused(
            Refusal.TOO_MANY_RESULTS,
            f"{label}: its allocation has {len(claim.results)} results; the API allows at "
            f"most {MAX_ALLOCATION_RESULTS} per claim",
        )
    ours = [r for r in claim.results if r.driver == driver]
    if not ours:
        raise ClaimRefused(
            Refusal.NO_DEVICES,
            f"{label}: its allocation has no device of driver {quote(driver)}",
        )
    _check_names(label, claim, ours)
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
                admin_access=result.admin_access,
            )
        )
    return prepared
