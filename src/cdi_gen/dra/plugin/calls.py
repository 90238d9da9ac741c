"""The generic part of NodePrepareResources and NodeUnprepareResources, in the helper library's
shape: read, check, hold, call the driver part, write the status.

:class:`ClaimCalls` is what the gRPC service (:mod:`~cdi_gen.dra.plugin.service`) calls with
the claim references it checked. A prepare first asks the driver part
(:class:`~cdi_gen.dra.plugin.claims.ClaimPreparer`) which claims it prepared before: those
are answered at once, whatever the API server does. The others are held for this call
(:class:`~cdi_gen.dra.plugin.inflight.InFlight`, waiting for a call that holds one), read from
the API server under no lock (:class:`~cdi_gen.dra.plugin.claims.ClaimReader`), each checked
to be the claim named (:func:`~cdi_gen.dra.plugin.claims.check_read`), and handed to the
driver part; a claim prepared by the call gets its devices in its ResourceClaim's status
(:mod:`~cdi_gen.dra.plugin.claimstatus`, never waited for). An unprepare holds its claims
the same way, asks the driver part to forget them, and clears the status of those it did.

Every wait is bounded by what is left of the call's timeout: a claim still held by another
call then, or not read in time, gets an error the kubelet retries. Nothing here raises for
one claim; a driver part that raises costs the call's claims an internal error each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from cdi_gen.dra.plugin.claims import (
    ClaimPreparer,
    ClaimReader,
    ClaimRef,
    ClaimRefused,
    PrepareResult,
    check_read,
    claim_label,
)
from cdi_gen.dra.plugin.claimstatus import ClaimStatus, device_entries
from cdi_gen.dra.plugin.inflight import InFlight
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.errors import ClaimError
from cdi_gen.model import ClaimView

__all__ = ["ClaimCalls"]

log = logging.getLogger(__name__)


def _unread(ref: ClaimRef, why: str) -> PrepareResult:
    return PrepareResult(
        error=f"ResourceClaim {ref.namespace}/{ref.name}: {why}", reason="claim-read"
    )


class ClaimCalls:
    """The prepares and unprepares of DRA driver ``driver``: its driver part ``preparer``,
    claims read through ``claims``; at most ``max_reading_calls`` calls wait for the API
    server at once. With ``status``, a claim prepared gets its devices (their pool entries
    in ``pool``) in its status, cleared when it is unprepared."""

    def __init__(
        self,
        driver: str,
        preparer: ClaimPreparer,
        claims: ClaimReader,
        *,
        pool: DevicePool,
        max_reading_calls: int,
        status: ClaimStatus | None = None,
    ) -> None:
        self.driver = driver
        self.preparer = preparer
        self.claims = claims
        self.pool = pool
        self.status = status
        self.in_flight = InFlight(max_reading_calls)

    def load(self) -> None:
        self.preparer.load()

    @property
    def count(self) -> int:
        return self.preparer.count

    # -- prepare ----------------------------------------------------------------------------

    def prepare(self, refs: Sequence[ClaimRef], timeout: float) -> list[PrepareResult]:
        """Each claim's devices or why not, in order; see the module docstring."""
        deadline = time.monotonic() + timeout
        answers = self._known(refs, timeout)
        unread = {r.uid: r for r in refs if r.uid not in answers}  # a claim named twice: once
        if unread:
            answers.update(self._prepare_unread(list(unread.values()), deadline))
        return [answers[r.uid] for r in refs]

    def _known(self, refs: Sequence[ClaimRef], timeout: float) -> dict[str, PrepareResult]:
        """The answers of the claims the driver part prepared before, by UID."""
        found = self.preparer.known(refs, timeout)
        if len(found) != len(refs):
            raise RuntimeError(f"the driver part knew {len(found)} of {len(refs)} claims")
        answers = {}
        for ref, answer in zip(refs, found, strict=True):
            if answer is not None:
                answers[ref.uid] = answer
        return answers

    def _prepare_unread(self, refs: list[ClaimRef], deadline: float) -> dict[str, PrepareResult]:
        if deadline <= time.monotonic():
            return {r.uid: _unread(r, "not read, the caller's deadline has passed") for r in refs}
        with self.in_flight.reading() as allowed:
            if not allowed:
                limit = self.in_flight.max_reading
                log.warning(
                    "%d claims not read: %d NodePrepareResources calls already wait for the "
                    "API server",
                    len(refs),
                    limit,
                )
                why = (
                    f"not read, {limit} calls of driver {self.driver} already wait for the API "
                    "server; try again"
                )
                return {r.uid: _unread(r, why) for r in refs}
            return self._prepare_held(refs, deadline)

    def _prepare_held(self, refs: list[ClaimRef], deadline: float) -> dict[str, PrepareResult]:
        """Prepare the claims no other call holds at once, then those held, once free (or
        take over their answers), until the deadline."""
        by_uid = {r.uid: r for r in refs}
        answers: dict[str, PrepareResult] = {}
        mine, _, pending = self.in_flight.take(by_uid, prepare=True, deadline=0)
        answers |= self._prepare_releasing([by_uid[u] for u in mine], deadline)
        if pending:
            mine, answered, late = self.in_flight.take(
                pending,
                prepare=True,
                deadline=deadline,
                waiting=lambda uids: self._log_wait("prepare", [by_uid[u] for u in uids]),
            )
            answers |= answered
            answers |= self._prepare_releasing([by_uid[u] for u in mine], deadline)
            for uid in late:
                answers[uid] = _unread(
                    by_uid[uid], "not read, another call prepares or unprepares it; try again"
                )
        return answers

    def _prepare_releasing(self, refs: list[ClaimRef], deadline: float) -> dict[str, PrepareResult]:
        """Prepare the claims this call holds, then release each with its answer."""
        done: dict[str, PrepareResult] = {}
        try:
            done = self._prepare_mine(refs, deadline)
        finally:
            for ref in refs:
                answer = done.get(ref.uid)
                if answer is None:  # only when the work raised: logged by the service
                    answer = PrepareResult(
                        error=f"internal error of driver {self.driver}", reason="internal"
                    )
                self.in_flight.release(ref.uid, answer)
        return done

    def _prepare_mine(self, refs: list[ClaimRef], deadline: float) -> dict[str, PrepareResult]:
        """Prepare the claims this call holds: asked again (a call that ended meanwhile may
        have prepared one), then read, checked and handed to the driver part."""
        if not refs:
            return {}
        answers = self._known(refs, deadline - time.monotonic())
        todo = [r for r in refs if r.uid not in answers]
        read: list[ClaimView] = []
        for ref, claim in zip(todo, self._read(todo, deadline), strict=True):
            checked = self._checked(ref, claim)
            if isinstance(checked, PrepareResult):
                answers[ref.uid] = checked
            else:
                read.append(checked)
        if read:
            results = self.preparer.prepare(read, deadline - time.monotonic())
            if len(results) != len(read):
                raise RuntimeError(f"the driver part prepared {len(results)} of {len(read)}")
            for claim, result in zip(read, results, strict=True):
                answers[claim.uid] = result
                if not result.error:
                    self._write_status(claim, result)
        return answers

    def _checked(self, ref: ClaimRef, claim: ClaimView | Exception) -> ClaimView | PrepareResult:
        """The claim read for ``ref`` if it is that claim, else the answer saying why not."""
        try:
            if isinstance(claim, Exception):
                raise claim
            check_read(ref, claim)
            return claim
        except ClaimRefused as refused:
            return PrepareResult(error=str(refused), reason=str(refused.reason))
        except ClaimError as exc:
            return PrepareResult(error=str(exc), reason="claim-read")
        except Exception as exc:
            label = self._label(ref)
            log.error("reading %s failed", label, exc_info=exc)
            return PrepareResult(
                error=f"{label}: internal error of driver {self.driver}: {exc}", reason="internal"
            )

    def _read(self, refs: list[ClaimRef], deadline: float) -> list[ClaimView | Exception]:
        """Each claim as the API server has it, or why not, by the deadline."""
        if not refs:
            return []
        left = deadline - time.monotonic()
        pairs = [(r.namespace, r.name) for r in refs]
        if left <= 0:
            return [
                ClaimError(f"ResourceClaim {ns}/{name}: not read, the caller's deadline has passed")
                for ns, name in pairs
            ]
        try:
            reads: list[ClaimView | Exception] = list(self.claims.read_claims(pairs, left))
            if len(reads) != len(refs):
                raise RuntimeError(f"the claim reader answered {len(reads)} of {len(refs)} claims")
        except Exception as exc:
            # Answered per claim as an internal error, with its traceback logged.
            reads = [exc] * len(refs)
        return reads

    def _write_status(self, claim: ClaimView, result: PrepareResult) -> None:
        """Hand the claim's status to the loop (the answer does not wait for it)."""
        if self.status is None:
            return
        entries = device_entries(
            self.driver, result.devices, self.pool.devices, result.device_nodes, result.network_data
        )
        self.status.prepared(claim.namespace, claim.name, claim.uid, entries)

    # -- unprepare --------------------------------------------------------------------------

    def unprepare(self, refs: Sequence[ClaimRef], timeout: float) -> list[str]:
        """Forget each claim; per claim ``""`` or the error. An unknown claim is already
        unprepared; one being prepared is forgotten once its prepare has ended."""
        deadline = time.monotonic() + timeout
        by_uid = {r.uid: r for r in refs}
        mine, _, late = self.in_flight.take(
            by_uid,
            prepare=False,
            deadline=deadline,
            waiting=lambda uids: self._log_wait("unprepare", [by_uid[u] for u in uids]),
        )
        errors = {
            uid: f"{self._label(by_uid[uid])}: another call still prepares it; try again"
            for uid in late
        }
        try:
            held = [by_uid[u] for u in mine]
            if held:
                done = self.preparer.unprepare(held, deadline - time.monotonic())
                if len(done) != len(held):
                    raise RuntimeError(f"the driver part unprepared {len(done)} of {len(held)}")
                for ref, outcome in zip(held, done, strict=True):
                    errors[ref.uid] = outcome.error
                    if outcome.forgotten and self.status is not None:
                        self.status.unprepared(ref.namespace, ref.name, ref.uid)
        finally:
            for uid in mine:
                self.in_flight.release(uid)
        return [errors[r.uid] for r in refs]

    @staticmethod
    def _label(ref: ClaimRef) -> str:
        return claim_label(ref.namespace, ref.name, ref.uid)

    def _log_wait(self, what: str, refs: Sequence[ClaimRef]) -> None:
        labels = ", ".join(map(self._label, refs))
        log.info("%s of %s waits for the call holding it", what, labels)
