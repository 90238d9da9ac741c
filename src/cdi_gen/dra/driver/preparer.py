"""The DRA driver part: which claims are prepared here, with which devices, kept in the checkpoint.

:class:`PoolPreparer` is the node's :class:`~cdi_gen.dra.plugin.claims.ClaimPreparer`, the
small interface the generic part (:class:`~cdi_gen.dra.plugin.calls.ClaimCalls`) calls with
claims it has read and checked, a claim by one call at a time. It knows nothing of gRPC,
threads or the API server.

:meth:`PoolPreparer.known` answers a claim already in the
:class:`~cdi_gen.dra.driver.checkpoint.Checkpoint` under its UID (the kubelet may ask again,
also after our restart, and the claim may be gone from the API server by then).
:meth:`PoolPreparer.prepare` checks a claim against a snapshot of the
:class:`~cdi_gen.dra.plugin.pool.DevicePool` (:func:`~cdi_gen.dra.driver.claimcheck.prepare_claim`),
refuses it (``in-use``) when a device it would hold exclusively (or the whole or a part of
its composite group) is held so by another claim
prepared here (the API server's view may be stale; admin access and shared devices hold
nothing), writes its own specs (:mod:`~cdi_gen.dra.driver.claimfiles`: a claim with
configuration for this driver gets its configured devices from a spec of its own, and with
device metadata every claim gets a spec of its own for the metadata mounts), checks its CDI
names with the same resolver as Allocate's (:func:`~cdi_gen.cdi.resolution.unresolved`),
records it in the checkpoint, the one store (every claim with the specs written for it), and
answers the devices' CDI names. :func:`holders` names the claims holding a
device (whom its leaving and return are told, :mod:`~cdi_gen.dra.plugin.notices`).
:meth:`PoolPreparer.unprepare` removes the claim's specs,
then its record (of a claim not prepared here, whatever of ours sits at its specs' names). A
record of another boot is void (:mod:`~cdi_gen.dra.driver.boot`): after a node reboot every
claim is prepared anew, with specs written after the boot.

Two instances of the driver (a rolling update) share this state through its files: every
step that reads or changes it holds the :class:`~cdi_gen.dra.driver.statelock.StateLock`
(the one lock here, also between this process's threads), bounded by what is left of the
call's timeout, and reads the state again first when the other instance changed it. What it
leaves open: an unprepare sent to the other instance while this one reads the claim finds
nothing to remove (the kubelet sends a claim's calls to the newest instance, so this needs
the new instance to register during that read).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from cdi_gen.cdi.resolution import SpecResolver, unresolved
from cdi_gen.dra.driver.checkpoint import (
    Checkpoint,
    CheckpointError,
    PreparedClaim,
    SpecName,
    checkpoint_path,
)
from cdi_gen.dra.driver.claimcheck import overlapping, prepare_claim
from cdi_gen.dra.driver.claimfiles import ClaimFiles, device_configs
from cdi_gen.dra.driver.refusal import DriverRefusal
from cdi_gen.dra.driver.statelock import StateLock, lock_path
from cdi_gen.dra.plugin.claims import (
    ClaimRef,
    ClaimRefused,
    HeldClaim,
    PreparedDevice,
    PrepareResult,
    Unprepared,
    claim_label,
)
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.errors import SpecWriteError
from cdi_gen.model import ClaimView, PoolDevice

__all__ = ["STATE_LOCK_SECONDS", "PoolPreparer", "holders", "shown"]

log = logging.getLogger(__name__)

#: Longest the load at start waits for the other instance's step (each holds the state lock
#: for a few file writes); a call waits at most what is left of its own timeout.
STATE_LOCK_SECONDS = 5.0


def _describe(devices: tuple[PreparedDevice, ...]) -> str:
    return ", ".join(f"{d.device}={','.join(d.cdi_device_ids)}" for d in devices) or "none"


_Pool = Mapping[str, PoolDevice]


def _holder(
    checkpoint: Checkpoint, uid: str, device: PreparedDevice, pool: _Pool
) -> tuple[str, PreparedClaim, str] | None:
    """Another prepared claim that holds ``device``, or a device sharing its nodes, against
    ``uid``: its UID, record and the device it holds."""
    for name in (device.device, *overlapping(pool, device.device)):
        held = device if name == device.device else replace(device, device=name)
        found = checkpoint.holder(held, uid)
        if found is not None:
            return (*found, name)
    return None


class PoolPreparer:
    """The prepared claims of the DRA driver ``driver``, for the pool ``pool_name``.

    ``pool`` holds the node's DRA devices; ``cdi_kinds`` are the CDI kinds
    (``vendor/class``) of the pool's devices, the only ones a recorded claim may name. The
    prepared claims live in ``<state_dir>/dra-<driver>.json``. With a ``resolver``, a claim
    is prepared only when every CDI name it gets resolves in the runtime's spec folders, as
    Allocate checks them. With ``claim_files``, a claim configured for this driver gets its
    own spec there; without, such a claim is refused.
    """

    def __init__(
        self,
        driver: str,
        pool: DevicePool,
        *,
        pool_name: str,
        cdi_kinds: Collection[str],
        state_dir: Path,
        resolver: SpecResolver | None = None,
        claim_files: ClaimFiles | None = None,
    ) -> None:
        self.driver = driver
        self.pool = pool
        self.pool_name = pool_name
        self.resolver = resolver
        self.checkpoint = Checkpoint(
            checkpoint_path(state_dir, driver),
            driver,
            pool=pool_name,
            kinds=cdi_kinds,
            adopt_from=None if claim_files is None else claim_files.sweep.recorded,
        )
        #: Shared with another instance of the driver on the node (see the module docstring).
        self.state = StateLock(lock_path(state_dir, driver))
        self.claim_files = claim_files
        #: Called (on the calling thread) when an unprepare forgot a claim.
        self.on_forgotten: Callable[[], object] | None = None

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
        specs = self.claim_files
        if specs is None:
            return
        for uid, claim in list(self.checkpoint.claims.items()):
            if claim.specs and not specs.sweep.intact(uid, claim):
                log.warning(
                    "%s: its own CDI spec or device metadata is gone or unreadable; "
                    "forgotten, prepared anew when asked",
                    claim_label(claim.namespace, claim.name, uid),
                )
                self.checkpoint.remove(uid)
        specs.sweep.remove_orphans(self.checkpoint.claims)

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

    # -- what was prepared before -----------------------------------------------------------

    def known(self, refs: Sequence[ClaimRef], timeout: float) -> list[PrepareResult | None]:
        """The recorded answer of each claim prepared before, or None; see the module
        docstring. A state that cannot be read answers None (the claim is then read, and its
        prepare says why)."""
        try:
            if self.state.fresh():  # nothing changed by the other instance: no lock needed
                return [self._recorded(ref) for ref in refs]
            with self._shared(timeout):
                return [self._recorded(ref) for ref in refs]
        except CheckpointError as exc:
            log.warning(
                "prepare of %d claims: the state of the other instance not read: %s",
                len(refs),
                exc,
            )
            return [None] * len(refs)

    def _recorded(self, ref: ClaimRef) -> PrepareResult | None:
        known = self.checkpoint.get(ref.uid)
        if known is None:
            return None
        label = claim_label(ref.namespace, ref.name, ref.uid)
        log.info("prepared %s again from the checkpoint: %s", label, _describe(known.devices))
        return PrepareResult(known.devices)

    # -- prepare ----------------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimView], timeout: float) -> list[PrepareResult]:
        """Prepare each claim (read and checked to be the one named); never raises."""
        deadline = time.monotonic() + timeout
        return [self._prepare_one(claim, deadline - time.monotonic()) for claim in claims]

    def _prepare_one(self, claim: ClaimView, timeout: float) -> PrepareResult:
        """Check the claim, record it; refusals are logged by the generic part, which clips
        them as it answers them; a checkpoint error or an internal one is logged here."""
        label = claim_label(claim.namespace, claim.name, claim.uid)
        try:
            devices = self._prepare_checked(label, claim, timeout)
        except ClaimRefused as refused:
            return PrepareResult(error=str(refused), reason=str(refused.reason))
        except CheckpointError as exc:
            log.error("prepare of %s failed: %s", label, exc)
            return PrepareResult(error=f"{label}: {exc}", reason="checkpoint")
        except Exception as exc:
            log.exception("prepare of %s failed", label)
            return PrepareResult(
                error=f"{label}: internal error of driver {self.driver}: {exc}", reason="internal"
            )
        log.info("prepared %s: %s", label, _describe(devices))
        nodes, networks = shown(self.claim_files, self.pool.devices, devices)
        return PrepareResult(devices, device_nodes=nodes, network_data=networks)

    def _prepare_checked(
        self, label: str, claim: ClaimView, timeout: float
    ) -> tuple[PreparedDevice, ...]:
        pool = self.pool.devices
        uid = claim.uid
        devices = tuple(
            prepare_claim(label, claim, driver=self.driver, pool_name=self.pool_name, devices=pool)
        )
        configs = device_configs(label, claim, self.driver, [d.request_names[0] for d in devices])
        with self._shared(timeout):
            known = self.checkpoint.get(uid)
            if known is not None:
                # Prepared meanwhile by the other instance: the same answer as its.
                return known.devices
            self._check_exclusive(uid, label, devices, pool)
            self.state.changed()
            specs: tuple[SpecName, ...] = ()
            own = self.claim_files is not None and self.claim_files.serves_metadata
            if any(configs) or own:
                if self.claim_files is None:
                    raise ClaimRefused(
                        DriverRefusal.CLAIM_SPEC,
                        f"{label}: has configuration for driver {self.driver}, which writes no "
                        "per-claim specs here",
                    )
                devices, specs = self.claim_files.write(
                    uid, label, claim=claim, devices=devices, configs=configs, pool=pool
                )
            prepared = PreparedClaim(claim.namespace, claim.name, devices, specs)
            try:
                self._check_resolved(label, devices)
                self.checkpoint.add(uid, prepared)
            except BaseException:
                if specs and self.claim_files is not None:
                    try:
                        self.claim_files.remove(label, uid, prepared)
                    except SpecWriteError as exc:  # removed at the next start
                        log.warning("%s: its spec stays until the agent restarts: %s", label, exc)
                raise
        return devices

    def _check_exclusive(
        self, uid: str, label: str, devices: tuple[PreparedDevice, ...], pool: _Pool
    ) -> None:
        """Refuse a device another claim prepared here holds (or one sharing its nodes): the
        scheduler allocated it from a view of the API server that may be stale."""
        for device in devices:
            found = _holder(self.checkpoint, uid, device, pool)
            if found is not None:
                other, holder, name = found
                via = "" if name == device.device else f", through {name} (same nodes)"
                raise ClaimRefused(
                    DriverRefusal.IN_USE,
                    f"{label}: device {device.device} (pool {device.pool}) of request "
                    f"{', '.join(device.request_names)} is in use by "
                    f"{claim_label(holder.namespace, holder.name, other)}, prepared on this "
                    f"node{via}",
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
                DriverRefusal.UNRESOLVED, f"{label}: its CDI devices cannot be checked: {exc}"
            ) from None
        if problems:
            raise ClaimRefused(
                DriverRefusal.UNRESOLVED,
                f"{label}: CDI devices do not resolve: " + "; ".join(problems),
            )

    # -- unprepare --------------------------------------------------------------------------

    def unprepare(self, refs: Sequence[ClaimRef], timeout: float) -> list[Unprepared]:
        """Forget each claim (see the module docstring); never raises."""
        deadline = time.monotonic() + timeout
        return [self._unprepare_one(ref, deadline - time.monotonic()) for ref in refs]

    def _unprepare_one(self, ref: ClaimRef, timeout: float) -> Unprepared:
        label = claim_label(ref.namespace, ref.name, ref.uid)
        try:
            with self._shared(timeout):
                known = self.checkpoint.get(ref.uid)
                self.state.changed()  # unknown too: what it left goes (below)
                if known is not None and known.specs and self.claim_files is not None:
                    # The specs first: a record left by a crash after this names a spec that
                    # is gone, which the next start forgets; a spec left would be injected.
                    self.claim_files.remove(label, ref.uid, known)
                if self.checkpoint.remove(ref.uid):
                    log.info("unprepared %s", label)
                    if self.on_forgotten is not None:
                        self.on_forgotten()
                    return Unprepared(forgotten=True)
                if self.claim_files is not None:  # what a prepare could not undo
                    self.claim_files.remove_left(label, ref.uid, self.checkpoint.kinds)
                log.info("unprepared %s: it was not prepared here (nothing to do)", label)
                return Unprepared()
        except (CheckpointError, SpecWriteError) as exc:
            log.error("unprepare of %s failed: %s", label, exc)
            return Unprepared(f"{label}: {exc}")
        except Exception as exc:
            log.exception("unprepare of %s failed", label)
            return Unprepared(f"{label}: {exc}")


def shown(
    claim_files: ClaimFiles | None,
    pool: Mapping[str, PoolDevice],
    devices: Sequence[PreparedDevice],
) -> tuple[dict[str, tuple[str, ...]], dict[str, dict[str, str]]]:
    """The host device nodes and the network data of each pool device (what a claim's
    status shows), from the spec files the claims' devices resolve to."""
    if claim_files is None:
        return {}, {}
    names = {d.device: pool[d.device].cdi_name for d in devices if d.device in pool}
    nodes = {device: claim_files.device_nodes(cdi) for device, cdi in names.items()}
    networks = {
        device: net for device, cdi in names.items() if (net := claim_files.network_data(cdi))
    }
    return nodes, networks


def holders(preparer: PoolPreparer, device: str) -> list[HeldClaim]:
    """The claims ``preparer`` prepared that hold pool device ``device`` (admin access too:
    its pod uses the device), from what this process knows, without the state lock (on the
    loop: it never waits for the other instance's step)."""
    return [
        HeldClaim(
            ClaimRef(c.namespace, c.name, uid),
            c.devices,
            *shown(preparer.claim_files, preparer.pool.devices, c.devices),
        )
        # An immutable snapshot, replaced on every change.
        for uid, c in preparer.checkpoint.claims.items()
        if any(d.device == device for d in c.devices)
    ]
