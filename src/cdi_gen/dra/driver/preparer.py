"""The DRA driver's state: which claims are prepared, with which devices, kept in the checkpoint.

:class:`PoolPreparer` is the node's :class:`~cdi_gen.dra.plugin.claims.ClaimPreparer`: the
kubelet's gRPC side (:mod:`~cdi_gen.dra.plugin.service`) hands it claim references and answers
what it returns. It imports no grpc.

Preparing a claim: a claim already in the :class:`~cdi_gen.dra.driver.checkpoint.Checkpoint`
under its UID is answered from it (the kubelet may ask again, also after our restart, and
the claim may be gone from the API server by then); otherwise it is read through the
:class:`~cdi_gen.dra.plugin.claims.ClaimReader`, checked against a snapshot of the
:class:`~cdi_gen.dra.plugin.pool.DevicePool` (:func:`~cdi_gen.dra.driver.claimcheck.prepare_claim`),
refused (``in-use``) when a device it would hold exclusively is held so by another claim
prepared here (the API server's view may be stale; admin access and shared devices hold
nothing), its CDI names checked by the same resolver as Allocate's
(:func:`~cdi_gen.cdi.resolution.unresolved`), recorded, and answered with the devices'
CDI names: the spec entries the agent keeps on disk for every pool device. A claim with
configuration for this driver (:mod:`~cdi_gen.dra.driver.claimspecs`) gets its configured
devices from a spec of its own, and with device metadata every claim gets a spec of its own
for the metadata mounts; the checkpoint, the one store, records every claim with the specs
written for it; the specs are removed at unprepare (of a claim not prepared here, whatever of
ours sits at their names). A record of another boot is void
(:mod:`~cdi_gen.dra.driver.boot`): after a node reboot every claim is prepared anew, with
specs written after the boot.

A call reads its unprepared claims from the API server first, under no lock, as Kubernetes'
helper library does; :mod:`~cdi_gen.dra.driver.claimcalls` keeps two calls on one claim from
reading it twice or leaving its record behind an unprepare, and a claim's lock is held only
for its record or its unprepare. Every wait is bounded by the call's timeout; a claim still
held then gets an error the kubelet retries.

Two instances of the driver (a rolling update) share this state through its files: every
step that reads or changes it (the answer from the checkpoint, the record, the unprepare,
the load) holds the :class:`~cdi_gen.dra.driver.statelock.StateLock`, innermost of all the
locks, and reads the checkpoint again first when the other instance changed it. The claim's
read from the API server is outside every lock: a slow API server holds up the calls of the
claims it reads, never a lock. What it leaves open: an
unprepare sent to the other instance while this one reads the claim finds nothing to remove
(the kubelet sends a claim's calls to the newest instance, so this needs the new instance to
register during that read).

A slow API server must not take every server thread: at most ``max_reading_calls`` calls
wait for it at once (a call beyond that gets an error for the claims it would read), so the
claims answered from the checkpoint are answered at once whatever the API server does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from pathlib import Path

from cdi_gen.cdi.resolution import SpecResolver, unresolved
from cdi_gen.dra.driver.checkpoint import (
    Checkpoint,
    CheckpointError,
    ClaimSpec,
    PreparedClaim,
    checkpoint_path,
)
from cdi_gen.dra.driver.claimcalls import ClaimLocks, PendingPrepares
from cdi_gen.dra.driver.claimcheck import prepare_claim
from cdi_gen.dra.driver.claimspecs import ClaimSpecs, device_configs
from cdi_gen.dra.driver.claimstatus import ClaimStatus, device_entries
from cdi_gen.dra.driver.statelock import StateLock, lock_path
from cdi_gen.dra.plugin.claims import (
    ClaimReader,
    ClaimRef,
    ClaimRefused,
    PreparedDevice,
    PrepareResult,
    Refusal,
    claim_label,
)
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.errors import ClaimError, SpecWriteError
from cdi_gen.model import ClaimView

__all__ = ["STATE_LOCK_SECONDS", "PoolPreparer"]

log = logging.getLogger(__name__)

#: Longest a record, an unprepare or the load waits for the other instance's step (each
#: holds the state lock for a few file writes).
STATE_LOCK_SECONDS = 5.0


def _describe(devices: tuple[PreparedDevice, ...]) -> str:
    return ", ".join(f"{d.device}={','.join(d.cdi_device_ids)}" for d in devices) or "none"


class PoolPreparer:
    """The prepared claims of the DRA driver ``driver``, for the pool ``pool_name``.

    ``pool`` holds the node's DRA devices; ``claims`` reads ResourceClaims (on the calling
    thread); ``cdi_kinds`` are the CDI kinds (``vendor/class``) of the pool's devices, the
    only ones a recorded claim may name. The prepared claims live in
    ``<state_dir>/dra-<driver>.json``. With a ``resolver``, a claim is prepared only when
    every CDI name it gets resolves in the runtime's spec folders, as Allocate checks them.
    ``max_reading_calls`` bounds the calls waiting for the API server at once. With
    ``claim_specs``, a claim configured for this driver gets its own spec there; without, such
    a claim is refused. With ``status``, a prepared claim's devices are written into its
    ResourceClaim's status (:mod:`~cdi_gen.dra.driver.claimstatus`, never waited for) and
    cleared at unprepare.
    """

    def __init__(
        self,
        driver: str,
        pool: DevicePool,
        claims: ClaimReader,
        *,
        pool_name: str,
        cdi_kinds: Collection[str],
        state_dir: Path,
        max_reading_calls: int,
        resolver: SpecResolver | None = None,
        claim_specs: ClaimSpecs | None = None,
        status: ClaimStatus | None = None,
    ) -> None:
        self.driver = driver
        self.pool = pool
        self.claims = claims
        self.pool_name = pool_name
        self.resolver = resolver
        self.max_reading_calls = max_reading_calls
        self.checkpoint = Checkpoint(
            checkpoint_path(state_dir, driver),
            driver,
            pool=pool_name,
            kinds=cdi_kinds,
            adopt_from=None if claim_specs is None else claim_specs.recorded,
        )
        self.locks = ClaimLocks()
        self.pending = PendingPrepares()
        #: Shared with another instance of the driver on the node (see the module docstring).
        self.state = StateLock(lock_path(state_dir, driver))
        self.claim_specs = claim_specs
        self.status = status
        #: Spans "is a device held by another claim?" and the record that holds it: two
        #: claims of one device, prepared at once, must not both pass.
        self._holding = threading.Lock()
        #: Calls waiting for the API server (see max_reading_calls); never waited on.
        self._reading = threading.BoundedSemaphore(max_reading_calls)

    def load(self) -> None:
        """Read the checkpoint (adopting what an older cdi-gen recorded), then bring the
        claims' specs in line with it: a claim recorded in another boot is void, one whose
        spec or device metadata is gone or unreadable (a power loss may empty a file written
        without fsync) forgotten, to be read and prepared anew; a claim spec or metadata file
        no claim names is removed. Raises
        :class:`~cdi_gen.dra.driver.checkpoint.CheckpointError` when the checkpoint cannot be read
        as ours (it is left as it is) or changed, or the state lock cannot be taken."""
        with self.state.held(STATE_LOCK_SECONDS):
            # What is forgotten or removed below, another instance must read again.
            self.state.changed()
            self._load()

    def _load(self) -> None:
        self.checkpoint.load()
        specs = self.claim_specs
        if specs is None:
            return
        for uid, claim in list(self.checkpoint.claims.items()):
            if claim.specs and not specs.intact(uid, claim):
                log.warning(
                    "%s: its own CDI spec or device metadata is gone or unreadable; "
                    "forgotten, prepared anew when asked",
                    claim_label(claim.namespace, claim.name, uid),
                )
                self.checkpoint.remove(uid)
        specs.remove_orphans(self.checkpoint.claims)

    @property
    def count(self) -> int:
        return len(self.checkpoint.claims)

    @contextmanager
    def _shared(self, timeout: float) -> Iterator[None]:
        """The state lock held for the block, the state read again first when another
        instance changed it. Raises :class:`~cdi_gen.dra.driver.checkpoint.CheckpointError`."""
        with self.state.held(timeout) as stale:
            if stale:
                self.checkpoint.load()
            yield

    # -- prepare ----------------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef], timeout: float) -> list[PrepareResult]:
        """Each claim's devices or why not, in order; see the module docstring."""
        results: list[PrepareResult | None]
        try:
            if self.state.fresh():  # nothing changed by the other instance: no lock needed
                results = [self._recorded(ref) for ref in claims]
            else:
                with self._shared(timeout):
                    results = [self._recorded(ref) for ref in claims]
        except CheckpointError as exc:
            # Answered below, under the claims' locks, where the state is read again.
            log.warning(
                "prepare of %d claims: the state of the other instance not read: %s",
                len(claims),
                exc,
            )
            results = [None] * len(claims)
        # Everything answerable without the API server first (above, under no claim's lock:
        # a record is only ever added whole), so that it never waits behind a read.
        unread = [i for i, result in enumerate(results) if result is None]
        if unread:
            found = self._prepare_unread([claims[i] for i in unread], timeout)
            for i, result in zip(unread, found, strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    def _recorded(self, ref: ClaimRef) -> PrepareResult | None:
        known = self.checkpoint.get(ref.uid)
        if known is None:
            return None
        label = claim_label(ref.namespace, ref.name, ref.uid)
        log.info("prepared %s again from the checkpoint: %s", label, _describe(known.devices))
        return PrepareResult(known.devices)

    def _prepare_unread(self, refs: list[ClaimRef], timeout: float) -> list[PrepareResult]:
        if timeout <= 0:
            return [self._unread(ref, "not read, the caller's deadline has passed") for ref in refs]
        if not self._reading.acquire(blocking=False):
            log.warning(
                "%d claims not read: %d NodePrepareResources calls already wait for the API server",
                len(refs),
                self.max_reading_calls,
            )
            return [
                self._unread(
                    ref,
                    f"not read, {self.max_reading_calls} calls of driver {self.driver} already "
                    "wait for the API server; try again",
                )
                for ref in refs
            ]
        try:
            return self._prepare_pending(refs, timeout)
        finally:
            self._reading.release()

    def _prepare_pending(
        self, refs: list[ClaimRef], timeout: float, *, again: bool = True
    ) -> list[PrepareResult]:
        """Prepare the claims no other call prepares, then wait for the others' answers. A
        claim whose other call could not read it is read here (``again``: once), within what
        is left of ``timeout``: that call's deadline may have been shorter than ours."""
        started = time.monotonic()
        owned, others = self.pending.take(r.uid for r in refs)
        if others:
            self._log_wait("prepare", [r for r in refs if r.uid in others])
        answers: dict[str, PrepareResult] = {}
        try:
            mine = {r.uid: r for r in refs if r.uid in owned}  # a claim named twice: read once
            answers = self._prepare_owned(list(mine.values()), timeout)
        finally:
            for uid in owned:
                answer = answers.get(uid)
                if answer is None:  # only when preparing raised: logged by the server
                    answer = PrepareResult(
                        error=f"internal error of driver {self.driver}", reason="internal"
                    )
                self.pending.finish(uid, answer)
        unread: dict[str, ClaimRef] = {}
        for ref in refs:
            if ref.uid in others:
                left = timeout - (time.monotonic() - started)
                try:
                    answers[ref.uid] = others[ref.uid].result(max(left, 0))
                except FutureTimeout:
                    answers[ref.uid] = self._unread(
                        ref, "not read, another call prepares or unprepares it; try again"
                    )
                    continue
                if again and answers[ref.uid].reason == "claim-read":
                    unread[ref.uid] = ref
        left = timeout - (time.monotonic() - started)
        if unread and left > 0:
            found = self._prepare_pending(list(unread.values()), left, again=False)
            answers.update(zip(unread, found, strict=True))
        return [answers[r.uid] for r in refs]

    def _prepare_owned(self, refs: list[ClaimRef], timeout: float) -> dict[str, PrepareResult]:
        """Read the claims, then record them under their locks (an unprepare holds one for
        a few file writes)."""
        started = time.monotonic()
        reads = self._read(refs, timeout)
        with self.locks.holding(
            [r.uid for r in refs],
            timeout - (time.monotonic() - started),
            lambda: self._log_wait("prepare", refs),
        ) as held:
            if not held:
                why = "not prepared, another call unprepares it; try again"
                return {r.uid: self._unread(r, why) for r in refs}
            answers: dict[str, PrepareResult] = {}
            for ref, read in zip(refs, reads, strict=True):
                # Asked again under the lock: a call that ended after this one first looked
                # may have recorded it.
                recorded = self._recorded(ref)
                answers[ref.uid] = self._prepare_read(ref, read) if recorded is None else recorded
            return answers

    def _read(self, refs: list[ClaimRef], timeout: float) -> list[ClaimView | Exception]:
        """Each claim as the API server has it, or why not, within ``timeout``."""
        if not refs:
            return []
        pairs = [(r.namespace, r.name) for r in refs]
        if timeout <= 0:
            return [
                ClaimError(f"ResourceClaim {ns}/{name}: not read, the caller's deadline has passed")
                for ns, name in pairs
            ]
        try:
            reads: list[ClaimView | Exception] = list(self.claims.read_claims(pairs, timeout))
            if len(reads) != len(refs):
                raise RuntimeError(f"the claim reader answered {len(reads)} of {len(refs)} claims")
        except Exception as exc:
            # Answered per claim as an internal error, with its traceback logged.
            reads = [exc] * len(refs)
        return reads

    def _prepare_read(self, ref: ClaimRef, claim: ClaimView | Exception) -> PrepareResult:
        """Prepare a claim from what reading it gave: check it, record it; never raises.
        Refusals and read errors are logged by the caller, which clips them as it answers
        them; a checkpoint error or an internal one is logged here."""
        label = claim_label(ref.namespace, ref.name, ref.uid)
        try:
            if isinstance(claim, Exception):
                raise claim
            devices = self._prepare_checked(ref, label, claim)
        except ClaimRefused as refused:
            return PrepareResult(error=str(refused), reason=str(refused.reason))
        except ClaimError as exc:
            return PrepareResult(error=str(exc), reason="claim-read")
        except CheckpointError as exc:
            log.error("prepare of %s failed: %s", label, exc)
            return PrepareResult(error=f"{label}: {exc}", reason="checkpoint")
        except Exception as exc:
            log.exception("prepare of %s failed", label)
            return PrepareResult(
                error=f"{label}: internal error of driver {self.driver}: {exc}", reason="internal"
            )
        log.info("prepared %s: %s", label, _describe(devices))
        self._write_status(ref, devices)
        return PrepareResult(devices)

    def _write_status(self, ref: ClaimRef, devices: tuple[PreparedDevice, ...]) -> None:
        """Hand the claim's status to the loop (the answer does not wait for it)."""
        if self.status is None:
            return
        pool = self.pool.devices
        specs = self.claim_specs
        nodes = {
            d.device: specs.device_nodes(pool[d.device].cdi_name)
            for d in devices
            if specs is not None and d.device in pool
        }
        entries = device_entries(self.driver, devices, pool, nodes)
        self.status.prepared(ref.namespace, ref.name, ref.uid, entries)

    def _prepare_checked(
        self, ref: ClaimRef, label: str, claim: ClaimView
    ) -> tuple[PreparedDevice, ...]:
        pool = self.pool.devices
        devices = tuple(
            prepare_claim(ref, claim, driver=self.driver, pool_name=self.pool_name, devices=pool)
        )
        configs = device_configs(label, claim, self.driver, [d.request_names[0] for d in devices])
        with self._holding, self._shared(STATE_LOCK_SECONDS):
            known = self.checkpoint.get(ref.uid)
            if known is not None:
                # Prepared meanwhile by the other instance: the same answer as its.
                return known.devices
            self._check_exclusive(ref.uid, label, devices)
            self.state.changed()
            specs: tuple[ClaimSpec, ...] = ()
            own = self.claim_specs is not None and self.claim_specs.serves_metadata
            if any(configs) or own:
                if self.claim_specs is None:
                    raise ClaimRefused(
                        Refusal.CLAIM_SPEC,
                        f"{label}: has configuration for driver {self.driver}, which writes no "
                        "per-claim specs here",
                    )
                devices, specs = self.claim_specs.write(
                    ref.uid, label, claim=claim, devices=devices, configs=configs, pool=pool
                )
            try:
                self._check_resolved(label, devices)
                self.checkpoint.add(ref.uid, PreparedClaim(ref.namespace, ref.name, devices, specs))
            except BaseException:
                if specs and self.claim_specs is not None:
                    try:
                        self.claim_specs.remove(
                            label, ref.uid, PreparedClaim(ref.namespace, ref.name, devices, specs)
                        )
                    except SpecWriteError as exc:  # removed at the next start
                        log.warning("%s: its spec stays until the agent restarts: %s", label, exc)
                raise
        return devices

    def _check_exclusive(self, uid: str, label: str, devices: tuple[PreparedDevice, ...]) -> None:
        """Refuse a device another claim prepared here holds: the scheduler allocated it from
        a view of the API server that may be stale."""
        for device in devices:
            found = self.checkpoint.holder(device, uid)
            if found is not None:
                other, holder = found
                raise ClaimRefused(
                    Refusal.IN_USE,
                    f"{label}: device {device.device} (pool {device.pool}) of request "
                    f"{', '.join(device.request_names)} is in use by "
                    f"{claim_label(holder.namespace, holder.name, other)}, prepared on this node",
                )

    @staticmethod
    def _unread(ref: ClaimRef, why: str) -> PrepareResult:
        return PrepareResult(
            error=f"ResourceClaim {ref.namespace}/{ref.name}: {why}", reason="claim-read"
        )

    def _check_resolved(self, label: str, devices: tuple[PreparedDevice, ...]) -> None:
        """Refuse a claim whose CDI names the runtime could not resolve: the kubelet would
        hand them on, and the pod fail later, far from the cause."""
        if self.resolver is None:
            return
        names = [n for device in devices for n in device.cdi_device_ids]
        try:
            problems = unresolved(self.resolver, names)
        except TimeoutError as exc:
            raise ClaimRefused(
                Refusal.UNRESOLVED, f"{label}: its CDI devices cannot be checked: {exc}"
            ) from None
        if problems:
            raise ClaimRefused(
                Refusal.UNRESOLVED, f"{label}: CDI devices do not resolve: " + "; ".join(problems)
            )

    # -- unprepare --------------------------------------------------------------------------

    def unprepare(self, claims: Sequence[ClaimRef], timeout: float) -> list[str]:
        """Forget each claim; per claim ``""`` or the error. An unknown claim is already
        unprepared; one being prepared is forgotten once its prepare has recorded it."""
        started = time.monotonic()
        return [self._unprepare_one(ref, timeout - (time.monotonic() - started)) for ref in claims]

    def _unprepare_one(self, ref: ClaimRef, timeout: float) -> str:
        label = claim_label(ref.namespace, ref.name, ref.uid)
        started = time.monotonic()
        under_way = self.pending.under_way(ref.uid)
        if under_way is not None:
            # Removed once its prepare has recorded it: never a record landing after this.
            self._log_wait("unprepare", [ref])
            try:
                under_way.result(max(timeout, 0))
            except FutureTimeout:
                return f"{label}: another call still prepares it; try again"
        try:
            with self.locks.holding(
                [ref.uid],
                timeout - (time.monotonic() - started),
                lambda: self._log_wait("unprepare", [ref]),
            ) as held:
                if not held:
                    return f"{label}: another call still prepares it; try again"
                with self._shared(timeout):
                    known = self.checkpoint.get(ref.uid)
                    self.state.changed()  # unknown too: what it left goes (below)
                    if known is not None and known.specs and self.claim_specs is not None:
                        # The specs first: a record left by a crash after this names a spec
                        # that is gone, which the next start forgets; a spec left would be
                        # injected.
                        self.claim_specs.remove(label, ref.uid, known)
                    if self.checkpoint.remove(ref.uid):
                        log.info("unprepared %s", label)
                        if self.status is not None:
                            self.status.unprepared(ref.namespace, ref.name, ref.uid)
                    else:
                        if self.claim_specs is not None:  # what a prepare could not undo
                            self.claim_specs.remove_left(label, ref.uid, self.checkpoint.kinds)
                        log.info("unprepared %s: it was not prepared here (nothing to do)", label)
                return ""
        except (CheckpointError, SpecWriteError) as exc:
            log.error("unprepare of %s failed: %s", label, exc)
            return f"{label}: {exc}"
        except Exception as exc:
            log.exception("unprepare of %s failed", label)
            return f"{label}: {exc}"

    @staticmethod
    def _log_wait(what: str, refs: Sequence[ClaimRef]) -> None:
        labels = ", ".join(claim_label(r.namespace, r.name, r.uid) for r in refs)
        log.info("%s of %s waits for the call holding it", what, labels)
