"""Discovery on recorded udev data: matching, naming, grouping, health, specs, changes."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.cdi.validation import check_document
from cdi_gen.config.loader import load_config, parse_config
from cdi_gen.config.models import AgentConfig
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.discovery.match import glob_match, match_record, matches
from cdi_gen.model import AdvertisedDevice, DeviceRecord, ParentRecord
from cdi_gen.sources.records import record_from_json, records_from_export_db

DATA = Path(__file__).resolve().parents[1] / "data" / "udev"


@pytest.fixture(scope="module")
def vm_records() -> list[DeviceRecord]:
    return records_from_export_db((DATA / "export-db-vm.txt").read_text())


@pytest.fixture(scope="module")
def hw_records() -> list[DeviceRecord]:
    return [record_from_json(r) for r in json.loads((DATA / "hardware.json").read_text())]


def _config(*classes: dict[str, Any], vendor: str = "example.com") -> AgentConfig:
    return parse_config({"vendor": vendor, "classes": list(classes)}, "test.yaml")


def _loop(n: int, **kw: Any) -> DeviceRecord:
    return DeviceRecord(
        sys_path=f"/sys/devices/virtual/block/loop{n}",
        subsystem="block",
        sys_name=f"loop{n}",
        sys_number=str(n),
        devnode=f"/dev/loop{n}",
        devtype="disk",
        major=7,
        minor=n,
        properties={"DEVTYPE": "disk", "DEVNAME": f"/dev/loop{n}"},
        **kw,
    )


LOOP = {"name": "loop", "match": {"subsystem": "block", "kernel": "loop2[0-9][0-9]"}}


# --- matching -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("loop*", "loop0", True),
        ("loop[0-9]", "loop12", False),
        ("ttyUSB*|ttyACM*", "ttyACM3", True),
        ("ttyUSB*|ttyACM*", "ttyS0", False),
        ("[!a]x", "bx", True),
        ("*", None, False),
    ],
)
def test_glob_udev_semantics(pattern: str, value: str | None, expected: bool) -> None:
    assert glob_match(pattern, value) is expected


@given(
    st.from_regex(r"[a-z0-9*?\[\]!.-]{0,8}", fullmatch=True),
    st.from_regex(r"[a-z0-9.-]{0,8}", fullmatch=True),
)
def test_glob_agrees_with_fnmatch_and_alternatives(pattern: str, value: str) -> None:
    assert glob_match(pattern, value) == fnmatch.fnmatchcase(value, pattern)
    assert glob_match(f"{pattern}|{value}", value)


def test_driver_matches_device_or_any_parent(hw_records: list[DeviceRecord]) -> None:
    config = _config({"name": "ftdi", "match": {"subsystem": "tty", "driver": "ftdi_*"}})
    tty = next(r for r in hw_records if r.sys_name == "ttyUSB0")
    assert tty.driver is None
    assert matches(config.classes[0].match[0], tty)
    acm = next(r for r in hw_records if r.sys_name == "ttyACM0")
    assert not matches(config.classes[0].match[0], acm)


def test_parent_attributes_must_hold_on_one_device(hw_records: list[DeviceRecord]) -> None:
    tty = next(r for r in hw_records if r.sys_name == "ttyUSB0")
    same = _config(
        {"name": "ftdi", "match": {"parentAttributes": {"idVendor": "0403", "idProduct": "6001"}}}
    )
    assert matches(same.classes[0].match[0], tty)
    # 0403 is on the adapter, 0002 on the root hub: never the same device, so no match.
    mixed = _config(
        {"name": "ftdi", "match": {"parentAttributes": {"idVendor": "0403", "idProduct": "0002"}}}
    )
    assert not matches(mixed.classes[0].match[0], tty)


def test_attributes_compare_without_trailing_whitespace() -> None:
    config = _config({"name": "loop", "match": {"attributes": {"ro": "0"}}})
    assert matches(config.classes[0].match[0], _loop(200, attributes={"ro": "0\n"}))
    assert not matches(config.classes[0].match[0], _loop(200, attributes={"ro": "1"}))
    assert not matches(config.classes[0].match[0], _loop(200))


def test_only_devices_with_a_node_match() -> None:
    config = _config(LOOP)
    assert match_record(config.classes[0], dataclasses.replace(_loop(200), devnode=None)) is None
    assert match_record(config.classes[0], _loop(200)) == 0


def test_catalogue_on_recorded_vm(vm_records: list[DeviceRecord]) -> None:
    discovery = Discovery(load_config(None))
    changes = {c.class_name: c for c in discovery.replace(vm_records)}
    found = {name: [d.name for d in c.devices] for name, c in changes.items() if c.devices}
    assert found == {
        "kvm": ["kvm"],
        "tun": ["tun"],
        "fuse": ["fuse"],
        "loop": [f"loop{i}" for i in range(8)],
    }
    tun = discovery.devices("tun")[0]
    assert tun.nodes[0].host_path == "/dev/net/tun"
    assert tun.rules == ('SUBSYSTEM=="misc", KERNEL=="tun"',)


def test_catalogue_on_recorded_hardware(hw_records: list[DeviceRecord]) -> None:
    discovery = Discovery(load_config(None))
    discovery.replace(hw_records)
    fpga = discovery.devices("fpga")
    assert [d.name for d in fpga] == ["region0", "region1"]
    assert [n.host_path for n in fpga[0].nodes] == ["/dev/dfl-fme.0", "/dev/dfl-port.0"]
    assert [d.numa_node for d in fpga] == [0, 1]
    assert fpga[0].physical.endswith("/fpga_region/region0")
    gpu = discovery.devices("gpu")
    assert gpu[0].name == "0000:03:00.0"
    assert [n.host_path for n in gpu[0].nodes] == ["/dev/dri/card1", "/dev/dri/renderD128"]
    assert [d.name for d in discovery.devices("serial")] == ["ttyACM0", "ttyUSB0", "ttyUSB1"]
    assert [d.name for d in discovery.devices("xilinx-user")] == ["renderD129"]
    assert [d.name for d in discovery.devices("vfio")] == ["iommu-group-42"]
    doc = discovery.class_spec("vfio").document
    assert doc is not None
    assert doc["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/vfio/42"},
        {"path": "/dev/vfio/vfio"},
    ]
    for cls in discovery.class_names:
        doc = discovery.class_spec(cls).document
        if doc is not None:
            assert check_document(doc) == [], cls


# --- naming ------------------------------------------------------------------------------------


def test_name_from_property_and_parent_attribute(hw_records: list[DeviceRecord]) -> None:
    config = _config(
        {
            "name": "serial",
            "match": {"kernel": "ttyUSB*"},
            "deviceName": "{parent_attribute[idVendor]}-{property[ID_SERIAL_SHORT]}",
            "containerEdits": {"env": ["SERIAL_{number}={name}:{devnode}"]},
        }
    )
    discovery = Discovery(config)
    discovery.replace(hw_records)
    devices = discovery.devices("serial")
    assert [d.name for d in devices] == ["0403-A10K5ABC", "0403-A10K5XYZ"]
    assert devices[0].edits["env"] == ["SERIAL_0=0403-A10K5ABC:/dev/ttyUSB0"]


def test_missing_template_value_skips_device_with_warning(hw_records: list[DeviceRecord]) -> None:
    config = _config(
        {
            "name": "serial",
            "match": {"subsystem": "tty"},
            "deviceName": "{property[ID_SERIAL_SHORT]}",
        }
    )
    discovery = Discovery(config)
    (change,) = discovery.replace(hw_records)
    assert [d.name for d in change.devices] == ["A10K5ABC", "A10K5XYZ"]
    (warning,) = change.warnings
    assert warning.sys_path.endswith("/tty/ttyACM0")
    assert str(warning) == (
        f"class 'serial': device {warning.sys_path}: deviceName '{{property[ID_SERIAL_SHORT]}}': "
        "{property[ID_SERIAL_SHORT]}: the device has no udev property ID_SERIAL_SHORT "
        "(is /run/udev mounted?)"
    )


def test_invalid_rendered_name_skips_device(vm_records: list[DeviceRecord]) -> None:
    config = _config({"name": "misc", "match": {"subsystem": "misc"}, "deviceName": "{devname}"})
    discovery = Discovery(config)
    (change,) = discovery.replace(vm_records)
    assert "tun" not in [d.name for d in change.devices]
    assert "kvm" in [d.name for d in change.devices]
    bad = [w for w in change.warnings if "net/tun" in w.message]
    assert bad and "invalid character '/'" in bad[0].message


def test_duplicate_name_keeps_incumbent() -> None:
    config = _config({"name": "loop", "match": {"kernel": "loop*"}, "deviceName": "{devtype}"})
    discovery = Discovery(config)
    (first,) = discovery.replace([_loop(205)])
    assert [d.physical for d in first.devices] == ["/sys/devices/virtual/block/loop205"]
    # loop201 sorts first but must not take the name from the device already advertised.
    (second,) = discovery.apply([dataclasses.replace(_loop(201), action="add")])
    assert [d.physical for d in second.devices] == ["/sys/devices/virtual/block/loop205"]
    (warning,) = second.warnings
    assert "device name 'disk' is already used by /sys/devices/virtual/block/loop205" in str(
        warning
    )
    assert (second.added, second.removed, second.changed) == ((), (), ())


# --- specs -------------------------------------------------------------------------------------


def test_spec_has_node_path_only_and_minimum_version() -> None:
    config = _config({**LOOP, "containerEdits": {"env": ["LOOP_{kernel}={name}"]}})
    discovery = Discovery(config)
    discovery.replace([_loop(201), _loop(7)])
    assert discovery.class_spec("loop").document == {
        "cdiVersion": "0.3.0",
        "kind": "example.com/loop",
        "devices": [
            {
                "name": "loop201",
                "containerEdits": {
                    "env": ["LOOP_loop201=loop201"],
                    "deviceNodes": [{"path": "/dev/loop201"}],
                },
            }
        ],
    }


def test_spec_pinned_numbers_and_container_path() -> None:
    config = _config(
        {
            **LOOP,
            "node": {"pinNumbers": True, "path": "/dev/disk{number}", "permissions": "rw"},
        }
    )
    discovery = Discovery(config)
    discovery.replace([_loop(201)])
    doc = discovery.class_spec("loop").document
    assert doc is not None
    assert doc["cdiVersion"] == "0.5.0"  # hostPath
    assert doc["devices"][0]["containerEdits"]["deviceNodes"] == [
        {
            "path": "/dev/disk201",
            "hostPath": "/dev/loop201",
            "type": "b",
            "major": 7,
            "minor": 201,
            "permissions": "rw",
        }
    ]


#: A class using every edit the config offers, each optional field both set and unset.
EVERY_EDIT = {
    **LOOP,
    "node": {
        "pinNumbers": True,
        "path": "/dev/disk{number}",
        "permissions": "rw",
        "fileMode": 0o660,
        "uid": 0,
        "gid": 6,
    },
    "containerEdits": {
        "env": ["LOOP={name}", "N={number}"],
        "deviceNodes": [
            {"path": "/dev/loop-control"},
            {
                "path": "/dev/l{number}",
                "hostPath": "{devnode}",
                "type": "b",
                "major": 7,
                "minor": 0,
                "fileMode": 0o600,
                "permissions": "r",
                "uid": 1,
                "gid": 2,
            },
        ],
        "mounts": [
            {
                "hostPath": "/srv/{kernel}",
                "containerPath": "/mnt",
                "options": ["ro", "{kernel}"],
                "type": "bind",
            },
            {"hostPath": "/srv/x", "containerPath": "/x"},
        ],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": "/bin/hook",
                "args": ["hook", "{name}"],
                "env": ["A={kernel}"],
                "timeout": 5,
            },
            {"hookName": "poststop", "path": "/bin/done"},
        ],
        "additionalGids": [6, 7],
    },
}


def test_a_device_keeps_its_edits_as_the_spec_holds_them() -> None:
    """A device holds one wire dict, the very one its spec entry holds, not models and their
    dumps (1.7 MiB of the agent with 1,000 devices); its bytes are the spec models' own."""
    from cdi_gen.cdi.codec import dump_document
    from cdi_gen.cdi.spec import ContainerEdits
    from cdi_gen.discovery.spec import Verdicts, class_spec

    for cls in (LOOP, EVERY_EDIT):
        discovery = Discovery(_config(cls))
        (device,) = discovery.replace([_loop(201)])[0].devices
        assert type(device.edits) is dict
        as_models = ContainerEdits.model_validate(device.edits).to_wire()
        assert dump_document(dict(device.edits)) == dump_document(as_models)
        verdicts: Verdicts = {}
        spec = class_spec("example.com", discovery.config_of("loop"), [device], cache=verdicts)
        assert spec.document is not None
        assert spec.document["devices"][0]["containerEdits"] is device.edits


@pytest.mark.parametrize(
    ("edits", "field"),
    [
        ({"deviceNodes": [{"path": "/dev/x", "major": 2**63}]}, "deviceNodes[0].major"),
        ({"deviceNodes": [{"path": "/dev/x", "minor": 2**64}]}, "deviceNodes[0].minor"),
        ({"hooks": [{"hookName": "poststop", "path": "/x", "timeout": 2**64}]}, "hooks[0].timeout"),
    ],
)
def test_a_value_no_runtime_reads_is_refused_with_the_config(
    edits: dict[str, Any], field: str
) -> None:
    """A number beyond int64 (the runtimes' type) fails the config, naming the field,
    instead of skipping every device of the class (or, beyond 64 bits, failing its spec)."""
    from cdi_gen.errors import ConfigError

    where = f"classes[0].containerEdits.{field}"
    with pytest.raises(ConfigError, match=re.escape(where)):
        _config({**LOOP, "containerEdits": edits})


def test_spec_version_pin_too_old_leaves_the_device_out_naming_the_field() -> None:
    config = _config({**LOOP, "cdiVersion": "0.4.0", "node": {"path": "/dev/x{number}"}})
    discovery = Discovery(config)
    discovery.replace([_loop(201)])
    spec = discovery.class_spec("loop")
    assert spec.document is None
    (left,) = spec.left_out
    assert (left.device, left.reason) == ("loop201", "version")
    assert str(left) == (
        "device 'loop201' left out of the spec (version): "
        "devices['loop201'].containerEdits.deviceNodes[0].hostPath: device node hostPath "
        "needs cdiVersion 0.5.0 or newer, the target is 0.4.0"
    )


def test_no_device_no_spec() -> None:
    discovery = Discovery(_config(LOOP))
    assert discovery.replace([_loop(3)])[0].devices == ()  # loop3 is not matched
    assert discovery.class_spec("loop").document is None


# --- changes and health ------------------------------------------------------------------------


def test_apply_add_remove_change_and_ordering_lists() -> None:
    discovery = Discovery(_config(LOOP))
    (initial,) = discovery.replace([_loop(201)])
    assert initial.added == ("loop201",)
    (added,) = discovery.apply([dataclasses.replace(_loop(202), action="add")])
    assert added.added == ("loop202",) and not added.removed
    assert [d.id for d in added.before_write(initial.after_write)] == ["loop201"]
    assert [d.id for d in added.after_write] == ["loop201", "loop202"]
    removed_event = DeviceRecord(
        sys_path="/sys/devices/virtual/block/loop201",
        subsystem="block",
        sys_name="loop201",
        devnode="/dev/loop201",
        action="remove",
    )
    (removed,) = discovery.apply([removed_event])
    assert removed.removed == ("loop201",)
    assert [d.id for d in removed.before_write(added.after_write)] == ["loop202"]
    assert [d.id for d in removed.after_write] == ["loop202"]
    # An event that changes nothing the spec or kubelet sees produces no change.
    assert discovery.apply([dataclasses.replace(_loop(202), action="change")]) == []
    # One that does (node vanished) is a change, reported unhealthy.
    (gone_node,) = discovery.apply(
        [dataclasses.replace(_loop(202), action="change", node_exists=False)]
    )
    assert gone_node.changed == ("loop202",)
    assert gone_node.after_write == (
        AdvertisedDevice(
            id="loop202", healthy=False, physical="/sys/devices/virtual/block/loop202"
        ),
    )
    # Unrelated devices never touch the class.
    assert discovery.apply([dataclasses.replace(_loop(3), action="add")]) == []


def test_when_gone_unhealthy_keeps_and_recovers() -> None:
    discovery = Discovery(_config({**LOOP, "whenGone": "unhealthy"}))
    discovery.replace([_loop(201)])
    remove = DeviceRecord(
        sys_path="/sys/devices/virtual/block/loop201",
        subsystem="block",
        sys_name="loop201",
        action="remove",
    )
    (change,) = discovery.apply([remove])
    assert change.changed == ("loop201",) and not change.removed
    assert [d.healthy for d in discovery.devices("loop")] == [False]
    assert discovery.class_spec("loop").document is not None  # the entry stays while advertised
    (back,) = discovery.apply([dataclasses.replace(_loop(201), action="add")])
    assert back.changed == ("loop201",)
    assert [d.healthy for d in discovery.devices("loop")] == [True]


def test_numa_from_parents_and_grouping_by_property() -> None:
    records = [
        DeviceRecord(
            sys_path=f"/sys/devices/x/hidraw/hidraw{i}",
            subsystem="hidraw",
            sys_name=f"hidraw{i}",
            devnode=f"/dev/hidraw{i}",
            properties={"ID_SERIAL": "key-1" if i < 2 else "key-2"},
            numa_node=None if i else 1,
            parents=(ParentRecord(sys_path="/sys/devices/x", sys_name="x"),),
        )
        for i in range(3)
    ]
    config = _config(
        {
            "name": "hid",
            "match": {"subsystem": "hidraw"},
            "group": {"by": "property", "property": "ID_SERIAL"},
            "deviceName": "{group}",
            "containerEdits": {"env": ["HID_NUMA={numa}"]},
        }
    )
    discovery = Discovery(config)
    discovery.replace(records)
    devices = discovery.devices("hid")
    assert [(d.name, len(d.nodes), d.numa_node) for d in devices] == [
        ("key-1", 2, 1),
        ("key-2", 1, None),
    ]
    assert devices[0].edits["env"] == ["HID_NUMA=1"]
    assert devices[1].edits["env"] == ["HID_NUMA="]


def test_selected_classes_and_prefilter() -> None:
    discovery = Discovery(load_config(None), ["loop", "tun"])
    assert discovery.class_names == ("loop", "tun")
    assert discovery.subsystems == frozenset({"block", "misc"})
    assert discovery.interest("block", "loop3")
    assert not discovery.interest("block", "vda")
    with pytest.raises(Exception, match="unknown class 'nope'"):
        Discovery(load_config(None), ["nope"])
