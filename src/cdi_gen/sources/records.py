"""Recorded udev data: ``udevadm info --export-db`` text and the JSON form of records.

What tests, benchmarks and ``--records`` feed instead of this machine's devices. Plain
parsing, no pyudev: a recording is untrusted input, so every malformed value is a
:class:`ValueError` naming where it is, never a crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from cdi_gen.errors import fragment
from cdi_gen.files import RECORDS_MAX_BYTES, read_regular
from cdi_gen.model import DeviceRecord, ParentRecord
from cdi_gen.sources import property_int

__all__ = [
    "load_records",
    "parse_records",
    "record_from_json",
    "records_from_export_db",
]


def parse_records(data: bytes) -> list[DeviceRecord]:
    """The records of a recording: export-db text, or a JSON list of records.

    Raises :class:`ValueError` (or TypeError, RecursionError for hostile JSON) naming the
    first bad record.
    """
    if not data.lstrip().startswith((b"[", b"{")):
        return records_from_export_db(data.decode("utf-8", "replace"))
    items = orjson.loads(data)
    if not isinstance(items, list):
        raise ValueError("a JSON records file is a list of records")
    records = []
    for i, item in enumerate(items):
        try:
            records.append(record_from_json(item))
        except ValueError as exc:
            raise ValueError(f"[{i}]: {exc}") from None
    return records


def load_records(path: Path) -> list[DeviceRecord]:
    """The records of the recording at ``path`` (read bounded: see :mod:`cdi_gen.files`).

    Raises what :func:`~cdi_gen.files.read_regular` and :func:`parse_records` raise.
    """
    return parse_records(read_regular(path, RECORDS_MAX_BYTES))


def _json_text(data: Mapping[str, Any], key: str, required: bool = False) -> str | None:
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        what = "missing" if value is None else f"should be a string, got {fragment(value)}"
        raise ValueError(f"{key}: {what}")
    return value


def _json_number(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    # bool is an int to Python, never a device number.
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    raise ValueError(f"{key}: should be a non-negative integer, got {fragment(value)}")


def _json_strings(data: Mapping[str, Any], key: str) -> dict[str, str]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"{key}: should be an object of strings, got {fragment(value)}")
    return dict(value)


def record_from_json(data: Mapping[str, Any]) -> DeviceRecord:
    """A record from its JSON form (the fields of :class:`~cdi_gen.model.DeviceRecord` by
    name, parents as objects of :class:`~cdi_gen.model.ParentRecord` fields, unset ones left
    out); raise ValueError naming a missing or bad key.

    Every field is type-checked here: a record file is input, and ``devnode: 5`` must be
    one clear error, not a failure deep inside discovery.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"a device record should be an object, got {fragment(data)}")
    parents_raw = data.get("parents") or []
    if not isinstance(parents_raw, list):
        raise ValueError(f"parents: should be a list, got {fragment(parents_raw)}")
    parents = []
    for i, p in enumerate(parents_raw):
        if not isinstance(p, Mapping):
            raise ValueError(f"parents[{i}]: should be an object, got {fragment(p)}")
        try:
            p_path = str(_json_text(p, "sys_path", required=True))
            parents.append(
                ParentRecord(
                    sys_path=p_path,
                    sys_name=_json_text(p, "sys_name") or p_path.rsplit("/", 1)[-1],
                    subsystem=_json_text(p, "subsystem"),
                    devtype=_json_text(p, "devtype"),
                    driver=_json_text(p, "driver"),
                    attributes=_json_strings(p, "attributes"),
                )
            )
        except ValueError as exc:
            raise ValueError(f"parents[{i}].{exc}") from None
    sys_path = str(_json_text(data, "sys_path", required=True))
    node_exists = data.get("node_exists", True)
    if not isinstance(node_exists, bool):
        raise ValueError(f"node_exists: should be true or false, got {fragment(node_exists)}")
    return DeviceRecord(
        sys_path=sys_path,
        subsystem=str(_json_text(data, "subsystem", required=True)),
        sys_name=_json_text(data, "sys_name") or sys_path.rsplit("/", 1)[-1],
        sys_number=_json_text(data, "sys_number"),
        devnode=_json_text(data, "devnode"),
        devtype=_json_text(data, "devtype"),
        major=_json_number(data, "major"),
        minor=_json_number(data, "minor"),
        driver=_json_text(data, "driver"),
        properties=_json_strings(data, "properties"),
        attributes=_json_strings(data, "attributes"),
        parents=tuple(parents),
        numa_node=_json_number(data, "numa_node"),
        node_exists=node_exists,
        action=_json_text(data, "action"),
    )


def _sys_number(sys_name: str) -> str | None:
    digits = len(sys_name) - len(sys_name.rstrip("0123456789"))
    return sys_name[-digits:] if digits else None


def _properties(entry: Mapping[str, Any]) -> dict[str, str]:
    """An entry's ``E:`` properties, with DEVLINKS made of its ``S:`` lines (links relative
    to /dev) when it has those and no DEVLINKS of its own."""
    props: dict[str, str] = entry.get("E", {})
    links = entry.get("S")
    if links and "DEVLINKS" not in props:
        props = {**props, "DEVLINKS": " ".join(f"/dev/{link}" for link in links)}
    return props


def records_from_export_db(text: str) -> list[DeviceRecord]:
    """Records from ``udevadm info --export-db`` output, of the devices with a device node.

    The database has properties but no sysfs attributes; parents are rebuilt from the other
    entries of the same dump (the longest DEVPATH prefixes), with their DRIVER property. A
    device's links are its DEVLINKS property; an entry that lists them only as ``S:`` lines
    (relative to /dev) gets DEVLINKS made of those.
    """
    entries: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if current.get("P"):
                entries.append(current)
            current = {}
            continue
        tag, _, value = line.partition(": ")
        if tag == "E":
            key, _, val = value.partition("=")
            current.setdefault("E", {})[key] = val
        elif tag == "S":
            current.setdefault("S", []).append(value)
        else:
            current[tag] = value
    by_path = {e["P"]: e for e in entries}
    records = []
    for e in entries:
        props = _properties(e)
        devpath = e["P"]
        devnode = props.get("DEVNAME") or (f"/dev/{e['N']}" if "N" in e else None)
        if not devnode:
            continue
        parents = []
        # Ancestors are the path's prefixes; a path without "/" (a broken dump) has none,
        # and must not be its own parent forever.
        up = devpath.rsplit("/", 1)[0] if "/" in devpath else ""
        while up and up != "/devices":
            p = by_path.get(up)
            if p is not None:
                pprops = p.get("E", {})
                parents.append(
                    ParentRecord(
                        sys_path=f"/sys{up}",
                        sys_name=up.rsplit("/", 1)[-1],
                        subsystem=pprops.get("SUBSYSTEM") or p.get("U"),
                        devtype=pprops.get("DEVTYPE") or p.get("T"),
                        driver=pprops.get("DRIVER") or p.get("V"),
                    )
                )
            up = up.rsplit("/", 1)[0] if "/" in up else ""
        sys_name = e.get("M") or devpath.rsplit("/", 1)[-1]
        records.append(
            DeviceRecord(
                sys_path=f"/sys{devpath}",
                subsystem=props.get("SUBSYSTEM") or e.get("U", ""),
                sys_name=sys_name,
                sys_number=e.get("R") or _sys_number(sys_name),
                devnode=devnode,
                devtype=props.get("DEVTYPE") or e.get("T"),
                major=property_int(props.get("MAJOR")),
                minor=property_int(props.get("MINOR")),
                driver=props.get("DRIVER") or e.get("V"),
                properties=props,
                parents=tuple(parents),
            )
        )
    return records
