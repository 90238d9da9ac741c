"""The DRA driver's prepared claims, kept in one JSON file that survives restarts.

The kubelet calls NodePrepareResources once per claim and may not call it again after the
driver restarts, yet expects the same answer if it does, and calls NodeUnprepareResources
later. So every prepared claim is recorded in ``<state dir>/dra-<driver>.json`` before the
kubelet gets its answer, and removed when it is unprepared. The file is replaced atomically
(temporary name, fsync, rename, folder fsync): after a crash it holds the claims before or
after the last change, never a mix. Two instances of one driver (a rolling update) share it:
each change is made under their :class:`~cdi_gen.dra.driver.statelock.StateLock`, after
reading the file again when the other changed it (:meth:`Checkpoint.load`).

A claim with specs of its own (:mod:`cdi_gen.dra.driver.claimspecs`) is recorded with them
instead: each of its specs' owner records in ``/var/run/cdi`` carries the claim
(:func:`claim_record`), written before the spec, and goes with it. Both live exactly as long
as the claim's specs do, and the claim costs no write of this file: the preparer hands them
in with :meth:`Checkpoint.adopt` at start, and :meth:`Checkpoint.add` and
:meth:`Checkpoint.remove` keep them in memory only.

The file says what it is (``kind``), which format (``version``) and whose it is
(``driver``). Format 2 added, per device, ``adminAccess`` and, per claim, the transient specs
written for it (``specs``: kind and transient ID). Format 3 leaves out the claims recorded with
their specs; a format-2 file's claims with specs stay in the file until they are unprepared,
and an older cdi-gen refuses format 3 instead of removing specs it would not know of. A format
1 file (cdi-gen before per-claim specs) is read with neither (its claims hold their devices
exclusively and have no spec of their own). Format 4 names the boot it was written in
(``bootId``): a file of another boot is void, set aside whole (:mod:`~cdi_gen.dra.driver.boot`).
Older formats are written as format 4 at the next change; a newer one is refused, naming both.
A file that is not that (corrupt, foreign, another driver's, a newer format), or that someone
else could have written (not owned by our effective user, or writable by group or others), is
refused with one line naming the file and why, and left as it is: overwriting it would forget
claims the kubelet still counts on, and cdi-gen never replaces a file it did not write. The
operator moves it away to start with no prepared claims. Within a file of ours, a claim is
answered again only if every recorded device is in our pool, every CDI name is of one of our
kinds (``vendor/class``) and every share ID a UID; the others are dropped with a line each.
What is written can be read back: a change making the file larger than the read cap is refused
(the file stays as it was); a claim records at most the API's limit of allocation results.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import orjson

from cdi_gen.cdi.atomicfile import replace_file
from cdi_gen.cdi.specnames import transient_filename
from cdi_gen.dra.driver.boot import BOOT_FIELD, Boot, BootError, read_boot, record_boot, set_aside
from cdi_gen.dra.driver.claimcheck import MAX_ALLOCATION_RESULTS
from cdi_gen.dra.plugin.claims import PreparedDevice
from cdi_gen.errors import CdiGenError, InvalidNameError, quote
from cdi_gen.files import FileRefused, read_regular
from cdi_gen.names import K8S_UUID_RULE, is_k8s_uuid, parse_qualified_name

__all__ = [
    "CHECKPOINT_KIND",
    "CHECKPOINT_MAX_BYTES",
    "CHECKPOINT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "ClaimSpec",
    "PreparedClaim",
    "checkpoint_path",
    "claim_record",
    "read_claim_record",
]

log = logging.getLogger(__name__)

CHECKPOINT_KIND = "cdi-gen.dra-prepared-claims"
CHECKPOINT_VERSION = 4
#: Formats read and converted to :data:`CHECKPOINT_VERSION` (written at the next change).
READ_VERSIONS = (1, 2, 3, 4)
#: Largest checkpoint read, and written: a claim with one device takes ~350 bytes and one
#: with the most devices (32) and every name at its longest ~34 KiB, so this holds ~480 of
#: the largest claims and tens of thousands of common ones, more than a node prepares.
CHECKPOINT_MAX_BYTES = 16 << 20
_MODE = 0o600
#: Mode bits that let someone other than the owner change the file.
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_LEFT = "left as it is, not read; move it away to start with no prepared claims"


class CheckpointError(CdiGenError):
    """The checkpoint file cannot be read as ours, or cannot be written."""


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    """A transient spec written for one claim: ``<vendor>-<class>@<transient>.json``."""

    kind: str
    transient: str


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """One prepared claim as recorded: who it is, the devices it was answered and the
    transient specs written for it."""

    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    specs: tuple[ClaimSpec, ...] = ()


def checkpoint_path(state_dir: Path, driver: str) -> Path:
    """The checkpoint file of ``driver`` (a DNS subdomain, so a safe file name)."""
    return Path(state_dir) / f"dra-{driver}.json"


def _device_doc(device: PreparedDevice) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "requestNames": list(device.request_names),
        "pool": device.pool,
        "device": device.device,
        "cdiDeviceIds": list(device.cdi_device_ids),
    }
    if device.share_id is not None:
        doc["shareId"] = device.share_id
    if device.admin_access:
        doc["adminAccess"] = True
    return doc


def _claim_doc(claim: PreparedClaim) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "namespace": claim.namespace,
        "name": claim.name,
        "devices": [_device_doc(d) for d in claim.devices],
    }
    if claim.specs:
        doc["specs"] = [{"kind": s.kind, "transient": s.transient} for s in claim.specs]
    return doc


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: want a list of strings, got {quote(value)}")
    return tuple(value)


def _string(doc: Mapping[str, object], key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key}: want a string, got {quote(value)}")
    return value


def _parse_device(doc: object, where: str) -> PreparedDevice:
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: want an object, got {quote(doc)}")
    share_id = doc.get("shareId")
    if share_id is not None and not isinstance(share_id, str):
        raise ValueError(f"{where}.shareId: want a string, got {quote(share_id)}")
    admin = doc.get("adminAccess", False)
    if not isinstance(admin, bool):
        raise ValueError(f"{where}.adminAccess: want a boolean, got {quote(admin)}")
    return PreparedDevice(
        request_names=_strings(doc.get("requestNames"), f"{where}.requestNames"),
        pool=_string(doc, "pool", where),
        device=_string(doc, "device", where),
        cdi_device_ids=_strings(doc.get("cdiDeviceIds"), f"{where}.cdiDeviceIds"),
        share_id=share_id,
        admin_access=admin,
    )


def _parse_specs(doc: object, where: str) -> tuple[ClaimSpec, ...]:
    if doc is None:
        return ()
    if not isinstance(doc, list):
        raise ValueError(f"{where}: want a list, got {quote(doc)}")
    specs = []
    for i, entry in enumerate(doc):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at}: want an object, got {quote(entry)}")
        specs.append(ClaimSpec(_string(entry, "kind", at), _string(entry, "transient", at)))
    return tuple(specs)


def _parse_claim(entry: object, where: str) -> PreparedClaim:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: want an object, got {quote(entry)}")
    devices = entry.get("devices")
    if not isinstance(devices, list):
        raise ValueError(f"{where}.devices: want a list, got {quote(devices)}")
    return PreparedClaim(
        namespace=_string(entry, "namespace", where),
        name=_string(entry, "name", where),
        devices=tuple(_parse_device(d, f"{where}.devices[{i}]") for i, d in enumerate(devices)),
        specs=_parse_specs(entry.get("specs"), f"{where}.specs"),
    )


def _parse_claims(doc: object) -> dict[str, PreparedClaim]:
    if not isinstance(doc, dict):
        raise ValueError(f"claims: want an object, got {quote(doc)}")
    return {uid: _parse_claim(entry, f"claims[{quote(uid)}]") for uid, entry in doc.items()}


def claim_record(uid: str, claim: PreparedClaim) -> dict[str, Any]:
    """The record of a claim with its own specs, as their owner records carry it."""
    return {"uid": uid, **_claim_doc(claim)}


def read_claim_record(doc: object) -> tuple[str, PreparedClaim]:
    """The UID and claim of a :func:`claim_record`; raises ValueError naming the field."""
    if not isinstance(doc, dict):
        raise ValueError(f"want an object, got {quote(doc)}")
    claim = _parse_claim(doc, "record")
    if not claim.specs:
        raise ValueError("record.specs: a claim recorded with its specs names them")
    return _string(doc, "uid", "record"), claim


class Checkpoint:
    """The prepared claims of one driver, in memory and in its file; safe across threads.

    ``pool`` is the driver's pool and ``kinds`` the CDI kinds (``vendor/class``) of its
    devices: what a recorded claim may name. ``max_bytes`` caps the file, read and written;
    ``boot`` is this boot (read at the first :meth:`load` when not given). :meth:`add` and
    :meth:`remove` change the file first and memory only once the file holds the change, so a
    claim is never answered as prepared unless it is on disk, or, for a claim with specs of
    its own, in their owner records (then the file is not written). Raise CheckpointError.
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
    ) -> None:
        self.path = Path(path)
        self.boot = boot
        self.driver = driver
        self.pool = pool
        self.kinds = frozenset(kinds)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._claims: Mapping[str, PreparedClaim] = MappingProxyType({})
        #: Claims with specs of their own that a format-2 file recorded: kept in the file
        #: until unprepared (their owner records carry no claim).
        self._in_file: frozenset[str] = frozenset()

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

    def load(self, recorded: Mapping[str, PreparedClaim] | None = None) -> None:
        """Read the file (none: no claims; of another boot: set aside, none answered).
        ``recorded``, the claims recorded with their specs (read from their owner records),
        are laid in as :meth:`adopt` takes them, in the same swap: read again while serving
        (the other instance changed the files), no claim is ever missing in between."""
        try:
            boot = self.boot = self.boot or read_boot()
            raw, mtime = self._read()
            claims, written = self._parse(raw)
            if not boot.wrote(written, mtime):
                set_aside(self.path, boot, written, mtime, len(claims))
                claims = {}
        except FileNotFoundError:  # none yet, or set aside meanwhile by the other instance
            claims = {}
        except BootError as exc:  # the file is fine: moving it away would not help
            raise CheckpointError(f"{exc}; the DRA checkpoint {self.path} is not read") from exc
        except (FileRefused, OSError) as exc:
            raise CheckpointError(
                f"{self.path}: cannot read the DRA checkpoint: {exc}; {_LEFT}"
            ) from exc
        claims = self._ours(claims)
        in_file = frozenset(uid for uid, claim in claims.items() if claim.specs)
        for uid, claim in (recorded or {}).items():
            if claim.specs and uid not in claims and self._ours({uid: claim}):
                claims[uid] = claim
        with self._lock:
            self._claims = MappingProxyType(claims)
            self._in_file = in_file

    def _read(self) -> tuple[bytes, float]:
        """The file's bytes and mtime, if it is ours alone: owned by our effective user and
        writable by nobody else (anyone who can write it could make us answer any CDI name)."""
        before = os.lstat(self.path)
        if stat.S_ISREG(before.st_mode):  # anything else: read_regular says what it is
            self._check_owner(before)
        raw = read_regular(self.path, self.max_bytes, follow_symlinks=False)
        after = os.lstat(self.path)
        if _identity(after) != _identity(before):
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

    def _foreign_spec(self, spec: ClaimSpec) -> str | None:
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

    def _parse(self, raw: bytes) -> tuple[dict[str, PreparedClaim], str | None]:
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise CheckpointError(f"{self.path}: not JSON ({exc}); {_LEFT}") from None
        if not isinstance(doc, dict) or doc.get("kind") != CHECKPOINT_KIND:
            kind = doc.get("kind") if isinstance(doc, dict) else None
            raise CheckpointError(
                f"{self.path}: not a cdi-gen DRA checkpoint (kind {quote(kind)}, want "
                f"{CHECKPOINT_KIND!r}); {_LEFT}"
            )
        version = doc.get("version")
        if version not in READ_VERSIONS or isinstance(version, bool):
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
            claims = _parse_claims(doc.get("claims"))
            written = record_boot(doc, "") if version == CHECKPOINT_VERSION else None
        except ValueError as exc:
            raise CheckpointError(f"{self.path}: {exc}; {_LEFT}") from None
        if version != CHECKPOINT_VERSION:
            log.info(
                "%s: checkpoint format %s read as format %s (written so at the next change)",
                self.path,
                version,
                CHECKPOINT_VERSION,
            )
        return claims, written

    def _filed(self, uid: str, claim: PreparedClaim) -> bool:
        """Whether ``claim`` is kept in the file (else with its specs)."""
        return not claim.specs or uid in self._in_file

    def add(self, uid: str, claim: PreparedClaim) -> None:
        """Record ``claim`` under ``uid`` (replacing an older record of that UID). A claim with
        specs of its own is recorded with them (the caller wrote its :func:`claim_record`
        into their owner records): it changes memory only."""
        with self._lock:
            if self._claims.get(uid) == claim:
                return
            claims = {**self._claims, uid: claim}
            old = self._claims.get(uid)
            if self._filed(uid, claim) or (old is not None and self._filed(uid, old)):
                self._write(claims)
            self._claims = MappingProxyType(claims)

    def adopt(self, uid: str, claim: PreparedClaim) -> bool:
        """At start, take in a claim recorded with its specs; False (with a line saying why)
        when it is not one this driver records, or ``uid`` is recorded already."""
        with self._lock:
            if not claim.specs or uid in self._claims or not self._ours({uid: claim}):
                return False
            self._claims = MappingProxyType({**self._claims, uid: claim})
            return True

    def remove(self, uid: str) -> bool:
        """Forget ``uid``; return whether it was recorded."""
        with self._lock:
            old = self._claims.get(uid)
            if old is None:
                return False
            claims = {k: v for k, v in self._claims.items() if k != uid}
            if self._filed(uid, old):
                self._write(claims)
            self._claims = MappingProxyType(claims)
            self._in_file -= {uid}
            return True

    def encode(self, claims: Mapping[str, PreparedClaim]) -> bytes:
        doc = {
            "kind": CHECKPOINT_KIND,
            "version": CHECKPOINT_VERSION,
            "driver": self.driver,
            **({BOOT_FIELD: self.boot.id} if self.boot else {}),
            "claims": {
                uid: _claim_doc(claim) for uid, claim in claims.items() if self._filed(uid, claim)
            },
        }
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)

    def _write(self, claims: Mapping[str, PreparedClaim]) -> None:
        data = self.encode(claims)
        if len(data) > self.max_bytes:
            # Written, it could not be read back at the next start: DRA would stay down and
            # every prepared claim be lost. This change fails instead; the file stays as is.
            raise CheckpointError(
                f"{self.path}: recording this change would make the DRA checkpoint "
                f"{len(data)} bytes, over the {self.max_bytes} bytes it can read back; "
                "not recorded"
            )
        try:
            replace_file(self.path, data, mode=_MODE)
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot write the DRA checkpoint: {exc}") from exc


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    # A rename or a write changes ctime: equal identities mean the checked file was read.
    return st.st_dev, st.st_ino, st.st_ctime_ns, st.st_size
