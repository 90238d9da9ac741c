"""The claims' own files set against the prepared claims at start: what is gone, what is left.

:class:`~cdi_gen.dra.driver.claimfiles.ClaimFiles` writes and removes one claim's files as the
kubelet asks; :class:`ClaimSweep` looks at all of them once, when the driver loads its
checkpoint (:mod:`~cdi_gen.dra.driver.checkpoint`). It finds the claims whose files are gone
(:meth:`ClaimSweep.intact`: a node restart empties ``/var/run/cdi``, and a power loss may
leave a file written without fsync empty; such a claim is read and prepared anew), and
removes the files no prepared claim names (:meth:`ClaimSweep.remove_orphans`: this instance's
transient specs, owner records whose spec is gone, device metadata files).
:meth:`ClaimSweep.recorded` reads, for the checkpoint to adopt at start, the claim records a
cdi-gen before checkpoint format 5 wrote into its claim specs' owner records (it can go once
no such agent remains); a record of another boot is void (:mod:`~cdi_gen.dra.driver.boot`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from cdi_gen.cdi.ownerrecords import (
    owned_transient_payloads,
    owned_transient_specs,
    remove_lone_transient_records,
)
from cdi_gen.cdi.specnames import transient_filename
from cdi_gen.cdi.writer import migrate_transient_names, remove_spec
from cdi_gen.dra.driver.boot import Boot, record_boot
from cdi_gen.dra.driver.metadatafiles import MetadataFolder
from cdi_gen.dra.driver.preparedclaim import PreparedClaim, SpecName, read_claim_record
from cdi_gen.dra.plugin.claims import claim_label
from cdi_gen.errors import InvalidNameError, SpecWriteError, quote

__all__ = ["ClaimSweep"]

# The lines keep the logger of the module they were written in before the sweep had one of
# its own, so that what an operator filters on stays as it was.
log = logging.getLogger("cdi_gen.dra.driver.claimfiles")

#: Void claims a line names (the others are counted).
_VOID_SHOWN = 10


class ClaimSweep:
    """This instance's (``instance``) claim specs in ``spec_dir`` and, with ``metadata``, the
    claims' device metadata files there, set against the prepared claims at start."""

    def __init__(self, spec_dir: Path, instance: str, metadata: MetadataFolder | None) -> None:
        self.spec_dir = spec_dir
        self.instance = instance
        self.metadata = metadata

    def recorded(self, boot: Boot) -> dict[str, PreparedClaim]:
        """This boot's claims a cdi-gen before checkpoint format 5 recorded with their specs,
        by UID: read from the owner records of this instance's transient specs (those an
        older agent named the CDI library's way renamed first), for the checkpoint to adopt
        at start. A record that cannot be read as a claim, or that names a spec it does not
        sit beside, is logged and left out (its spec is then no prepared claim's, and goes as
        an orphan); so is one of another boot (void, one line for all: see
        :mod:`~cdi_gen.dra.driver.boot`)."""
        for name in migrate_transient_names(self.spec_dir, instance=self.instance):
            log.info("claim spec renamed to %s (claim and class specs no longer share names)", name)
        found: dict[str, PreparedClaim] = {}
        void: dict[str, tuple[PreparedClaim, str]] = {}
        for vendor, cls, transient, payload in owned_transient_payloads(
            self.spec_dir, instance=self.instance
        ):
            name = transient_filename(vendor, cls, transient)
            try:
                uid, claim = read_claim_record(payload)
                if SpecName(f"{vendor}/{cls}", transient) not in claim.specs:
                    raise ValueError(f"record.specs: does not name {name}")
                written = record_boot(payload)  # a dict: read_claim_record checked it
            except ValueError as exc:
                log.warning("spec %s: its claim record is unreadable: %s", quote(name), exc)
                continue
            if written is None or written == boot.id:
                found.setdefault(uid, claim)
            else:
                void.setdefault(uid, (claim, written))
        if void:
            _log_void(void, boot)
        return found

    def intact(self, uid: str, claim: PreparedClaim) -> bool:
        """Whether a prepared claim's files are all there: its specs and, with metadata, at
        least one metadata file of ours, each whole (written without fsync, a power loss may
        have left one empty)."""
        for spec in claim.specs:
            vendor, _, cls = spec.kind.partition("/")
            try:
                if not (self.spec_dir / transient_filename(vendor, cls, spec.transient)).is_file():
                    return False
            except (InvalidNameError, OSError):
                return False
        if self.metadata is None:
            return True
        return self.metadata.intact(uid, claim.namespace, claim.name, claim.requests)

    def remove_orphans(self, claims: Mapping[str, PreparedClaim]) -> int:
        """Remove this instance's transient specs that none of the prepared ``claims`` (by
        UID) names, the owner records whose spec is gone, and the device metadata of no
        prepared claim; how many specs."""
        if self.metadata is not None:
            self.metadata.remove_orphans(
                {
                    name
                    for uid, c in claims.items()
                    if c.specs
                    for name in self.metadata.files(uid, c.namespace, c.name, c.requests)
                }
            )
        for name in remove_lone_transient_records(self.spec_dir, instance=self.instance):
            log.info("removed the owner record of spec %s: the spec is not there", quote(name))
        keep = {(s.kind, s.transient) for c in claims.values() for s in c.specs}
        removed = 0
        for vendor, cls, transient in owned_transient_specs(self.spec_dir, instance=self.instance):
            if (f"{vendor}/{cls}", transient) in keep:
                continue
            name = transient_filename(vendor, cls, transient)
            try:
                if remove_spec(
                    self.spec_dir, vendor, cls, instance=self.instance, transient=transient
                ):
                    removed += 1
                    log.info("removed spec %s: no prepared claim names it", quote(name))
            except SpecWriteError as exc:
                log.warning("spec %s of no prepared claim stays: %s", quote(name), exc)
        return removed


def _log_void(void: Mapping[str, tuple[PreparedClaim, str]], boot: Boot) -> None:
    """One line for the claims recorded with their specs in another boot."""
    labels = [claim_label(c.namespace, c.name, uid) for uid, (c, _) in sorted(void.items())]
    more = f" and {len(labels) - _VOID_SHOWN} more" if len(labels) > _VOID_SHOWN else ""
    log.warning(
        "%d claims recorded with their specs in boot %s, not this boot %s, are void, never "
        "answered (each is prepared anew when the kubelet asks; their files go): %s%s",
        len(void),
        ", ".join(sorted({written for _, written in void.values()})),
        boot.id,
        ", ".join(labels[:_VOID_SHOWN]),
        more,
    )
