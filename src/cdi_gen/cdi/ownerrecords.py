"""Owner records: which spec files in a folder are ours, and which cdi-gen instance wrote them.

Ownership lives outside the spec (a spec annotation needs cdiVersion 0.6.0, which podman 4.3
and containerd < 1.7.12 reject): beside ``<vendor>-<class>.json`` we keep
``.<vendor>-<class>.json.cdi-gen-owner`` with the hashes of the contents we wrote. A spec is
ours only if its current bytes match one of them, so a file someone else put or replaced at
our name is foreign and is never modified or deleted. The record also names the cdi-gen
*instance* that wrote the spec (by default the vendor; ``--instance`` when two agents share a
folder and a vendor): an instance replaces and removes only its own specs. A record written
before instances existed belongs to the instance named after its vendor.

A record that does not sit at the name its own vendor and class give
(:mod:`cdi_gen.cdi.specnames`) is not one we wrote: it is ignored and logged. A transient
spec's record says ``transient`` and may carry a *payload*, a JSON object of its writer's (a
DRA claim's record), read back by :func:`owned_transient_payloads`; the class lists
(:func:`owned_specs`) never count a transient spec. Everything is read relative to a
descriptor of the folder, with ``O_NOFOLLOW``, from regular files only.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import orjson

from cdi_gen.cdi.atomicfile import folder
from cdi_gen.cdi.specnames import checked_filename
from cdi_gen.errors import SpecWriteError, quote
from cdi_gen.files import OWNER_MAX_BYTES, SPEC_MAX_BYTES, FileRefused, read_regular

__all__ = [
    "OWNER_SUFFIX",
    "Owned",
    "check_instance",
    "digest",
    "instance_of",
    "is_owned_in",
    "owned_specs",
    "owned_transient_payloads",
    "owned_transient_specs",
    "owner_name",
    "owner_record",
    "parse_owner",
    "read_in",
    "read_owner",
    "read_owner_bytes",
    "remove_lone_transient_records",
    "remove_record_of_gone_spec",
    "valid_records",
    "written_hashes",
]

# The writer's logger: the lines about records kept the logger name they had before the
# records had a module of their own.
log = logging.getLogger("cdi_gen.cdi.writer")

OWNER_SUFFIX = ".cdi-gen-owner"


def owner_name(filename: str) -> str:
    return f".{filename}{OWNER_SUFFIX}"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_in(dir_fd: int, name: str, limit: int) -> bytes | None:
    """Content of the regular file ``name`` directly in the folder, None if absent; raise
    SpecWriteError if something else is there (a link, a FIFO, a folder, a huge file)."""
    try:
        return read_regular(name, limit, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except FileRefused as exc:
        raise SpecWriteError(f"{name!r} in the spec folder: {exc}") from None


def read_owner_bytes(dir_fd: int, filename: str) -> bytes | None:
    """The owner record of ``filename`` as stored, None if absent or not a regular file."""
    try:
        return read_in(dir_fd, owner_name(filename), OWNER_MAX_BYTES)
    except SpecWriteError:
        return None


def parse_owner(raw: bytes | None) -> dict[str, object] | None:
    """An owner record's bytes read as one, None if they are not a JSON object."""
    if raw is None:
        return None
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def read_owner(dir_fd: int, filename: str) -> dict[str, object] | None:
    return parse_owner(read_owner_bytes(dir_fd, filename))


def written_hashes(record: dict[str, object] | None) -> list[str]:
    """The hashes of the contents a record says we wrote."""
    hashes = record.get("sha256") if record else None
    return [h for h in hashes if isinstance(h, str)] if isinstance(hashes, list) else []


def _owned_hashes(dir_fd: int, filename: str) -> list[str]:
    return written_hashes(read_owner(dir_fd, filename))


def instance_of(record: dict[str, object] | None) -> str | None:
    """The instance a record names; a record from before instances: its vendor."""
    if record is None:
        return None
    instance = record.get("instance", record.get("vendor"))
    return instance if isinstance(instance, str) else None


def check_instance(record: dict[str, object] | None, instance: str, target: Path) -> None:
    """Refuse to touch a spec of ours that another instance wrote (``record`` says who)."""
    other = instance_of(record)
    if other is not None and other != instance:
        raise SpecWriteError(
            f"{str(target)!r} was written by cdi-gen instance {quote(other)}, not "
            f"{quote(instance)}; refusing to replace another instance's spec (two instances "
            "serve this class: give one of them other classes)"
        )


def owner_record(
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


def is_owned_in(dir_fd: int, filename: str) -> bool:
    try:
        current = read_in(dir_fd, filename, SPEC_MAX_BYTES)
    except SpecWriteError:
        return False
    return current is not None and digest(current) in _owned_hashes(dir_fd, filename)


def remove_record_of_gone_spec(dir_fd: int, filename: str) -> bool:
    """Remove the owner record of ``filename`` if the spec itself is not there; whether a
    record went."""
    try:
        os.stat(filename, dir_fd=dir_fd, follow_symlinks=False)
        return False
    except FileNotFoundError:
        pass
    try:
        os.unlink(owner_name(filename), dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


Owned = tuple[str, str, str | None, dict[str, object]]


def valid_records(dir_fd: int, spec_dir: Path) -> Iterator[tuple[str, Owned]]:
    """``(spec file name, (vendor, class, transient or None, record))`` of every owner
    record in the folder whose names are valid and which is stored under the name they give;
    any other is not one we wrote: it is logged and ignored. The spec itself is not looked at."""
    for entry in sorted(os.listdir(dir_fd)):
        if not (entry.startswith(".") and entry.endswith(OWNER_SUFFIX)):
            continue
        record = read_owner(dir_fd, entry[1 : -len(OWNER_SUFFIX)])
        vendor = record.get("vendor") if record else None
        cls = record.get("class") if record else None
        transient = record.get("transient") if record else None
        try:
            if not (isinstance(vendor, str) and isinstance(cls, str)):
                raise ValueError("no vendor and class")
            if transient is not None and not isinstance(transient, str):
                raise ValueError(f"transient {quote(transient)} is not a string")
            filename = checked_filename(vendor, cls, transient)
            if owner_name(filename) != entry:
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


def _owned_records(spec_dir: Path, instance: str | None) -> list[Owned]:
    """``(vendor, class, transient or None, record)`` of every spec in ``spec_dir`` that is
    ours (and ``instance``'s, when given)."""
    found: list[Owned] = []
    try:
        with folder(spec_dir) as dir_fd:
            for filename, owned in valid_records(dir_fd, spec_dir):
                if instance is not None and instance_of(owned[3]) != instance:
                    continue
                if is_owned_in(dir_fd, filename):
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
        with folder(spec_dir) as dir_fd:
            for filename, (_, _, transient, record) in valid_records(dir_fd, spec_dir):
                if transient is None or instance_of(record) != instance:
                    continue
                if remove_record_of_gone_spec(dir_fd, filename):
                    removed.append(filename)
    except OSError:
        return removed
    return removed


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
