"""Atomic spec files in a CDI spec folder, and a record of which files are ours.

Runtimes rescan the folder on every change and may read a file while it is being written, so
a spec is written to a temporary name they ignore, fsynced, renamed over the target and the
folder fsynced: a reader sees the old or the new complete file, never a partial one, even if
we are killed at any point. Files whose bytes would not change are left alone.

Ownership lives outside the spec (a spec annotation needs cdiVersion 0.6.0, which podman 4.3
and containerd < 1.7.12 reject): beside ``<vendor>-<class>.json`` we keep
``.<vendor>-<class>.json.cdi-gen-owner`` with the hashes of the contents we wrote. A spec is
ours only if its current bytes match one of them, so a file someone else put or replaced at
our name is foreign and is never modified or deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from cdi_gen.codec import dump_document, dump_spec
from cdi_gen.errors import SpecWriteError
from cdi_gen.modes import make_folder
from cdi_gen.spec import Spec

SPEC_MODE = 0o644
DIR_MODE = 0o755
OWNER_SUFFIX = ".cdi-gen-owner"
TEMP_SUFFIX = ".cdi-gen-tmp"
#: Hashes kept per spec: the previous and the current content, so a crash between writing the
#: owner record and renaming the spec still recognises whichever file is on disk.
_KEPT_HASHES = 2

#: Test seam: called with the name of each step; a test makes it kill the process.
StepHook = Callable[[str], None]


def spec_filename(vendor: str, cls: str) -> str:
    """``<vendor>-<class>.json``, the conventional name of a class's spec file."""
    return f"{vendor}-{cls}.json"


def _owner_path(spec_dir: Path, filename: str) -> Path:
    return spec_dir / f".{filename}{OWNER_SUFFIX}"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_nofollow(path: Path) -> bytes | None:
    """File content, None if absent; raise if it is not a regular file (a planted link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SpecWriteError(f"{str(path)!r}: not a regular file we can read: {exc}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SpecWriteError(f"{str(path)!r}: not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_owner(spec_dir: Path, filename: str) -> dict[str, object] | None:
    try:
        raw = _read_nofollow(_owner_path(spec_dir, filename))
    except SpecWriteError:
        return None
    if raw is None:
        return None
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def _owned_hashes(spec_dir: Path, filename: str) -> list[str]:
    record = _read_owner(spec_dir, filename)
    hashes = record.get("sha256") if record else None
    return [h for h in hashes if isinstance(h, str)] if isinstance(hashes, list) else []


def _fsync_dir(spec_dir: Path) -> None:
    fd = os.open(spec_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_replace(spec_dir: Path, filename: str, data: bytes, hook: StepHook | None) -> None:
    """Write ``data`` to ``spec_dir/filename`` through an ignored temporary name."""
    tmp = spec_dir / f".{filename}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    # O_EXCL|O_NOFOLLOW: never write through a link or file planted at the temporary name.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            if hook:
                hook("temp-created")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if hook:
                hook("temp-written")
            os.fchmod(fd, SPEC_MODE)  # explicit: the umask must not make specs unreadable
            os.fsync(fd)
        finally:
            os.close(fd)
        if hook:
            hook("temp-synced")
        # rename() replaces a link at the target instead of following it.
        os.rename(tmp, spec_dir / filename)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if hook:
        hook("renamed")
    _fsync_dir(spec_dir)


def remove_stale_temps(spec_dir: Path) -> int:
    """Delete temporary files a killed writer left behind; return how many."""
    removed = 0
    try:
        entries = list(os.scandir(spec_dir))
    except OSError:
        return 0  # absent or unreadable: the write that follows reports why
    for entry in entries:
        if entry.name.startswith(".") and entry.name.endswith(TEMP_SUFFIX):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed += 1
    return removed


def write_bytes(
    spec_dir: Path, vendor: str, cls: str, data: bytes, *, step_hook: StepHook | None = None
) -> bool:
    """Atomically make ``spec_dir/<vendor>-<class>.json`` hold ``data``; True if it changed.

    Creates the folder if missing. Raises :class:`SpecWriteError` if the target exists but is
    not ours (foreign file, link, or content we never wrote) or the folder cannot be written.
    """
    filename = spec_filename(vendor, cls)
    target = spec_dir / filename
    try:
        make_folder(spec_dir, DIR_MODE)  # explicit mode: not 0700 under umask 077
        remove_stale_temps(spec_dir)
        current = _read_nofollow(target)
        hashes = _owned_hashes(spec_dir, filename)
        if current is not None and _digest(current) not in hashes:
            raise SpecWriteError(
                f"{str(target)!r} exists and was not written by cdi-gen; refusing to replace "
                "a foreign spec file (remove it or choose another vendor/class)"
            )
        if current == data:
            return False
        new_hash = _digest(data)
        kept = [*[h for h in hashes if h != new_hash][-(_KEPT_HASHES - 1) :], new_hash]
        record = {"vendor": vendor, "class": cls, "file": filename, "sha256": kept}
        owner_hook = (lambda step: step_hook(f"owner-{step}")) if step_hook else None
        _atomic_replace(
            spec_dir, _owner_path(spec_dir, filename).name, orjson.dumps(record), owner_hook
        )
        _atomic_replace(spec_dir, filename, data, step_hook)
    except SpecWriteError:
        raise
    except OSError as exc:
        raise SpecWriteError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from exc
    return True


def write_spec(spec_dir: Path, spec: Spec, *, step_hook: StepHook | None = None) -> bool:
    """Serialise ``spec`` (JSON) into ``spec_dir/<vendor>-<class>.json``; True if it changed.

    The spec must already carry its final ``cdiVersion`` (see
    :func:`cdi_gen.version.apply_version`). Raises :class:`SpecWriteError`.
    """
    return write_bytes(spec_dir, spec.vendor, spec.cls, dump_spec(spec), step_hook=step_hook)


def write_document(
    spec_dir: Path, doc: Mapping[str, Any], *, step_hook: StepHook | None = None
) -> bool:
    """Like :func:`write_spec` for a wire document built by :func:`cdi_gen.entry.assemble`."""
    vendor, _, cls = str(doc["kind"]).partition("/")
    return write_bytes(spec_dir, vendor, cls, dump_document(dict(doc)), step_hook=step_hook)


def is_owned(spec_dir: Path, vendor: str, cls: str) -> bool:
    """Whether the spec file of ``vendor/cls`` exists and holds content we wrote."""
    filename = spec_filename(vendor, cls)
    try:
        current = _read_nofollow(spec_dir / filename)
    except SpecWriteError:
        return False
    return current is not None and _digest(current) in _owned_hashes(spec_dir, filename)


def remove_spec(spec_dir: Path, vendor: str, cls: str) -> bool:
    """Delete our spec file of ``vendor/cls``; True if one was removed.

    A foreign file at that name is left alone (False). Raises :class:`SpecWriteError` if the
    folder cannot be written.
    """
    filename = spec_filename(vendor, cls)
    owner = _owner_path(spec_dir, filename)
    try:
        if not is_owned(spec_dir, vendor, cls):
            if not (spec_dir / filename).exists() and not (spec_dir / filename).is_symlink():
                owner.unlink(missing_ok=True)  # our record of a file already gone
            return False
        os.unlink(spec_dir / filename)
        owner.unlink(missing_ok=True)
        _fsync_dir(spec_dir)
    except OSError as exc:
        raise SpecWriteError(f"cannot remove {str(spec_dir / filename)!r}: {exc}") from exc
    return True


def owned_specs(spec_dir: Path) -> list[tuple[str, str]]:
    """``(vendor, class)`` of every spec file in ``spec_dir`` that is ours, sorted."""
    found: list[tuple[str, str]] = []
    try:
        entries = list(os.scandir(spec_dir))
    except OSError:
        return found
    for entry in entries:
        if not (entry.name.startswith(".") and entry.name.endswith(OWNER_SUFFIX)):
            continue
        filename = entry.name[1 : -len(OWNER_SUFFIX)]
        record = _read_owner(spec_dir, filename)
        if not record:
            continue
        vendor, cls = record.get("vendor"), record.get("class")
        if isinstance(vendor, str) and isinstance(cls, str) and is_owned(spec_dir, vendor, cls):
            found.append((vendor, cls))
    return sorted(found)
