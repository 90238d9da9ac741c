"""The DRA driver's one store of prepared claims: a JSON file that survives restarts.

The kubelet calls NodePrepareResources once per claim and may not call it again after the
driver restarts, yet expects the same answer if it does, and calls NodeUnprepareResources
later. So every prepared claim is recorded in ``<state dir>/dra-<driver>.json`` before the
kubelet gets its answer, and removed when it is unprepared: its namespace and name, its
devices and the transient specs written for it (:mod:`~cdi_gen.dra.driver.preparedclaim`).
Two instances of one driver (a rolling update) share it: each change is made under their
:class:`~cdi_gen.dra.driver.statelock.StateLock`, after reading the file again when the other
changed it (:meth:`Checkpoint.load`).

The file is replaced atomically (temporary name, rename: a reader, and the next start after
a crash, finds the claims before or after the last change, never a mix), without fsync: a
change must outlive the agent's crash, and does (the page cache outlives the process); only
a power loss can lose it, and that is a reboot, which voids every record anyway (``bootId``,
:mod:`~cdi_gen.dra.driver.boot`). So a file that is not JSON (empty or torn, what a power loss
may leave) and was last written before this boot started is void: set aside like a file of
another boot, with one line. One of this boot that is not JSON is refused, as below.

The file says what it is (``kind``), which format (``version``) and whose it is
(``driver``). Format 5 holds every prepared claim and names the boot it was written in
(``bootId``). Older formats are read: 1 (cdi-gen before per-claim specs: no specs, no admin
access), 2 (per device ``adminAccess``, per claim its ``specs``: kind and transient ID), 3
(without the claims that have specs of their own) and 4 (``bootId``). A cdi-gen before format
5 recorded a claim with specs of its own in those specs' owner records instead: the first
load (at start) adopts such records of this boot that the file does not hold (``adopt_from``;
owner records are read for this alone, which can go once no such cdi-gen remains), and
writes the file once in format 5 when it adopted one or read an older format. A newer
format is refused, naming both, so an older cdi-gen never forgets claims it cannot read.
A file that is not that (corrupt, foreign, another driver's, a newer format), or that someone
else could have written (not owned by our effective user, or writable by group or others), is
refused with one line naming the file and why, and left as it is: overwriting it would forget
claims the kubelet still counts on, and cdi-gen never replaces a file it did not write. The
operator moves it away to start with no prepared claims. Within a file of ours, a claim is
answered again only if every recorded device is in our pool, every CDI name is of one of our
kinds (``vendor/class``) and every share ID a UID; the others are dropped with a line each.
What is written can be read back: a change making the file larger than the read cap is refused
(the file stays as it was); a claim records at most the API's limit of allocation results.

:class:`Checkpoint` is the store: the claims in memory, which of them are answered, the
adoption at start; :class:`CheckpointFile` is its file: read only if ours, parsed by format,
encoded and replaced.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from types import MappingProxyType

import orjson

from cdi_gen.cdi.atomicfile import replace_file
from cdi_gen.cdi.specnames import transient_filename
from cdi_gen.dra.driver.boot import BOOT_FIELD, Boot, BootError, read_boot, record_boot, set_aside
from cdi_gen.dra.driver.claimcheck import MAX_ALLOCATION_RESULTS
from cdi_gen.dra.driver.preparedclaim import PreparedClaim, SpecName, claim_doc, parse_claims
from cdi_gen.dra.plugin.claims import PreparedDevice
from cdi_gen.errors import CdiGenError, InvalidNameError, quote
from cdi_gen.files import FileId, FileRefused, read_regular
from cdi_gen.names import K8S_UUID_RULE, is_k8s_uuid, parse_qualified_name

__all__ = [
    "CHECKPOINT_KIND",
    "CHECKPOINT_MAX_BYTES",
    "CHECKPOINT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "CheckpointFile",
    "PreparedClaim",
    "SpecName",
    "checkpoint_path",
]

log = logging.getLogger(__name__)

CHECKPOINT_KIND = "cdi-gen.dra-prepared-claims"
CHECKPOINT_VERSION = 5
#: Formats read; the older ones are written as :data:`CHECKPOINT_VERSION` at start.
READ_VERSIONS = (1, 2, 3, 4, 5)
#: The first format that names its boot.
_BOOT_VERSION = 4
#: Largest checkpoint read, and written: a claim with one device takes ~350 bytes and one
#: with the most devices (32) and every name at its longest ~34 KiB, so this holds ~480 of
#: the largest claims and tens of thousands of common ones, more than a node prepares.
CHECKPOINT_MAX_BYTES = 16 << 20
_MODE = 0o600
#: Mode bits that let someone other than the owner change the file.
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_LEFT = "left as it is, not read; move it away to start with no prepared claims"


#: This boot's claim records a cdi-gen before format 5 left with their specs, by UID.
Recorded = Callable[[Boot], Mapping[str, PreparedClaim]]


class CheckpointError(CdiGenError):
    """The checkpoint file cannot be read as ours, or cannot be written."""


def checkpoint_path(state_dir: Path, driver: str) -> Path:
    """The checkpoint file of ``driver`` (a DNS subdomain, so a safe file name)."""
    return Path(state_dir) / f"dra-{driver}.json"


class CheckpointFile:
    """The checkpoint file ``path`` of driver ``driver``, at most ``max_bytes`` read or
    written. Raises :class:`CheckpointError` naming the file and why."""

    def __init__(self, path: Path, driver: str, max_bytes: int = CHECKPOINT_MAX_BYTES) -> None:
        self.path = Path(path)
        self.driver = driver
        self.max_bytes = max_bytes

    def read(self, boot: Boot) -> tuple[dict[str, PreparedClaim], int | None]:
        """The file's claims and format; none (and no format) when it was set aside as
        void. Raises OSError (FileNotFoundError: no file), FileRefused and CheckpointError."""
        raw, mtime = self._read()
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            if boot.wrote(None, mtime):  # not torn by a power loss: someone else's doing
                raise CheckpointError(f"{self.path}: not JSON ({exc}); {_LEFT}") from None
            set_aside(self.path, boot, None, mtime, None)
            return {}, None
        claims, written, version = self._parse(doc)
        if not boot.wrote(written, mtime):
            set_aside(self.path, boot, written, mtime, len(claims))
            return {}, None
        return claims, version

    def _read(self) -> tuple[bytes, float]:
        """The file's bytes and mtime, if it is ours alone: owned by our effective user and
        writable by nobody else (anyone who can write it could make us answer any CDI name)."""
        before = os.lstat(self.path)
        if stat.S_ISREG(before.st_mode):  # anything else: read_regular says what it is
            self._check_owner(before)
        raw = read_regular(self.path, self.max_bytes, follow_symlinks=False)
        after = os.lstat(self.path)
        if FileId.of(after) != FileId.of(before):
            raise FileRefused("replaced or changed while it was read")
        return raw, after.st_mtime

    def _check_owner(self, st: os.stat_result) -> None:
        euid = os.geteuid()
        if st.st_uid != euid:
            why = f"owned by uid {st.st_uid}, not by this agent's user (uid {euid})"
        elif st.st_mode & _OTHERS_WRITE:
            why = f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        else:
            return
        raise CheckpointError(f"{self.path}: {why}, so someone else may have written it; {_LEFT}")

    def _parse(self, doc: object) -> tuple[dict[str, PreparedClaim], str | None, int]:
        """The claims, the boot named (None: none) and the format of a file's JSON."""
        if not isinstance(doc, dict) or doc.get("kind") != CHECKPOINT_KIND:
            kind = doc.get("kind") if isinstance(doc, dict) else None
            raise CheckpointError(
                f"{self.path}: not a cdi-gen DRA checkpoint (kind {quote(kind)}, want "
                f"{CHECKPOINT_KIND!r}); {_LEFT}"
            )
        version = doc.get("version")
        if type(version) is not int or version not in READ_VERSIONS:  # not a bool, a float
            newer = type(version) is int and version > CHECKPOINT_VERSION
            raise CheckpointError(
                f"{self.path}: checkpoint format {quote(version)}"
                + (" (written by a newer cdi-gen)" if newer else "")
                + f"; this cdi-gen reads formats {READ_VERSIONS[0]} to {READ_VERSIONS[-1]}; "
                + _LEFT
            )
        if doc.get("driver") != self.driver:
            raise CheckpointError(
                f"{self.path}: checkpoint of driver {quote(doc.get('driver'))}, not "
                f"{self.driver!r}; {_LEFT}"
            )
        try:
            claims = parse_claims(doc.get("claims"))
            written = record_boot(doc, "") if version >= _BOOT_VERSION else None
        except ValueError as exc:
            raise CheckpointError(f"{self.path}: {exc}; {_LEFT}") from None
        return claims, written, version

    def encode(self, claims: Mapping[str, PreparedClaim], boot: Boot | None) -> bytes:
        """The file holding ``claims``, in this format, naming ``boot`` (when known)."""
        doc = {
            "kind": CHECKPOINT_KIND,
            "version": CHECKPOINT_VERSION,
            "driver": self.driver,
            **({BOOT_FIELD: boot.id} if boot else {}),
            "claims": {uid: claim_doc(claim) for uid, claim in claims.items()},
        }
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)

    def write(self, claims: Mapping[str, PreparedClaim], boot: Boot | None) -> None:
        """Replace the file with one holding ``claims`` (see the module docstring)."""
        data = self.encode(claims, boot)
        if len(data) > self.max_bytes:
            # Written, it could not be read back at the next start: DRA would stay down and
            # every prepared claim be lost. This change fails instead; the file stays as is.
            raise CheckpointError(
                f"{self.path}: recording this change would make the DRA checkpoint "
                f"{len(data)} bytes, over the {self.max_bytes} bytes it can read back; "
                "not recorded"
            )
        try:
            # Not durable: see the module docstring (a power loss is a reboot).
            replace_file(self.path, data, mode=_MODE, durable=False)
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot write the DRA checkpoint: {exc}") from exc


class Checkpoint:
    """The prepared claims of one driver, in memory and in its file. Every :meth:`load` and
    change runs under the driver's state lock (:class:`~cdi_gen.dra.driver.statelock.StateLock`,
    held by its one user, the preparer); readers get an immutable snapshot without it.

    ``pool`` is the driver's pool and ``kinds`` the CDI kinds (``vendor/class``) of its
    devices: what a recorded claim may name. ``max_bytes`` caps the file, read and written;
    ``boot`` is this boot (read at the first :meth:`load` when not given); ``adopt_from``
    gives the claim records an older cdi-gen left in owner records (see the module
    docstring). :meth:`add` and :meth:`remove` change the file first and memory only once the
    file holds the change, so a claim is never answered as prepared unless it is in the file.
    Raise CheckpointError.
    """

    def __init__(
        self,
        path: Path,
        driver: str,
        *,
        pool: str,
        kinds: Collection[str],
        max_bytes: int = CHECKPOINT_MAX_BYTES,
        boot: Boot | None = None,
        adopt_from: Recorded | None = None,
    ) -> None:
        self.file = CheckpointFile(path, driver, max_bytes)
        self.boot = boot
        self.pool = pool
        self.kinds = frozenset(kinds)
        self.adopt_from = adopt_from
        self._claims: Mapping[str, PreparedClaim] = MappingProxyType({})
        #: Whether a load succeeded: the first one adopts and converts (see :meth:`load`).
        self._loaded = False

    @property
    def path(self) -> Path:
        """The file."""
        return self.file.path

    @property
    def claims(self) -> Mapping[str, PreparedClaim]:
        """Every prepared claim by UID (an immutable snapshot)."""
        return self._claims

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def holder(self, device: PreparedDevice, uid: str) -> tuple[str, PreparedClaim] | None:
        """Another prepared claim (UID, record) that holds ``device`` exclusively, when
        ``device`` is to be held exclusively by ``uid`` too; None when nothing stands in the
        way. A device given with admin access or as a share (``share_id``) holds nothing."""
        if device.admin_access or device.share_id is not None:
            return None
        for other, claim in self._claims.items():
            if other == uid:
                continue
            for held in claim.devices:
                exclusive = not held.admin_access and held.share_id is None
                if exclusive and (held.pool, held.device) == (device.pool, device.device):
                    return other, claim
        return None

    def load(self) -> None:
        """Read the file (none: no claims; of another boot, or torn before this one: set
        aside, none answered), at start and whenever the other instance changed it. The
        first load also adopts this boot's claims ``adopt_from`` gives that the file does not
        hold, and writes the file in this format when it adopted one or read an older format
        (once: a later load reads what the other instance wrote, unchanged)."""
        try:
            boot = self.boot = self.boot or read_boot()
            claims, version = self.file.read(boot)
        except FileNotFoundError:  # none yet, or set aside meanwhile by the other instance
            claims, version = {}, None
        except BootError as exc:  # the file is fine: moving it away would not help
            raise CheckpointError(f"{exc}; the DRA checkpoint {self.path} is not read") from exc
        except (FileRefused, OSError) as exc:
            raise CheckpointError(
                f"{self.path}: cannot read the DRA checkpoint: {exc}; {_LEFT}"
            ) from exc
        claims = self._ours(claims)
        first = not self._loaded
        if version not in (None, CHECKPOINT_VERSION):
            log.info(
                "%s: checkpoint format %s read as format %s (written so %s)",
                self.path,
                version,
                CHECKPOINT_VERSION,
                "now" if first else "at the next change",
            )
        adopted = self._adopt(claims) if first else 0
        if first and (adopted or version not in (None, CHECKPOINT_VERSION)):
            self._write(claims)
        self._claims = MappingProxyType(claims)
        self._loaded = True

    def _adopt(self, claims: dict[str, PreparedClaim]) -> int:
        """Lay into ``claims`` the ones :attr:`adopt_from` gives that it does not hold, if
        ours (the others dropped with a line each); how many."""
        if self.adopt_from is None or self.boot is None:
            return 0
        found = {
            uid: claim
            for uid, claim in self.adopt_from(self.boot).items()
            if claim.specs and uid not in claims
        }
        found = self._ours(found)
        if found:
            log.info(
                "%s: %d prepared claims adopted from their specs' owner records (recorded by a "
                "cdi-gen before checkpoint format %d)",
                self.path,
                len(found),
                CHECKPOINT_VERSION,
            )
        claims.update(found)
        return len(found)

    def _ours(self, claims: dict[str, PreparedClaim]) -> dict[str, PreparedClaim]:
        """The recorded claims whose every device is of our pool and kinds; the others are
        dropped (a prepare of one reads it from the API server anew and checks it)."""
        kept = {}
        for uid, claim in claims.items():
            problem = self._foreign(claim)
            if problem is None:
                kept[uid] = claim
            else:
                log.warning(
                    "%s: prepared claim %s (uid %s) dropped: %s",
                    self.path,
                    quote(f"{claim.namespace}/{claim.name}"),
                    quote(uid),
                    problem,
                )
        return kept

    def _foreign(self, claim: PreparedClaim) -> str | None:
        """Why ``claim`` is not one this driver recorded, or None."""
        if len(claim.devices) > MAX_ALLOCATION_RESULTS:
            return (
                f"it records {len(claim.devices)} devices; a claim has at most "
                f"{MAX_ALLOCATION_RESULTS}"
            )
        for device in claim.devices:
            share = device.share_id  # an older cdi-gen took any: answered as prepare would
            if share is not None and not is_k8s_uuid(share):
                return f"shareID {quote(share, 60)}, not a share ID: want {K8S_UUID_RULE}"
            if device.pool != self.pool:
                return (
                    f"device {quote(device.device)} is in pool {quote(device.pool)}, not in "
                    f"this node's pool {quote(self.pool)}"
                )
            for cdi_id in device.cdi_device_ids:
                try:
                    vendor, cls, _ = parse_qualified_name(cdi_id)
                except InvalidNameError as exc:
                    return f"device {quote(device.device)}: {exc}"
                if f"{vendor}/{cls}" not in self.kinds:
                    return (
                        f"device {quote(device.device)} has CDI name {quote(cdi_id)}, not of "
                        f"this driver's kinds {quote(sorted(self.kinds))}"
                    )
        return next(filter(None, map(self._foreign_spec, claim.specs)), None)

    def _foreign_spec(self, spec: SpecName) -> str | None:
        """Why a recorded spec is not one this driver may remove (a file name it would not
        write, another kind), or None."""
        if spec.kind not in self.kinds:
            return (
                f"spec {quote(spec.kind)} is not of this driver's kinds {quote(sorted(self.kinds))}"
            )
        vendor, _, cls = spec.kind.partition("/")
        try:
            transient_filename(vendor, cls, spec.transient)
        except InvalidNameError as exc:
            return f"spec of {quote(spec.kind)}: {exc}"
        return None

    def add(self, uid: str, claim: PreparedClaim) -> None:
        """Record ``claim`` under ``uid`` (replacing an older record of that UID)."""
        if self._claims.get(uid) == claim:
            return
        claims = {**self._claims, uid: claim}
        self._write(claims)
        self._claims = MappingProxyType(claims)

    def remove(self, uid: str) -> bool:
        """Forget ``uid``; return whether it was recorded."""
        if uid not in self._claims:
            return False
        claims = {k: v for k, v in self._claims.items() if k != uid}
        self._write(claims)
        self._claims = MappingProxyType(claims)
        return True

    def encode(self, claims: Mapping[str, PreparedClaim]) -> bytes:
        """The file holding ``claims`` (:meth:`CheckpointFile.encode`)."""
        return self.file.encode(claims, self.boot)

    def _write(self, claims: Mapping[str, PreparedClaim]) -> None:
        self.file.write(claims, self.boot)
