"""Atomic spec files in a CDI spec folder, and a record of which files are ours.

Runtimes rescan the folder on every change and may read a file while it is being written, so
a spec is written to a temporary name they ignore, fsynced, renamed over the target and the
folder fsynced: a reader sees the old or the new complete file, never a partial one, even if
we are killed at any point. Files whose bytes would not change are left alone.

Ownership lives outside the spec (a spec annotation needs cdiVersion 0.6.0, which podman 4.3
and containerd < 1.7.12 reject): beside ``<vendor>-<class>.json`` we keep
``.<vendor>-<class>.json.cdi-gen-owner`` with the hashes of the contents we wrote. A spec is
ours only if its current bytes match one of them, so a file someone else put or replaced at
our name is foreign and is never modified or deleted. The record also names the cdi-gen
*instance* that wrote the spec (by default the vendor; ``--instance`` when two agents share a
folder and a vendor): an instance replaces and removes only its own specs, so two DaemonSets
sharing ``/var/run/cdi`` never delete or overwrite each other's files. A record written before
instances existed belongs to the instance named after its vendor.

Everything happens relative to a descriptor of the spec folder, on names we derive ourselves
from a valid vendor and class (so they hold no ``/``), with ``O_NOFOLLOW``: a record planted
by someone who can write the folder (a class of ``x/../../etc/passwd``, a symlinked subfolder)
can never make cdi-gen replace or remove anything but a regular file directly in the folder.
A record that does not sit at the name its own vendor and class give is ignored and logged.

A *transient* spec belongs to something shorter-lived than its class (a DRA claim): it is named
``<vendor>-<class>@<transient id>.json`` and its record says ``transient``. The CDI library's
own transient names join with ``_``, which a class name may hold too: class ``fpga_u1``'s spec
and claim ``u1``'s spec of class ``fpga`` would be one file, and the claim's prepare and
unprepare would replace and delete the class's. No vendor, class or transient ID holds ``@``,
so the two kinds of names never meet; :func:`migrate_transient_names` renames the specs an
older agent wrote under the ``_`` names. A transient spec is written and removed like a class's
spec, but :func:`owned_specs` and the removal of unconfigured classes never count it: whoever
made it (the DRA driver, through its checkpoint) removes it, found with
:func:`owned_transient_specs`. Its record may carry a *payload*, a JSON object of its writer's
(a DRA claim's record), which lives and goes with the spec: :func:`owned_transient_payloads`
reads them back, and :func:`remove_lone_transient_records` removes a record whose spec a killed
writer never wrote.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
import stat
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Literal

import orjson

from cdi_gen import names
from cdi_gen.errors import InvalidNameError, SpecWriteError, quote
from cdi_gen.files import OWNER_MAX_BYTES, SPEC_MAX_BYTES, FileRefused, read_regular
from cdi_gen.modes import make_folder

log = logging.getLogger(__name__)

SPEC_MODE = 0o644
DIR_MODE = 0o755
OWNER_SUFFIX = ".cdi-gen-owner"
TEMP_SUFFIX = ".cdi-gen-tmp"

#: Test seam: called with the name of each step; a test makes it kill the process.
StepHook = Callable[[str], None]


def spec_filename(vendor: str, cls: str) -> str:
    """``<vendor>-<class>.json``, the conventional name of a class's spec file.

    Raises :class:`~cdi_gen.errors.InvalidNameError` unless both are valid CDI names, so the
    result is always a plain file name (no ``/``, not ``..``).
    """
    names.validate_vendor(vendor)
    names.validate_class(cls)
    return f"{vendor}-{cls}.json"


#: A transient ID: the characters of a Kubernetes UID, alphanumeric first, so the file name
#: holds no ``/``, is not hidden and is never one of our temporary or record names.
_TRANSIENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


#: Joins a transient spec's class and ID: a character no vendor, class or ID holds.
TRANSIENT_SEPARATOR = "@"
#: The separator of transient names before :data:`TRANSIENT_SEPARATOR` (the CDI library's).
_LEGACY_SEPARATOR = "_"


def transient_filename(vendor: str, cls: str, transient: str) -> str:
    """``<vendor>-<class>@<transient>.json``, the name of a transient spec.

    Raises :class:`~cdi_gen.errors.InvalidNameError` unless vendor and class are valid CDI
    names and ``transient`` is 1-128 of ``A-Z a-z 0-9 _ . -`` starting alphanumeric.
    """
    return _transient_name(vendor, cls, transient, TRANSIENT_SEPARATOR)


def _transient_name(vendor: str, cls: str, transient: str, separator: str) -> str:
    base = spec_filename(vendor, cls)
    if _TRANSIENT_RE.fullmatch(transient) is None:
        raise InvalidNameError(
            "transient spec ID",
            transient,
            "must be 1-128 characters of A-Z a-z 0-9 _ . - starting alphanumeric",
        )
    return f"{base.removesuffix('.json')}{separator}{transient}.json"


def _owner_name(filename: str) -> str:
    return f".{filename}{OWNER_SUFFIX}"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def _folder(spec_dir: Path, create: bool = False) -> Iterator[int]:
    """A descriptor of the spec folder (the folder itself may be reached through links, as
    ``/var/run`` is; what is inside it never is)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        fd = os.open(spec_dir, flags)
    except FileNotFoundError:
        # Created only when missing (the common case, a write into a folder that exists,
        # costs one open): every prepared claim writes here.
        if not create:
            raise
        make_folder(spec_dir, DIR_MODE)  # explicit mode: not 0700 under umask 077
        fd = os.open(spec_dir, flags)
    try:
        yield fd
    finally:
        os.close(fd)


def _read_in(dir_fd: int, name: str, limit: int) -> bytes | None:
    """Content of the regular file ``name`` directly in the folder, None if absent; raise
    SpecWriteError if something else is there (a link, a FIFO, a folder, a huge file)."""
    try:
        return read_regular(name, limit, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except FileRefused as exc:
        raise SpecWriteError(f"{name!r} in the spec folder: {exc}") from None


def _read_owner(dir_fd: int, filename: str) -> dict[str, object] | None:
    try:
        raw = _read_in(dir_fd, _owner_name(filename), OWNER_MAX_BYTES)
    except SpecWriteError:
        return None
    if raw is None:
        return None
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def _hashes(record: dict[str, object] | None) -> list[str]:
    """The hashes of the contents a record says we wrote."""
    hashes = record.get("sha256") if record else None
    return [h for h in hashes if isinstance(h, str)] if isinstance(hashes, list) else []


def _owned_hashes(dir_fd: int, filename: str) -> list[str]:
    return _hashes(_read_owner(dir_fd, filename))


def _instance_of(record: dict[str, object] | None) -> str | None:
    """The instance a record names; a record from before instances: its vendor."""
    if record is None:
        return None
    instance = record.get("instance", record.get("vendor"))
    return instance if isinstance(instance, str) else None


def _check_instance(record: dict[str, object] | None, instance: str, target: Path) -> None:
    """Refuse to touch a spec of ours that another instance wrote (``record`` says who)."""
    other = _instance_of(record)
    if other is not None and other != instance:
        raise SpecWriteError(
            f"{str(target)!r} was written by cdi-gen instance {quote(other)}, not "
            f"{quote(instance)}; refusing to replace another instance's spec (two instances "
            "serve this class: give one of them other classes)"
        )


def atomic_replace(
    dir_fd: int,
    filename: str,
    data: bytes,
    mode: int = SPEC_MODE,
    *,
    durable: bool = True,
    hook: StepHook | None = None,
) -> None:
    """Write ``data`` to ``filename`` in the folder through an ignored temporary name; the
    file gets ``mode``. Without ``durable``, no fsync: readers still see the old or the new
    file, but a power loss may leave either (or an empty one)."""
    tmp = f".{filename}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    # O_EXCL|O_NOFOLLOW: never write through a link or file planted at the temporary name.
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    try:
        try:
            if hook:
                hook("temp-created")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if hook:
                hook("temp-written")
            os.fchmod(fd, mode)  # explicit: the umask must not make specs unreadable
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if hook:
            hook("temp-synced")
        # rename() replaces a link at the target instead of following it.
        os.rename(tmp, filename, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    if hook:
        hook("renamed")
    if durable:
        os.fsync(dir_fd)


def remove_stale_temps_in(dir_fd: int) -> int:
    """Delete the temporary files a killed writer left in the folder ``dir_fd``; how many."""
    removed = 0
    for name in os.listdir(dir_fd):
        if name.startswith(".") and name.endswith(TEMP_SUFFIX):
            with contextlib.suppress(OSError):
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                    os.unlink(name, dir_fd=dir_fd)
                    removed += 1
    return removed


def remove_stale_temps(spec_dir: Path) -> int:
    """Delete temporary files a killed writer left behind; return how many."""
    try:
        with _folder(spec_dir) as dir_fd:
            return remove_stale_temps_in(dir_fd)
    except OSError:
        return 0  # absent or unreadable: the write that follows reports why


def _check_names(vendor: str, cls: str, transient: str | None = None) -> str:
    try:
        if transient is not None:
            return transient_filename(vendor, cls, transient)
        return spec_filename(vendor, cls)
    except InvalidNameError as exc:
        raise SpecWriteError(f"refusing to touch the spec of {exc}") from None


def _owner_record(
    target: Path,
    names: dict[str, object],
    hashes: list[str],
    transient: str | None,
    payload: Mapping[str, object] | None,
) -> bytes:
    """The owner record of ``target`` as written: ``names`` (vendor, class, file, instance),
    the spec's ``hashes`` and, for a transient spec, its ID and ``payload``. Raises
    :class:`SpecWriteError` if it would be larger than a reader accepts: what is written is
    what can be read back, or the spec would be ours to no reader."""
    record = {**names, "sha256": hashes}
    if transient is not None:
        record["transient"] = transient
        if payload is not None:
            record["payload"] = dict(payload)
    encoded = orjson.dumps(record)
    if len(encoded) > OWNER_MAX_BYTES:
        raise SpecWriteError(
            f"{str(target)!r}: its owner record would be {len(encoded)} bytes, over the"
            f" {OWNER_MAX_BYTES} an owner record may hold (payload too large)"
        )
    return encoded


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
) -> bool:
    """Atomically make ``spec_dir/<vendor>-<class>.json`` hold ``data``; True if it changed.
    With ``transient``, the transient spec ``<vendor>-<class>_<transient>.json``; with
    ``payload`` as well, its owner record carries that JSON object, for
    :func:`owned_transient_payloads` (what the spec was written for, kept as long as it is).

    Creates the folder if missing. Raises :class:`SpecWriteError` if the target exists but is
    not ours (foreign file, link, content we never wrote, or a spec another ``instance`` wrote;
    default: the vendor), the vendor or class is not a valid name, the owner record would be
    larger than a reader accepts, or the folder cannot be written.
    """
    filename = _check_names(vendor, cls, transient)
    instance = instance or vendor
    target = spec_dir / filename
    try:
        with _folder(spec_dir, create=True) as dir_fd:
            if transient is None:
                # Not for a claim's spec: listing the folder at every prepared claim would
                # cost in proportion to the claims prepared; the class's writes (at start and
                # at every change) and the start-up sweep remove what a killed writer left.
                remove_stale_temps_in(dir_fd)
            current = _read_in(dir_fd, filename, SPEC_MAX_BYTES)
            record = _read_owner(dir_fd, filename)  # read once: ownership and instance
            current_hash = None if current is None else _digest(current)
            if current_hash is not None and current_hash not in _hashes(record):
                raise SpecWriteError(
                    f"{str(target)!r} exists and was not written by cdi-gen; refusing to "
                    "replace a foreign spec file (remove it or choose another vendor/class)"
                )
            if current is not None:
                _check_instance(record, instance, target)
            if current == data and (payload is None or (record or {}).get("payload") == payload):
                return False
            # The record names exactly the spec on disk now and the one about to replace it:
            # whichever survives a crash or a full disk between the two renames stays ours.
            # (Keeping "the last hashes written" instead lost the file on disk after two
            # failed writes in a row.)
            kept = [current_hash] if current_hash is not None else []
            new_hash = _digest(data)
            if new_hash not in kept:
                kept.append(new_hash)
            encoded = _owner_record(
                target,
                {"vendor": vendor, "class": cls, "file": filename, "instance": instance},
                kept,
                transient,
                payload,
            )
            owner_hook = (lambda step: step_hook(f"owner-{step}")) if step_hook else None
            atomic_replace(dir_fd, _owner_name(filename), encoded, hook=owner_hook)
            atomic_replace(dir_fd, filename, data, hook=step_hook)
    except SpecWriteError:
        raise
    except OSError as exc:
        raise SpecWriteError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from exc
    return True


def _is_owned_in(dir_fd: int, filename: str) -> bool:
    try:
        current = _read_in(dir_fd, filename, SPEC_MAX_BYTES)
    except SpecWriteError:
        return False
    return current is not None and _digest(current) in _owned_hashes(dir_fd, filename)


def _remove_record_of_gone_spec(dir_fd: int, filename: str) -> bool:
    """Remove the owner record of ``filename`` if the spec itself is not there; whether a
    record went."""
    try:
        os.stat(filename, dir_fd=dir_fd, follow_symlinks=False)
        return False
    except FileNotFoundError:
        pass
    try:
        os.unlink(_owner_name(filename), dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def remove_spec(
    spec_dir: Path,
    vendor: str,
    cls: str,
    *,
    instance: str | None = None,
    transient: str | None = None,
) -> bool:
    """Delete our spec file of ``vendor/cls`` (its ``transient`` spec, when given); True if
    one was removed.

    A foreign file at that name, or one another ``instance`` (default: the vendor) wrote, is
    left alone (False). Raises :class:`SpecWriteError` if the vendor or class is not a valid
    name or the folder cannot be written.
    """
    filename = _check_names(vendor, cls, transient)
    owner = _owner_name(filename)
    try:
        with _folder(spec_dir) as dir_fd:
            if _instance_of(_read_owner(dir_fd, filename)) not in (None, instance or vendor):
                return False
            if not _is_owned_in(dir_fd, filename):
                _remove_record_of_gone_spec(dir_fd, filename)  # ours, of a file already gone
                return False
            os.unlink(filename, dir_fd=dir_fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(owner, dir_fd=dir_fd)
            os.fsync(dir_fd)
    except FileNotFoundError:
        return False  # no folder, no spec
    except OSError as exc:
        raise SpecWriteError(f"cannot remove {str(spec_dir / filename)!r}: {exc}") from exc
    return True


_Owned = tuple[str, str, str | None, dict[str, object]]


def _valid_records(dir_fd: int, spec_dir: Path) -> Iterator[tuple[str, _Owned]]:
    """``(spec file name, (vendor, class, transient or None, record))`` of every owner
    record in the folder whose names are valid and which is stored under the name they give;
    any other is not one we wrote: it is logged and ignored. The spec itself is not looked at."""
    for entry in sorted(os.listdir(dir_fd)):
        if not (entry.startswith(".") and entry.endswith(OWNER_SUFFIX)):
            continue
        record = _read_owner(dir_fd, entry[1 : -len(OWNER_SUFFIX)])
        vendor = record.get("vendor") if record else None
        cls = record.get("class") if record else None
        transient = record.get("transient") if record else None
        try:
            if not (isinstance(vendor, str) and isinstance(cls, str)):
                raise ValueError("no vendor and class")
            if transient is not None and not isinstance(transient, str):
                raise ValueError(f"transient {quote(transient)} is not a string")
            filename = _check_names(vendor, cls, transient)
            if _owner_name(filename) != entry:
                raise ValueError(f"it names {filename}")
        except (ValueError, SpecWriteError) as exc:  # InvalidNameError is a ValueError
            log.warning(
                "ignoring owner record %s in %s: not one cdi-gen wrote (%s)",
                quote(entry),
                spec_dir,
                exc,
            )
            continue
        if record is not None:
            yield filename, (vendor, cls, transient, record)


def _owned_records(spec_dir: Path, instance: str | None) -> list[_Owned]:
    """``(vendor, class, transient or None, record)`` of every spec in ``spec_dir`` that is
    ours (and ``instance``'s, when given)."""
    found: list[_Owned] = []
    try:
        with _folder(spec_dir) as dir_fd:
            for filename, owned in _valid_records(dir_fd, spec_dir):
                if instance is not None and _instance_of(owned[3]) != instance:
                    continue
                if _is_owned_in(dir_fd, filename):
                    found.append(owned)
    except OSError:
        return found
    return found


def remove_lone_transient_records(spec_dir: Path, *, instance: str) -> list[str]:
    """Remove the owner records of ``instance``'s transient specs whose spec file is not
    there (a writer killed between the record and the spec, the one step a crash can leave
    behind: a transient ID, unlike a class, may never be written again); the spec file
    names whose records went."""
    removed: list[str] = []
    try:
        with _folder(spec_dir) as dir_fd:
            for filename, (_, _, transient, record) in _valid_records(dir_fd, spec_dir):
                if transient is None or _instance_of(record) != instance:
                    continue
                if _remove_record_of_gone_spec(dir_fd, filename):
                    removed.append(filename)
    except OSError:
        return removed
    return removed


def _new_transient_name(record: Mapping[str, object], old: str) -> str | None:
    """Today's name of the transient spec ``record`` is for, when ``old`` is the name an
    older agent gave it."""
    vendor, cls, transient = (record.get(k) for k in ("vendor", "class", "transient"))
    if not (isinstance(vendor, str) and isinstance(cls, str) and isinstance(transient, str)):
        return None
    try:
        if _transient_name(vendor, cls, transient, _LEGACY_SEPARATOR) != old:
            return None
        return transient_filename(vendor, cls, transient)
    except InvalidNameError:
        return None


def _migrate_one(dir_fd: int, entry: str, instance: str) -> str | None:
    """Rename the spec of the owner record ``entry`` if it is ``instance``'s transient spec
    under its old name; its new name."""
    old = entry[1 : -len(OWNER_SUFFIX)]
    record = _read_owner(dir_fd, old)
    if record is None or _instance_of(record) != instance:
        return None
    new = _new_transient_name(record, old)
    if new is None:
        return None
    if not _is_owned_in(dir_fd, old):
        _remove_record_of_gone_spec(dir_fd, old)
        return None
    try:
        os.stat(new, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        log.warning("spec %s keeps its old name: %s is already there", quote(old), quote(new))
        return None
    atomic_replace(dir_fd, _owner_name(new), orjson.dumps({**record, "file": new}))
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
        with _folder(spec_dir) as dir_fd:
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


def owned_specs(spec_dir: Path, *, instance: str | None = None) -> list[tuple[str, str]]:
    """``(vendor, class)`` of every class spec file in ``spec_dir`` that is ours (and
    ``instance``'s, when given), sorted; transient specs are not class specs and not listed.

    A record whose vendor or class is invalid, or which is not stored under the name its
    vendor and class give, is not ours (someone else wrote it): it is logged and ignored.
    """
    return sorted((v, c) for v, c, t, _ in _owned_records(spec_dir, instance) if t is None)


def owned_transient_specs(spec_dir: Path, *, instance: str) -> list[tuple[str, str, str]]:
    """``(vendor, class, transient id)`` of every transient spec ``instance`` wrote in
    ``spec_dir`` and that is still ours, sorted."""
    return sorted((v, c, t) for v, c, t, _ in _owned_records(spec_dir, instance) if t is not None)


def owned_transient_payloads(
    spec_dir: Path, *, instance: str
) -> list[tuple[str, str, str, object]]:
    """``(vendor, class, transient id, payload)`` of every transient spec ``instance`` wrote
    in ``spec_dir`` with a payload (:func:`write_bytes`) and that is still ours, sorted by
    names. The payload is as read: the caller checks its shape."""
    found = [
        (v, c, t, r["payload"])
        for v, c, t, r in _owned_records(spec_dir, instance)
        if t is not None and "payload" in r
    ]
    return sorted(found, key=lambda f: f[:3])


def replace_file(path: Path, data: bytes, mode: int = SPEC_MODE, *, durable: bool = True) -> None:
    """Atomically and durably make ``path`` hold ``data`` with ``mode``: temporary name,
    fsync, rename, folder fsync, missing folders created; raises OSError. The one way every
    file cdi-gen owns outside its specs is written (``render --output``, the DRA checkpoint,
    a claim's device metadata). Without ``durable``, the fsyncs are left out: for a file
    made again whenever it is found missing or unreadable.
    """
    with _folder(path.parent, create=True) as dir_fd:
        atomic_replace(dir_fd, path.name, data, mode, durable=durable)


def write_file(path: Path, data: bytes) -> None:
    """Atomically make ``path`` hold ``data`` (``render --output``): the same temporary name,
    fsync, rename and folder fsync as a spec, without an ownership record (the user named
    the file). Creates missing folders. A link or file planted at the temporary name is never
    written through. Raises :class:`SpecWriteError`.
    """
    if not path.name or path.name in (".", ".."):
        raise SpecWriteError(f"cannot write {str(path)!r}: not a file name")
    try:
        replace_file(path, data)
    except OSError as exc:
        raise SpecWriteError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from exc


#: What :func:`sync_spec` did to a class's spec file.
SyncOutcome = Literal["written", "unchanged", "removed", "absent"]


def sync_spec(
    spec_dir: Path, vendor: str, cls: str, data: bytes | None, *, instance: str | None = None
) -> SyncOutcome:
    """Bring the spec of ``vendor/cls`` to ``data``, or remove ours when ``data`` is None.

    The one answer to "write or remove a class's spec", for the agent and ``cdi-gen write``.
    Raises :class:`SpecWriteError` (see :func:`write_bytes` and :func:`remove_spec`).
    """
    if data is None:
        removed = remove_spec(spec_dir, vendor, cls, instance=instance)
        return "removed" if removed else "absent"
    written = write_bytes(spec_dir, vendor, cls, data, instance=instance)
    return "written" if written else "unchanged"


def remove_unconfigured(
    spec_dir: Path, configured: Collection[tuple[str, str]], *, instance: str
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
            if remove_spec(spec_dir, owned_vendor, owned_cls, instance=instance):
                done.append((owned_vendor, owned_cls, None))
        except SpecWriteError as exc:
            done.append((owned_vendor, owned_cls, exc))
    return done
