"""The one spec writer: a class's or a transient spec's file written, replaced and removed in
a CDI spec folder, only ever ours, atomically.

A spec is written with its owner record (:mod:`cdi_gen.cdi.ownerrecords`) by the atomic steps
of :mod:`cdi_gen.cdi.atomicfile`: the record first, naming both the spec on disk and the one
about to replace it, so whichever survives a crash stays ours. A write that fails before its
spec is in place (a full disk) takes its record back: none for a spec that was not there, the
old one for a spec replaced. A file someone else put at our name, or a spec another cdi-gen
instance wrote, is refused. Files whose bytes would not change
are left alone. Everything happens relative to a descriptor of the spec folder, on names
derived from a valid vendor and class (:mod:`cdi_gen.cdi.specnames`), with ``O_NOFOLLOW``: a
record planted by someone who can write the folder (a class of ``x/../../etc/passwd``, a
symlinked subfolder) can never make cdi-gen replace or remove anything but a regular file
directly in the folder.

A transient spec (a DRA claim's) is written and removed like a class's spec, but the removal of
unconfigured classes never counts it: whoever made it (the DRA driver, through its checkpoint)
removes it. :func:`migrate_transient_names` renames the transient specs an older agent wrote
under the CDI library's ``_`` names.

A caller may pass ``notes`` (:class:`OwnWrites`): told of each spec file written (its bytes
and the identity of the file the rename put in place) and each removed, so that the runtime's
view of the folder (:class:`~cdi_gen.cdi.registry.SpecCache`) learns the agent's own changes
without reading the folder again.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Literal, Protocol

import orjson

from cdi_gen.cdi.atomicfile import StepHook, atomic_replace, folder, remove_stale_temps_in
from cdi_gen.cdi.ownerrecords import (
    OWNER_SUFFIX,
    check_instance,
    digest,
    instance_of,
    is_owned_in,
    owned_specs,
    owner_name,
    owner_record,
    parse_owner,
    read_in,
    read_owner,
    read_owner_bytes,
    remove_record_of_gone_spec,
    written_hashes,
)
from cdi_gen.cdi.specnames import checked_filename, legacy_transient_filename, transient_filename
from cdi_gen.errors import InvalidNameError, SpecWriteError, quote
from cdi_gen.files import SPEC_MAX_BYTES, FileId

__all__ = [
    "OwnWrites",
    "SyncOutcome",
    "migrate_transient_names",
    "remove_spec",
    "remove_unconfigured",
    "sync_spec",
    "write_bytes",
]

log = logging.getLogger(__name__)


class OwnWrites(Protocol):
    """Who learns the spec files this agent changes, as each change is made (called on the
    writing thread; must not wait on anything slow)."""

    def wrote(self, path: Path, data: bytes, file_id: FileId) -> None:
        """``path`` now holds ``data``, in the file ``file_id`` (as the rename left it)."""

    def removed(self, path: Path) -> None:
        """The spec file at ``path`` was removed."""


def write_bytes(
    spec_dir: Path,
    vendor: str,
    cls: str,
    data: bytes,
    *,
    instance: str | None = None,
    transient: str | None = None,
    payload: Mapping[str, object] | None = None,
    step_hook: StepHook | None = None,
    notes: OwnWrites | None = None,
) -> bool:
    """Atomically make ``spec_dir/<vendor>-<class>.json`` hold ``data``; True if it changed.
    With ``transient``, the transient spec ``<vendor>-<class>@<transient>.json``; with
    ``payload`` as well, its owner record carries that JSON object, for
    :func:`owned_transient_payloads` (what the spec was written for, kept as long as it is).

    Creates the folder if missing. Raises :class:`SpecWriteError` if the target exists but is
    not ours (foreign file, link, content we never wrote, or a spec another ``instance`` wrote;
    default: the vendor), the vendor or class is not a valid name, the owner record would be
    larger than a reader accepts, or the folder cannot be written. ``notes`` learns a write
    that changed the file.
    """
    filename = checked_filename(vendor, cls, transient)
    instance = instance or vendor
    target = spec_dir / filename
    try:
        with folder(spec_dir, create=True) as dir_fd:
            if transient is None:
                # Not for a claim's spec: listing the folder at every prepared claim would
                # cost in proportion to the claims prepared; the class's writes (at start and
                # at every change) and the start-up sweep remove what a killed writer left.
                remove_stale_temps_in(dir_fd)
            current = read_in(dir_fd, filename, SPEC_MAX_BYTES)
            previous = read_owner_bytes(dir_fd, filename)
            record = parse_owner(previous)  # read once: ownership and instance
            current_hash = None if current is None else digest(current)
            if current_hash is not None and current_hash not in written_hashes(record):
                raise SpecWriteError(
                    f"{str(target)!r} exists and was not written by cdi-gen; refusing to "
                    "replace a foreign spec file (remove it or choose another vendor/class)"
                )
            if current is not None:
                check_instance(record, instance, target)
            if current == data and (payload is None or (record or {}).get("payload") == payload):
                return False
            # The record names exactly the spec on disk now and the one about to replace it:
            # whichever survives a crash or a full disk between the two renames stays ours.
            # (Keeping "the last hashes written" instead lost the file on disk after two
            # failed writes in a row.)
            kept = [current_hash] if current_hash is not None else []
            new_hash = digest(data)
            if new_hash not in kept:
                kept.append(new_hash)
            encoded = owner_record(
                target,
                {"vendor": vendor, "class": cls, "file": filename, "instance": instance},
                kept,
                transient,
                payload,
            )
            owner_hook = (lambda step: step_hook(f"owner-{step}")) if step_hook else None
            try:
                atomic_replace(dir_fd, owner_name(filename), encoded, hook=owner_hook)
                written = atomic_replace(dir_fd, filename, data, hook=step_hook)
            except BaseException:
                _take_back(dir_fd, filename, new_hash, None if current is None else previous)
                raise
    except SpecWriteError:
        raise
    except OSError as exc:
        raise SpecWriteError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from exc
    if notes is not None:
        notes.wrote(target, data, written)
    return True


def _take_back(dir_fd: int, filename: str, new_hash: str, previous: bytes | None) -> None:
    """After a write of ``filename`` failed: its owner record back to ``previous`` (None: the
    spec was not there, so no record), unless the new spec made it to its name (a step after
    the rename failed), which the record as written names. A record left by a failure here
    still names the spec on disk, so nothing becomes foreign; at worst it is one that names
    no spec, which the next start removes."""
    with contextlib.suppress(OSError, SpecWriteError):
        now = read_in(dir_fd, filename, SPEC_MAX_BYTES)
        if now is not None and digest(now) == new_hash:
            return
        if previous is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(owner_name(filename), dir_fd=dir_fd)
        else:
            atomic_replace(dir_fd, owner_name(filename), previous)


def remove_spec(
    spec_dir: Path,
    vendor: str,
    cls: str,
    *,
    instance: str | None = None,
    transient: str | None = None,
    notes: OwnWrites | None = None,
) -> bool:
    """Delete our spec file of ``vendor/cls`` (its ``transient`` spec, when given); True if
    one was removed (and ``notes`` told).

    A foreign file at that name, or one another ``instance`` (default: the vendor) wrote, is
    left alone (False). Raises :class:`SpecWriteError` if the vendor or class is not a valid
    name or the folder cannot be written.
    """
    filename = checked_filename(vendor, cls, transient)
    owner = owner_name(filename)
    try:
        with folder(spec_dir) as dir_fd:
            if instance_of(read_owner(dir_fd, filename)) not in (None, instance or vendor):
                return False
            if not is_owned_in(dir_fd, filename):
                remove_record_of_gone_spec(dir_fd, filename)  # ours, of a file already gone
                return False
            os.unlink(filename, dir_fd=dir_fd)
            if notes is not None:
                notes.removed(spec_dir / filename)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(owner, dir_fd=dir_fd)
            os.fsync(dir_fd)
    except FileNotFoundError:
        return False  # no folder, no spec
    except OSError as exc:
        raise SpecWriteError(f"cannot remove {str(spec_dir / filename)!r}: {exc}") from exc
    return True


def _new_transient_name(record: Mapping[str, object], old: str) -> str | None:
    """Today's name of the transient spec ``record`` is for, when ``old`` is the name an
    older agent gave it."""
    vendor, cls, transient = (record.get(k) for k in ("vendor", "class", "transient"))
    if not (isinstance(vendor, str) and isinstance(cls, str) and isinstance(transient, str)):
        return None
    try:
        if legacy_transient_filename(vendor, cls, transient) != old:
            return None
        return transient_filename(vendor, cls, transient)
    except InvalidNameError:
        return None


def _migrate_one(dir_fd: int, entry: str, instance: str) -> str | None:
    """Rename the spec of the owner record ``entry`` if it is ``instance``'s transient spec
    under its old name; its new name."""
    old = entry[1 : -len(OWNER_SUFFIX)]
    record = read_owner(dir_fd, old)
    if record is None or instance_of(record) != instance:
        return None
    new = _new_transient_name(record, old)
    if new is None:
        return None
    if not is_owned_in(dir_fd, old):
        remove_record_of_gone_spec(dir_fd, old)
        return None
    try:
        os.stat(new, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        log.warning("spec %s keeps its old name: %s is already there", quote(old), quote(new))
        return None
    atomic_replace(dir_fd, owner_name(new), orjson.dumps({**record, "file": new}))
    os.rename(old, new, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.unlink(entry, dir_fd=dir_fd)
    return new


def migrate_transient_names(spec_dir: Path, *, instance: str) -> list[str]:
    """Rename ``instance``'s transient specs that an older agent wrote under the CDI
    library's names (``<vendor>-<class>_<id>.json``) to :func:`transient_filename`'s; the new
    names. Only a spec whose record sits at the old name its own fields give, names
    ``instance`` and holds the spec's hash moves; a record of such a name whose spec is gone
    is removed. Each step leaves what a later start finishes: the new record first (alone, it
    is a lone record and goes), then the spec by one rename (runtimes see it move, never two
    copies of its devices), then the old record."""
    moved: list[str] = []
    try:
        with folder(spec_dir) as dir_fd:
            for entry in sorted(os.listdir(dir_fd)):
                if entry.startswith(".") and entry.endswith(OWNER_SUFFIX):
                    new = _migrate_one(dir_fd, entry, instance)
                    if new is not None:
                        moved.append(new)
            if moved:
                os.fsync(dir_fd)
    except FileNotFoundError:
        return moved  # no folder yet
    except OSError as exc:
        log.warning("claim specs in %s not renamed to today's names: %s", spec_dir, exc)
    return moved


#: What :func:`sync_spec` did to a class's spec file.
SyncOutcome = Literal["written", "unchanged", "removed", "absent"]


def sync_spec(
    spec_dir: Path,
    vendor: str,
    cls: str,
    data: bytes | None,
    *,
    instance: str | None = None,
    notes: OwnWrites | None = None,
) -> SyncOutcome:
    """Bring the spec of ``vendor/cls`` to ``data``, or remove ours when ``data`` is None.

    The one answer to "write or remove a class's spec", for the agent and ``cdi-gen write``.
    Raises :class:`SpecWriteError` (see :func:`write_bytes` and :func:`remove_spec`).
    """
    if data is None:
        removed = remove_spec(spec_dir, vendor, cls, instance=instance, notes=notes)
        return "removed" if removed else "absent"
    written = write_bytes(spec_dir, vendor, cls, data, instance=instance, notes=notes)
    return "written" if written else "unchanged"


def remove_unconfigured(
    spec_dir: Path,
    configured: Collection[tuple[str, str]],
    *,
    instance: str,
    notes: OwnWrites | None = None,
) -> list[tuple[str, str, SpecWriteError | None]]:
    """Remove the specs ``instance`` wrote of classes not in ``configured`` (``(vendor,
    class)`` pairs): another instance's specs are never touched. Returns ``(vendor, class,
    error or None)`` for each spec removed or that could not be.
    """
    done: list[tuple[str, str, SpecWriteError | None]] = []
    for owned_vendor, owned_cls in owned_specs(spec_dir, instance=instance):
        if (owned_vendor, owned_cls) in configured:
            continue
        try:
            if remove_spec(spec_dir, owned_vendor, owned_cls, instance=instance, notes=notes):
                done.append((owned_vendor, owned_cls, None))
        except SpecWriteError as exc:
            done.append((owned_vendor, owned_cls, exc))
    return done
