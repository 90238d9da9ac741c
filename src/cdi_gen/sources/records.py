"""Recorded udev data: ``udevadm info --export-db`` text and the JSON form of records.

What tests, benchmarks and ``--records`` feed instead of this machine's devices, and what
``cdi-gen record`` writes. Plain parsing, no pyudev: a recording is untrusted input, so every
malformed value is a :class:`ValueError` naming where it is, never a crash. A
:class:`Recording` also says what its format cannot answer, so that a rule needing what the
recording lacks is reported instead of silently matching nothing.

Three forms are read (a file starting with ``[`` or ``{`` is JSON, anything else export-db):

``udevadm info --export-db`` text
    Properties only (``E:`` lines; ``P:``, ``N:``, ``M:``, ``R:``, ``U:``, ``T:``, ``V:`` for
    the path, node, name, number, subsystem, devtype, driver). **No sysfs attributes and no
    ``numa_node``**: an ``attributes`` or ``parentAttributes`` rule, a health check or an
    ``{attribute[...]}``/``{parent_attribute[...]}``/``{numa}`` template has nothing to read.
    Parents (for DRIVERS and grouping) are the other entries of the same dump whose path is a
    prefix; a dump cut down to some devices loses them.

A JSON list of records
    ``[record, ...]``: each record's ``attributes`` are taken as all the device has (the
    reader cannot tell an attribute left out from one the device lacks).

A JSON recording, as ``cdi-gen record`` writes it
    An object: ``{"format": "cdi-gen records", "version": 1, "attributes": [name, ...],
    "parent_attributes": [name, ...], "records": [record, ...]}``. ``format`` and
    ``version`` (the integer 1) are required; ``attributes`` (strings, default none) are the
    sysfs attributes read on every device, ``parent_attributes`` (strings, default none)
    those read on every parent. A record lacking one of them: the device has no such
    attribute. A rule needing an attribute not named there cannot be answered.

A record (JSON object; unset keys left out, other keys ignored):

============== ============================= ==============================================
key            type                          meaning
============== ============================= ==============================================
sys_path       string, required              ``/sys/devices/...``
subsystem      string, required              udev SUBSYSTEM
sys_name       string                        kernel name (default: last part of sys_path)
sys_number     string                        trailing digits of the kernel name
devnode        string                        ``/dev/...``; a record without one never matches
devtype        string                        udev DEVTYPE
major, minor   integer ≥ 0                   device numbers
driver         string                        the device's own driver
properties     object of string → string     udev properties (``ID_*``, ``DEVLINKS``...)
attributes     object of string → string     sysfs attributes (ATTR), values as read
parents        list of parent objects        immediate parent first, up to the root
numa_node      integer ≥ 0                   NUMA node (nearest PCI device's; absent: none)
node_exists    true or false (default true)  whether the device node exists
action         string                        uevent action (absent: enumerated)
============== ============================= ==============================================

A parent object has ``sys_path`` (string, required), ``sys_name``, ``subsystem``,
``devtype``, ``driver`` (strings) and ``attributes`` (object of string → string).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from cdi_gen.errors import fragment
from cdi_gen.files import RECORDS_MAX_BYTES, read_regular
from cdi_gen.model import DeviceRecord, ParentRecord
from cdi_gen.sources import property_int

__all__ = [
    "EXPORT_DB",
    "JSON_LIST",
    "JSON_RECORDING",
    "RECORDING_FORMAT",
    "RECORDING_VERSION",
    "Recording",
    "load_recording",
    "parse_recording",
    "record_from_json",
    "record_to_json",
    "recording_to_json",
    "records_from_export_db",
]

#: The ``format`` and ``version`` of a JSON recording written by ``cdi-gen record``.
RECORDING_FORMAT = "cdi-gen records"
RECORDING_VERSION = 1
#: What each form is called in messages.
EXPORT_DB = "udevadm info --export-db"
JSON_LIST = "a JSON list of records"
JSON_RECORDING = "cdi-gen record"


@dataclass(frozen=True, slots=True)
class Recording:
    """The records of a recording, and what its format can answer."""

    records: tuple[DeviceRecord, ...]
    #: Which form it was (:data:`EXPORT_DB`, :data:`JSON_LIST`, :data:`JSON_RECORDING`).
    format: str
    #: The sysfs attributes read on every device; None: the records list all they have.
    attributes: frozenset[str] | None = None
    #: The same for every parent.
    parent_attributes: frozenset[str] | None = None
    #: Whether ``numa_node`` was read.
    numa: bool = True

    def answers(self, name: str, *, parent: bool = False) -> bool:
        """Whether the records can tell the sysfs attribute ``name`` of a device (``parent``:
        of a device or its parents, as ATTRS reads it)."""
        known = self.parent_attributes if parent else self.attributes
        return known is None or name in known


def parse_recording(data: bytes) -> Recording:
    """The recording in ``data``: export-db text, a JSON list of records, or a JSON recording.

    Raises :class:`ValueError` (or TypeError, RecursionError for hostile JSON) naming the
    first bad record or header key.
    """
    if not data.lstrip().startswith((b"[", b"{")):
        return Recording(
            tuple(records_from_export_db(data.decode("utf-8", "replace"))),
            EXPORT_DB,
            attributes=frozenset(),
            parent_attributes=frozenset(),
            numa=False,
        )
    doc = orjson.loads(data)
    if isinstance(doc, list):
        return Recording(_json_records(doc, ""), JSON_LIST)
    if not isinstance(doc, Mapping) or doc.get("format") != RECORDING_FORMAT:
        # Text starting with "{" parses to an object, "[" to a list: doc is a Mapping here.
        has = isinstance(doc, Mapping) and "format" in doc
        got = f"format {fragment(doc['format'])}" if has else "no format"
        raise ValueError(
            "a JSON records file is a list of records, or an object whose format is "
            f"{RECORDING_FORMAT!r} (this one has {got})"
        )
    version = doc.get("version")
    if version != RECORDING_VERSION or isinstance(version, bool):
        raise ValueError(f"version: should be {RECORDING_VERSION}, got {fragment(version)}")
    items = doc.get("records")
    if not isinstance(items, list):
        raise ValueError(f"records: should be a list of records, got {fragment(items)}")
    return Recording(
        _json_records(items, "records"),
        JSON_RECORDING,
        attributes=_json_names(doc, "attributes"),
        parent_attributes=_json_names(doc, "parent_attributes"),
    )


def _json_records(items: list[Any], where: str) -> tuple[DeviceRecord, ...]:
    records = []
    for i, item in enumerate(items):
        try:
            records.append(record_from_json(item))
        except ValueError as exc:
            raise ValueError(f"{where}[{i}]: {exc}") from None
    return tuple(records)


def _json_names(doc: Mapping[str, Any], key: str) -> frozenset[str]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key}: should be a list of strings, got {fragment(value)}")
    return frozenset(value)


def load_recording(path: Path) -> Recording:
    """The recording at ``path`` (read bounded: see :mod:`cdi_gen.files`).

    Raises what :func:`~cdi_gen.files.read_regular` and :func:`parse_recording` raise.
    """
    return parse_recording(read_regular(path, RECORDS_MAX_BYTES))


def record_to_json(record: DeviceRecord) -> dict[str, Any]:
    """The JSON form of ``record`` (unset keys left out); :func:`record_from_json` reads it
    back unchanged."""
    out: dict[str, Any] = {
        "sys_path": record.sys_path,
        "subsystem": record.subsystem,
        "sys_name": record.sys_name,
    }
    for key in ("sys_number", "devnode", "devtype", "major", "minor", "driver", "numa_node"):
        value = getattr(record, key)
        if value is not None:
            out[key] = value
    if record.properties:
        out["properties"] = dict(record.properties)
    if record.attributes:
        out["attributes"] = dict(record.attributes)
    if record.parents:
        out["parents"] = [
            {
                k: v
                for k, v in (
                    ("sys_path", p.sys_path),
                    ("sys_name", p.sys_name),
                    ("subsystem", p.subsystem),
                    ("devtype", p.devtype),
                    ("driver", p.driver),
                    ("attributes", dict(p.attributes) or None),
                )
                if v is not None
            }
            for p in record.parents
        ]
    if not record.node_exists:
        out["node_exists"] = False
    if record.action is not None:
        out["action"] = record.action
    return out


def recording_to_json(
    records: Iterable[DeviceRecord],
    attributes: Iterable[str],
    parent_attributes: Iterable[str],
) -> bytes:
    """A JSON recording of ``records``, whose devices had ``attributes`` read and whose
    parents had ``parent_attributes`` read; :func:`parse_recording` reads it back."""
    doc = {
        "format": RECORDING_FORMAT,
        "version": RECORDING_VERSION,
        "attributes": sorted(set(attributes)),
        "parent_attributes": sorted(set(parent_attributes)),
        "records": [record_to_json(r) for r in records],
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


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
