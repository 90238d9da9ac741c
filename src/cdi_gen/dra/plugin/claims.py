"""What the DRA kubelet plugin (the generic part) and the driver part behind it exchange about
claims: the kubelet's claim reference and its checks, the :class:`ClaimPreparer` (the driver
part's interface) and :class:`ClaimReader` protocols, what a prepared claim answers, and why a
claim is refused.

The kubelet sends only a claim's namespace, name and UID. :func:`check_reference` refuses
them unless they are Kubernetes names (and a UID of sane shape) before anything is read,
since they become a path on the API server; :func:`check_read` refuses a claim read for a
reference that is not the one named. Both run once, at the generic part's boundary
(:mod:`~cdi_gen.dra.plugin.service` and :mod:`~cdi_gen.dra.plugin.calls`): the driver part
gets only claims that passed them.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cdi_gen.errors import ClaimError, quote
from cdi_gen.model import ClaimView
from cdi_gen.names import is_dns_label, is_dns_subdomain

__all__ = [
    "MAX_UID_LEN",
    "NOT_REFUSALS",
    "ClaimPreparer",
    "ClaimReader",
    "ClaimRef",
    "ClaimRefused",
    "HeldClaim",
    "PrepareResult",
    "PreparedDevice",
    "Refusal",
    "Unprepared",
    "check_read",
    "check_reference",
    "claim_label",
]

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
    ``"internal"``). ``device_nodes``, for a claim prepared by this call, names the host
    device nodes of each pool device (what its status shows), ``network_data`` the
    ``networkData`` of each that moves a network interface; neither is part of the answer."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
    reason: str = ""
    device_nodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False)
    network_data: Mapping[str, Mapping[str, str]] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class Unprepared:
    """What unpreparing one claim gave: ``error`` (``""`` when done) and whether a claim
    prepared here was forgotten (``forgotten``: its status is cleared)."""

    error: str = ""
    forgotten: bool = False


class ClaimPreparer(Protocol):
    """The driver part behind the generic one (:class:`~cdi_gen.dra.plugin.calls.ClaimCalls`):
    which claims are prepared, and with which devices. It knows nothing of gRPC, threads or
    the API server: the generic part reads the claims, checks that each is the one the
    kubelet named, lets one call at a time work on a claim, and answers.

    Called on the gRPC server's threads, a claim by one call at a time. ``timeout`` is
    what is left of the call's deadline: every wait (the state shared with another
    instance) is bounded by it. No method raises for one claim: every claim gets its own
    result, in the order given.
    """

    def load(self) -> None:
        """Read what survives restarts, before the kubelet is served. Raises
        :class:`~cdi_gen.errors.CdiGenError` naming the file and why when it cannot."""
        ...

    @property
    def count(self) -> int:
        """How many claims are prepared now."""
        ...

    def known(self, refs: Sequence[ClaimRef], timeout: float) -> list[PrepareResult | None]:
        """The answer for each claim prepared before (the same again: the kubelet may ask
        twice, also after a restart), or None for a claim to be read and prepared."""
        ...

    def prepare(self, claims: Sequence[ClaimView], timeout: float) -> list[PrepareResult]:
        """Prepare each claim as the API server has it (each the one the kubelet named);
        its devices or why not."""
        ...

    def unprepare(self, refs: Sequence[ClaimRef], timeout: float) -> list[Unprepared]:
        """Forget each claim (one never prepared is already unprepared)."""
        ...


class Refusal(enum.StrEnum):
    """Why the generic part refuses a claim before the driver part sees it: its reference
    (:func:`check_reference`) or the claim read for it (:func:`check_read`). The driver
    part's own reasons are its own (:class:`~cdi_gen.dra.driver.refusal.DriverRefusal`)."""

    INVALID_NAME = "invalid-name"
    INVALID_UID = "invalid-uid"
    NO_UID = "no-uid"
    UID_MISMATCH = "uid-mismatch"
    NAME_MISMATCH = "name-mismatch"


#: The ``reason`` of a claim not prepared for a cause other than a rule of the generic or
#: the driver part: not read (or not in time), its record not kept, a bug. Any other reason
#: is a refusal (a :class:`Refusal` or the driver part's).
NOT_REFUSALS = frozenset({"claim-read", "checkpoint", "internal"})


class ClaimRefused(ClaimError):  # noqa: N818 - a refusal, like files.FileRefused
    """The claim cannot be prepared here; ``reason`` says which rule (a :class:`Refusal` or
    the driver part's own, a string either way)."""

    def __init__(self, reason: str, message: str) -> None:
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


@dataclass(frozen=True, slots=True)
class HeldClaim:
    """A claim the driver part prepared that holds a device: its reference, every device it
    got, and the host device nodes and network data of each (what its status shows). Whom
    the generic part tells that the device left or came back
    (:mod:`~cdi_gen.dra.plugin.notices`)."""

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    device_nodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    network_data: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


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


def check_read(ref: ClaimRef, claim: ClaimView) -> None:
    """Refuse (:class:`ClaimRefused`) a claim the API server answered for ``ref`` that is not
    the one the kubelet named: another namespace or name (a broken or hostile answer), or
    another UID (the claim was deleted and made again since the kubelet's view). The answer
    names files and paths after the claim, so it must be the one asked for."""
    label = claim_label(ref.namespace, ref.name, ref.uid)
    if (claim.namespace, claim.name) != (ref.namespace, ref.name):
        raise ClaimRefused(
            Refusal.NAME_MISMATCH,
            f"{label}: the API server answered claim {quote(claim.namespace)}/"
            f"{quote(claim.name)}, not the one asked for",
        )
    if claim.uid != ref.uid:
        raise ClaimRefused(
            Refusal.UID_MISMATCH,
            f"{label}: the API server's claim of that name has uid {quote(claim.uid)} "
            "(deleted and re-created?)",
        )
