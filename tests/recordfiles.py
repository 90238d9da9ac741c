"""Records files for tests: the JSON form of a record, as ``--records`` reads it.

cdi-gen only reads records files (:mod:`cdi_gen.sources.records`); the tests write them.
"""

from __future__ import annotations

from typing import Any

from cdi_gen.model import DeviceRecord


def record_to_json(record: DeviceRecord) -> dict[str, Any]:
    """A JSON-ready dict; :func:`~cdi_gen.sources.records.record_from_json` reads it back
    unchanged."""
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
