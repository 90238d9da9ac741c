"""udev links on recorded data: a ``devnode`` pattern that names a link (/dev/serial/by-id/...)
matches its device, ``{devlink}`` and ``{devlink_name}`` render it, and a link pattern that
matches nothing gets a hint naming the class, the pattern and the rule."""

from __future__ import annotations

import dataclasses
import glob
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.cli.main import main
from cdi_gen.config.loader import parse_config
from cdi_gen.config.models import AgentConfig
from cdi_gen.config.templates import DEVICE_NAME_FIELDS, EDIT_FIELDS, parse_template
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.discovery.links import chosen_link, device_links, link_match
from cdi_gen.discovery.match import link_hints, match_record
from cdi_gen.model import DeviceRecord
from cdi_gen.sources.records import records_from_export_db

DATA = Path(__file__).resolve().parents[1] / "data" / "udev"
SERIAL = DATA / "export-db-serial.txt"
FTDI_ID = "/dev/serial/by-id/usb-FTDI_FT232R_USB_UART_A10K5ABC-if00-port0"
FTDI_PATH = "/dev/serial/by-path/pci-0000:00:14.0-usb-0:2:1.0-port0"
ARDUINO_ID = "/dev/serial/by-id/usb-Arduino__www.arduino.cc__0043_7523230313535161C0B1-if00"


@pytest.fixture(scope="module")
def records() -> list[DeviceRecord]:
    return records_from_export_db(SERIAL.read_text())


def _record(records: list[DeviceRecord], name: str) -> DeviceRecord:
    return next(r for r in records if r.sys_name == name and r.subsystem == "tty")


def _config(*classes: dict[str, Any]) -> AgentConfig:
    return parse_config({"vendor": "example.com", "classes": list(classes)}, "test.yaml")


def _discover(records: list[DeviceRecord], **cls: Any) -> Discovery:
    discovery = Discovery(_config({"name": "serial", **cls}))
    discovery.replace(records)
    return discovery


def _without_links(record: DeviceRecord) -> DeviceRecord:
    props = {k: v for k, v in record.properties.items() if k != "DEVLINKS"}
    return dataclasses.replace(record, properties=props)


# --- records ------------------------------------------------------------------------------------


def test_export_db_records_keep_their_links(records: list[DeviceRecord]) -> None:
    ftdi = _record(records, "ttyUSB0")
    assert device_links(ftdi) == (
        FTDI_PATH,
        FTDI_ID,
        "/dev/serial/by-path/pci-0000:00:14.0-usbv2-0:2:1.0-port0",
    )
    assert device_links(_record(records, "ttyS0")) == ()


def test_export_db_links_given_only_as_s_lines_become_devlinks() -> None:
    text = (
        "P: /devices/pnp0/00:01/tty/ttyUSB7\nM: ttyUSB7\nU: tty\nN: ttyUSB7\n"
        "S: serial/by-id/usb-FTDI_X-if00-port0\nS: serial/by-path/pci-0:1-port0\n"
        "E: SUBSYSTEM=tty\nE: DEVNAME=/dev/ttyUSB7\n"
    )
    (record,) = records_from_export_db(text)
    assert record.properties["DEVLINKS"] == (
        "/dev/serial/by-id/usb-FTDI_X-if00-port0 /dev/serial/by-path/pci-0:1-port0"
    )


def test_links_outside_dev_or_with_dot_dot_are_no_links() -> None:
    record = DeviceRecord(
        sys_path="/sys/x",
        subsystem="tty",
        sys_name="x",
        devnode="/dev/x",
        properties={
            "DEVLINKS": "/etc/shadow /dev/serial/../../etc/shadow /dev//x /dev/./x /dev/serial/ok"
        },
    )
    assert device_links(record) == ("/dev/serial/ok",)


#: Link components as udev writes them, and glob characters, which a pattern must escape.
_COMPONENT = st.text(st.sampled_from("abcAZ019_.:+-@=#*?[]"), min_size=1, max_size=12).filter(
    lambda c: c not in (".", "..")
)


@given(st.lists(_COMPONENT, min_size=1, max_size=5, unique=True))
def test_devlinks_round_trip(names: list[str]) -> None:
    links = [f"/dev/serial/by-id/{n}" for n in names]
    record = DeviceRecord(
        sys_path="/sys/x", subsystem="tty", sys_name="x", properties={"DEVLINKS": " ".join(links)}
    )
    assert device_links(record) == tuple(links)


# --- matching -----------------------------------------------------------------------------------


def test_devnode_pattern_matches_a_by_id_link(records: list[DeviceRecord]) -> None:
    discovery = _discover(records, match={"devnode": "/dev/serial/by-id/usb-FTDI*"})
    (device,) = discovery.devices("serial")
    assert device.name == "ttyUSB0"
    assert [(n.host_path, n.container_path) for n in device.nodes] == [
        ("/dev/ttyUSB0", "/dev/ttyUSB0")
    ]
    assert discovery.warnings("serial") == ()


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        # Node patterns keep matching only nodes: "*" does not reach into link folders.
        ("/dev/s*", []),
        ("/dev/*", ["ttyACM0", "ttyS0", "ttyUSB0"]),
        ("/dev/serial/*", []),
        ("/dev/serial/*/*", ["ttyACM0", "ttyUSB0"]),
        ("/dev/serial/by-path/*-usb-0:3:1.0", ["ttyACM0"]),
        ("/dev/ttyS*|/dev/serial/by-id/usb-Arduino*", ["ttyACM0", "ttyS0"]),
    ],
)
def test_link_globs_stay_within_a_folder(
    records: list[DeviceRecord], pattern: str, names: list[str]
) -> None:
    config = _config({"name": "serial", "match": {"subsystem": "tty", "devnode": pattern}})
    matched = [r.sys_name for r in records if match_record(config.classes[0], r) is not None]
    assert sorted(matched) == names


@given(st.lists(_COMPONENT, min_size=1, max_size=4), st.data())
def test_link_glob_round_trip(parts: list[str], data: st.DataObject) -> None:
    link = "/dev/" + "/".join(parts)
    escaped = ["dev", *(glob.escape(p) for p in parts)]
    assert link_match("/" + "/".join(escaped), link)
    i = data.draw(st.integers(1, len(escaped) - 1))
    starred = [*escaped[:i], "*", *escaped[i + 1 :]]
    assert link_match("/" + "/".join(starred), link)
    # One "*" never stands for two levels, nor for a level that is not there.
    if i + 1 < len(escaped):
        assert not link_match("/" + "/".join([*escaped[:i], "*", *escaped[i + 2 :]]), link)
    assert not link_match("/" + "/".join([*escaped, "*"]), link)


# --- templates ----------------------------------------------------------------------------------


def test_devlink_templates_name_the_device_and_its_container_path(
    records: list[DeviceRecord],
) -> None:
    discovery = _discover(
        records,
        match={"devnode": "/dev/serial/by-id/usb-FTDI*"},
        deviceName="{devlink_name}",
        node={"path": "{devlink}"},
        containerEdits={"env": ["SERIAL_PORT={devlink}"]},
    )
    (device,) = discovery.devices("serial")
    assert device.name == "usb-FTDI_FT232R_USB_UART_A10K5ABC-if00-port0"
    assert device.edits == {
        "env": [f"SERIAL_PORT={FTDI_ID}"],
        "deviceNodes": [{"path": FTDI_ID, "hostPath": "/dev/ttyUSB0"}],
    }


def test_devlink_is_the_link_the_rule_matched_else_the_by_id_one(
    records: list[DeviceRecord],
) -> None:
    ftdi = _record(records, "ttyUSB0")
    # DEVLINKS lists a by-path link first; the rule's pattern picks, then by-id.
    assert chosen_link(ftdi, "/dev/serial/by-path/*-usb-0:2:1.0-port0") == FTDI_PATH
    assert chosen_link(ftdi, "/dev/ttyUSB*") == FTDI_ID
    assert chosen_link(ftdi, None) == FTDI_ID
    assert chosen_link(_record(records, "ttyS0"), None) is None
    discovery = _discover(
        records,
        match=[{"kernel": "ttyUSB*"}, {"devnode": "/dev/serial/by-path/*-usb-0:3:1.0"}],
        node={"path": "{devlink}"},
    )
    assert [d.nodes[0].container_path for d in discovery.devices("serial")] == [
        "/dev/serial/by-path/pci-0000:00:14.0-usb-0:3:1.0",
        FTDI_ID,
    ]


def test_devlink_without_links_skips_the_device_saying_why(records: list[DeviceRecord]) -> None:
    discovery = _discover(records, match={"kernel": "ttyS*"}, node={"path": "{devlink}"})
    assert discovery.devices("serial") == ()
    (warning,) = discovery.warnings("serial")
    assert "{devlink}: the device has no udev link (DEVLINKS; is /run/udev mounted?)" in str(
        warning
    )


def test_devlink_with_a_control_character_is_refused(records: list[DeviceRecord]) -> None:
    ftdi = _record(records, "ttyUSB0")
    evil = dataclasses.replace(
        ftdi, properties={**ftdi.properties, "DEVLINKS": "/dev/serial/by-id/usb-\x1b[2J-port0"}
    )
    discovery = _discover(
        [evil], match={"devnode": "/dev/serial/by-id/*"}, node={"path": "{devlink}"}
    )
    assert discovery.devices("serial") == ()
    (warning,) = discovery.warnings("serial")
    assert "has control character '\\x1b'" in str(warning)


def test_devlink_is_an_edit_field_and_only_its_name_a_name_field() -> None:
    assert {"devlink", "devlink_name"} <= EDIT_FIELDS
    parse_template("{devlink_name}", DEVICE_NAME_FIELDS)
    with pytest.raises(ValueError, match=r"unknown field \{devlink\}"):
        parse_template("{devlink}", DEVICE_NAME_FIELDS)


# --- the hint -----------------------------------------------------------------------------------


def _hints(records: list[DeviceRecord], *rules: dict[str, Any]) -> list[str]:
    (cls,) = _config({"name": "serial", "match": list(rules)}).classes
    return link_hints(cls, records)


def test_hint_when_no_record_has_links(records: list[DeviceRecord]) -> None:
    bare = [_without_links(r) for r in records]
    assert _hints(bare, {"subsystem": "tty", "devnode": "/dev/serial/by-id/usb-FTDI*"}) == [
        "class 'serial': devnode '/dev/serial/by-id/usb-FTDI*' (rule SUBSYSTEM==\"tty\", "
        'DEVNAME=="/dev/serial/by-id/usb-FTDI*") names a udev link, and no device read here '
        "has udev links (DEVLINKS come from udevd's database: is /run/udev mounted? the "
        "kernel source has none)"
    ]


def test_hint_when_a_star_would_have_to_cross_a_folder(records: list[DeviceRecord]) -> None:
    (hint,) = _hints(records, {"devnode": "/dev/serial/*FTDI*"})
    assert hint.startswith("class 'serial': devnode '/dev/serial/*FTDI*' (rule DEVNAME==")
    assert hint.endswith(
        f"names a udev link, and it matches link {FTDI_ID!r} only if '*' crosses '/': in a "
        "link path each '*' stays within one folder, so write one per level"
    )


def test_hint_names_the_links_seen_in_the_folder(records: list[DeviceRecord]) -> None:
    (hint,) = _hints(records, {"devnode": "/dev/serial/by-id/usb-Prolific*"})
    assert hint.endswith(
        f"no link of the devices read matches it; links seen: {ARDUINO_ID!r}, {FTDI_ID!r}"
    )


def test_hint_when_the_link_matches_but_another_condition_does_not(
    records: list[DeviceRecord],
) -> None:
    (hint,) = _hints(records, {"devnode": "/dev/serial/by-id/usb-FTDI*", "driver": "cdc_acm"})
    assert hint.endswith(f"the device of link {FTDI_ID!r} fails the rule's other conditions")


@pytest.mark.parametrize(
    "rule",
    [
        {"devnode": "/dev/ttyUSB9"},  # a node pattern: no link involved
        {"devnode": "/dev/serial/by-id/usb-FTDI*"},  # it matches
        {"kernel": "ttyUSB9"},  # no devnode at all
    ],
)
def test_no_hint(records: list[DeviceRecord], rule: dict[str, Any]) -> None:
    assert _hints(records, rule) == []


# --- end to end ---------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_discover_and_render_an_ftdi_adapter_by_its_by_id_link(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "vendor: example.com\nclasses:\n"
        "  - name: ftdi\n"
        '    match: {devnode: "/dev/serial/by-id/usb-FTDI*"}\n'
        '    deviceName: "{devlink_name}"\n'
        '    node: {path: "{devlink}"}\n'
        "  - name: prolific\n"
        '    match: {subsystem: tty, devnode: "/dev/serial/by-id/usb-Prolific*"}\n'
    )
    code, out, err = _cli(capsys, "discover", "--records", str(SERIAL), "--config", str(config))
    assert code == 0
    assert out.splitlines() == [
        "example.com/ftdi: 1 device",
        "  usb-FTDI_FT232R_USB_UART_A10K5ABC-if00-port0  /dev/ttyUSB0(188:0)  numa=-  "
        '[DEVNAME=="/dev/serial/by-id/usb-FTDI*"]',
        "example.com/prolific: no device",
    ]
    assert err == (
        "hint: class 'prolific': devnode '/dev/serial/by-id/usb-Prolific*' (rule "
        'SUBSYSTEM=="tty", DEVNAME=="/dev/serial/by-id/usb-Prolific*") names a udev link, and '
        f"no link of the devices read matches it; links seen: {ARDUINO_ID!r}, {FTDI_ID!r}\n"
    )
    code, out, err = _cli(
        capsys, "render", "--records", str(SERIAL), "--config", str(config), "--class", "ftdi"
    )
    assert (code, err) == (0, "")
    doc = orjson.loads(out)
    assert doc["devices"] == [
        {
            "name": "usb-FTDI_FT232R_USB_UART_A10K5ABC-if00-port0",
            "containerEdits": {"deviceNodes": [{"path": FTDI_ID, "hostPath": "/dev/ttyUSB0"}]},
        }
    ]
    code, out, err = _cli(
        capsys, "render", "--records", str(SERIAL), "--config", str(config), "--class", "prolific"
    )
    assert (code, out) == (1, "")
    assert err.splitlines()[0].startswith("hint: class 'prolific': devnode ")
    assert err.splitlines()[1].startswith("error: class 'prolific' (example.com/prolific) has no")
