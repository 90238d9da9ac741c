"""Hostile udev values on recorded hardware: a value that would escape a path, inject an
environment line or bloat the spec skips its device with a warning; the others go on.
``validate`` flags the same content in hand-written specs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from cdi_gen.cdi.codec import load_spec
from cdi_gen.cdi.validation import check_document
from cdi_gen.config.loader import parse_config
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.errors import SpecError
from cdi_gen.model import DeviceRecord, ParentRecord
from cdi_gen.sources.records import record_from_json

DATA = Path(__file__).resolve().parents[1] / "data" / "udev"

# The two FTDI adapters of the recorded hardware; ttyUSB0 is the one made hostile.
TTY0 = "/sys/devices/pci0000:00/0000:00:14.0/usb1/1-2/1-2:1.0/ttyUSB0/tty/ttyUSB0"


@pytest.fixture(scope="module")
def hw_records() -> list[DeviceRecord]:
    return [record_from_json(r) for r in json.loads((DATA / "hardware.json").read_text())]


def _serial_class(**edits: Any) -> dict[str, Any]:
    return {
        "vendor": "example.com",
        "classes": [
            {
                "name": "serial",
                "match": {"kernel": "ttyUSB*"},
                "deviceName": "{kernel}",
                "containerEdits": {
                    "env": ["SERIAL={property[ID_SERIAL_SHORT]}"],
                    "mounts": [
                        {
                            "hostPath": "/var/lib/fw/{parent_attribute[serial]}",
                            "containerPath": "/fw",
                            "options": ["ro", "bind"],
                        }
                    ],
                    **edits,
                },
            }
        ],
    }


def _hostile(
    records: list[DeviceRecord], *, serial: str | None = None, prop: str | None = None
) -> list[DeviceRecord]:
    """The recorded records with ttyUSB0's USB serial attribute and/or property replaced."""
    out = []
    for record in records:
        r = record
        if r.sys_path == TTY0:
            if prop is not None:
                r = dataclasses.replace(r, properties={**r.properties, "ID_SERIAL_SHORT": prop})
            if serial is not None:
                parents = tuple(
                    dataclasses.replace(p, attributes={**p.attributes, "serial": serial})
                    if "serial" in p.attributes
                    else p
                    for p in r.parents
                )
                r = dataclasses.replace(r, parents=parents)
        out.append(r)
    return out


def _discover(records: list[DeviceRecord]) -> tuple[list[str], list[str]]:
    discovery = Discovery(parse_config(_serial_class(), "test.yaml"))
    (change,) = discovery.replace(records)
    doc = discovery.class_spec("serial").document
    assert doc is not None and check_document(doc) == []
    return [d.name for d in change.devices], [str(w) for w in change.warnings]


def test_recorded_adapters_are_both_found(hw_records: list[DeviceRecord]) -> None:
    names, warnings = _discover(hw_records)
    assert names == ["ttyUSB0", "ttyUSB1"]
    assert warnings == []


@pytest.mark.parametrize(
    ("serial", "prop", "field", "shown"),
    [
        # A path component that climbs out of the template's folder: /var/lib/fw/../../../etc.
        ("../../../etc", None, "mounts[0].hostPath", "'/var/lib/fw/../../../etc'"),
        ("..", None, "mounts[0].hostPath", "'/var/lib/fw/..'"),
        # A second environment line smuggled in through a newline.
        (None, "x\nLD_PRELOAD=/tmp/evil.so", "{property[ID_SERIAL_SHORT]}", r"'x\nLD_PRELOAD"),
        # NUL ends the string where the runtime's C code reads it.
        (None, "A10K\x00B", "{property[ID_SERIAL_SHORT]}", r"'A10K\x00B'"),
        (None, "A10K\x1b[2J", "{property[ID_SERIAL_SHORT]}", r"'A10K\x1b[2J'"),
        (None, "A10K\x7f", "{property[ID_SERIAL_SHORT]}", r"'A10K\x7f'"),
        ("A\rB", None, "{parent_attribute[serial]}", r"'A\rB'"),
        # 5,000 bytes: no serial is that long; the value is truncated in the warning.
        (None, "S" * 5000, "{property[ID_SERIAL_SHORT]}", "'SSSS"),
    ],
)
def test_hostile_value_skips_only_its_device(
    hw_records: list[DeviceRecord], serial: str | None, prop: str | None, field: str, shown: str
) -> None:
    names, warnings = _discover(_hostile(hw_records, serial=serial, prop=prop))
    assert names == ["ttyUSB1"]
    (warning,) = warnings
    assert TTY0 in warning
    assert field in warning
    assert shown in warning
    assert "device skipped" in warning
    # The value is quoted truncated, so a huge value makes a bounded log line.
    assert len(warning) < 600, warning


def test_value_at_the_limit_is_kept(hw_records: list[DeviceRecord]) -> None:
    from cdi_gen.discovery.render import MAX_VALUE_BYTES

    names, warnings = _discover(_hostile(hw_records, prop="S" * MAX_VALUE_BYTES))
    assert names == ["ttyUSB0", "ttyUSB1"] and warnings == []
    names, warnings = _discover(_hostile(hw_records, prop="S" * (MAX_VALUE_BYTES + 1)))
    assert names == ["ttyUSB1"]
    assert f"longer than {MAX_VALUE_BYTES} bytes" in warnings[0]


def test_value_with_dots_inside_a_component_is_fine(hw_records: list[DeviceRecord]) -> None:
    names, warnings = _discover(_hostile(hw_records, serial="A..B.C", prop="v1.2"))
    assert names == ["ttyUSB0", "ttyUSB1"] and warnings == []


def test_loop_backing_file_with_a_newline_is_skipped() -> None:
    config = parse_config(
        {
            "vendor": "example.com",
            "classes": [
                {
                    "name": "loop",
                    "match": {"kernel": "loop*"},
                    "deviceName": "{kernel}",
                    "containerEdits": {"env": ["BACKING={attribute[loop/backing_file]}"]},
                }
            ],
        },
        "test.yaml",
    )

    def loop(n: int, backing: str) -> DeviceRecord:
        return DeviceRecord(
            sys_path=f"/sys/devices/virtual/block/loop{n}",
            subsystem="block",
            sys_name=f"loop{n}",
            devnode=f"/dev/loop{n}",
            attributes={"loop/backing_file": backing},
            parents=(ParentRecord("/sys/devices/virtual/block", "block"),),
        )

    discovery = Discovery(config)
    (change,) = discovery.replace([loop(1, "/srv/ok.img"), loop(2, "/srv/a\nB=1")])
    assert [d.name for d in change.devices] == ["loop1"]
    (warning,) = change.warnings
    assert "loop2" in warning.sys_path
    assert "{attribute[loop/backing_file]}" in warning.message


# --- validate: the same rules on hand-written specs ---------------------------------------------


def _doc(edits: dict[str, Any]) -> bytes:
    return orjson.dumps(
        {
            "cdiVersion": "0.5.0",
            "kind": "example.com/fw",
            "devices": [{"name": "fw0", "containerEdits": edits}],
        }
    )


@pytest.mark.parametrize(
    ("edits", "path", "message"),
    [
        ({"env": ["A=x\nLD_PRELOAD=/e.so"]}, "env[0]", "control character"),
        ({"env": ["A=x\x00y"]}, "env[0]", "control character"),
        ({"env": ["A=x\ry"]}, "env[0]", "control character"),
        (
            {"mounts": [{"hostPath": "/var/lib/fw/../../etc", "containerPath": "/fw"}]},
            "mounts[0].hostPath",
            "'..' component",
        ),
        (
            {"mounts": [{"hostPath": "/fw", "containerPath": "/a/.."}]},
            "mounts[0].containerPath",
            "'..' component",
        ),
        ({"deviceNodes": [{"path": "/dev/../etc/x"}]}, "deviceNodes[0].path", "'..' component"),
        (
            {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/../../x"}]},
            "deviceNodes[0].hostPath",
            "'..' component",
        ),
        ({"hooks": [{"hookName": "prestart", "path": "/bin/../h"}]}, "hooks[0].path", "'..'"),
        ({"deviceNodes": [{"path": "/dev/a\nb"}]}, "deviceNodes[0].path", "control character"),
        (
            {"deviceNodes": [{"path": "/dev/" + "x" * 300}]},
            "deviceNodes[0].path",
            "component longer than 255 bytes",
        ),
        (
            {"deviceNodes": [{"path": "/dev" + "/x" * 2100}]},
            "deviceNodes[0].path",
            "longer than 4095 bytes",
        ),
    ],
)
def test_validate_flags_injected_content(edits: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(_doc(edits), source="spec.json")
    lines = str(info.value).splitlines()
    assert any(f"devices[0].containerEdits.{path}" in ln and message in ln for ln in lines), lines
    assert all(len(line) < 400 for line in lines), lines


def test_validate_keeps_ordinary_values() -> None:
    load_spec(
        _doc(
            {
                "env": ["A=tab\there", "PATH=/usr/bin:/bin", 'J={"k": 1}'],
                "mounts": [{"hostPath": "/var/lib/..data/x", "containerPath": "/a/b..c"}],
                "deviceNodes": [{"path": "/dev/x.y"}],
            }
        )
    )


def test_cdi_gen_validate_flags_them(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "bad.json"
    bad.write_bytes(
        _doc(
            {
                "env": ["SERIAL=x\nLD_PRELOAD=/tmp/evil.so"],
                "mounts": [{"hostPath": "/var/lib/fw/../../../etc", "containerPath": "/fw"}],
            }
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "cdi_gen", "validate", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, lines
    assert f"{bad}: devices[0].containerEdits.env[0]: " in lines[0]
    assert "control character '\\n'" in lines[0]
    assert f"{bad}: devices[0].containerEdits.mounts[0].hostPath: " in lines[1]
    assert "'..' component" in lines[1]
