"""Composite classes (issue 56): a group's whole and its parts in one DRA pool, kept apart by
counters; the pool's layout within the API's limits; the parts alone where counters are not
kept; the config's refusals."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdi_gen.cli.main import main
from cdi_gen.config.loader import parse_config
from cdi_gen.config.models import AgentConfig
from cdi_gen.config.settings import Settings
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.dra.driver.claimcheck import overlapping
from cdi_gen.dra.driver.poolentries import PoolEntries, parts_alone, pool_devices
from cdi_gen.dra.plugin.slices import MAX_PARTS, build_slices
from cdi_gen.errors import ConfigError
from cdi_gen.model import DeviceRecord, ParentRecord, PoolDevice
from tests.slicerules import pool_problems

DRIVER = "example.com"
DISK = {
    "name": "disk",
    "match": {"subsystem": "block", "kernel": "loop2*"},
    "group": {"by": "parent", "subsystem": "block", "offer": "both"},
    "deviceName": "{group}",
    "api": "dra",
}


def _disk(n: int) -> DeviceRecord:
    return DeviceRecord(
        sys_path=f"/sys/devices/virtual/block/loop{n}",
        subsystem="block",
        sys_name=f"loop{n}",
        sys_number=str(n),
        devnode=f"/dev/loop{n}",
        devtype="disk",
        major=7,
        minor=n,
    )


def _partition(n: int, p: int) -> DeviceRecord:
    disk = _disk(n)
    return DeviceRecord(
        sys_path=f"{disk.sys_path}/loop{n}p{p}",
        subsystem="block",
        sys_name=f"loop{n}p{p}",
        sys_number=str(p),
        devnode=f"/dev/loop{n}p{p}",
        devtype="partition",
        major=259,
        minor=n * 16 + p,
        parents=(ParentRecord(disk.sys_path, disk.sys_name, subsystem="block", devtype="disk"),),
    )


def _config(cls: Mapping[str, Any] = DISK) -> AgentConfig:
    return parse_config({"vendor": DRIVER, "classes": [dict(cls)]}, "test.yaml")


def _pool(config: AgentConfig, records: Sequence[DeviceRecord]) -> list[PoolDevice]:
    cls = config.classes[0]
    (change,) = Discovery(config).replace(list(records))
    by_name = {d.name: d for d in change.devices}
    return pool_devices(config.vendor, cls, change.after_write, by_name, classes=config.class_names)


def _records(disks: int, parts: int, first: int = 200) -> list[DeviceRecord]:
    out = []
    for n in range(first, first + disks):
        out.append(_disk(n))
        out += [_partition(n, p) for p in range(1, parts + 1)]
    return out


# -- the scheduler's counting, as Kubernetes' allocator does it -----------------------------


def _counters(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Decimal]:
    return {
        (cs["name"], c): Decimal(v["value"])
        for s in slices
        for cs in s["spec"].get("sharedCounters") or ()
        for c, v in cs["counters"].items()
    }


def _consumption(device: Mapping[str, Any]) -> dict[tuple[str, str], Decimal]:
    out: dict[tuple[str, str], Decimal] = {}
    for use in device.get("consumesCounters") or ():
        for c, v in use["counters"].items():
            out[use["counterSet"], c] = out.get((use["counterSet"], c), Decimal(0)) + Decimal(
                v["value"]
            )
    return out


def allocatable(slices: Sequence[Mapping[str, Any]], allocated: Iterable[str], name: str) -> bool:
    """Whether the scheduler may give device ``name`` while ``allocated`` are held: a pool
    naming a counter it lacks is invalid (nothing of it is allocated); otherwise the counters
    left after the allocated devices' consumption must cover the device's."""
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or ()}
    left = _counters(slices)
    if any(key not in left for d in devices.values() for key in _consumption(d)):
        return False
    if name not in devices:
        return False
    for held in allocated:
        for key, value in _consumption(devices.get(held, {})).items():
            left[key] -= value
    return all(left[key] >= value for key, value in _consumption(devices[name]).items())


def _slices(devices: Sequence[PoolDevice], generation: int = 1) -> list[dict[str, Any]]:
    return build_slices(DRIVER, "node-1", devices, generation, node_uid=None)


# -- discovery: the whole and its parts, each with exactly its nodes ------------------------


def test_the_whole_holds_every_node_and_each_part_its_own() -> None:
    config = _config()
    discovery = Discovery(config)
    discovery.replace(_records(1, 2))
    devices = {d.name: d for d in discovery.devices("disk")}
    assert {n: [i.host_path for i in d.nodes] for n, d in devices.items()} == {
        "loop200": ["/dev/loop200", "/dev/loop200p1", "/dev/loop200p2"],
        "loop200p1": ["/dev/loop200p1"],
        "loop200p2": ["/dev/loop200p2"],
    }
    assert {n: d.part for n, d in devices.items()} == {
        "loop200": False,
        "loop200p1": True,
        "loop200p2": True,
    }
    assert {d.composite for d in devices.values()} == {"/sys/devices/virtual/block/loop200"}


@pytest.mark.parametrize(
    ("offer", "names"),
    [
        ("whole", {"loop200"}),
        # The disk's own node is in the whole alone: never a part beside the partitions.
        ("parts", {"loop200p1", "loop200p2"}),
        ("both", {"loop200", "loop200p1", "loop200p2"}),
    ],
)
def test_what_each_offer_publishes(offer: str, names: set[str]) -> None:
    config = _config({**DISK, "group": {**DISK["group"], "offer": offer}})  # type: ignore[dict-item]
    discovery = Discovery(config)
    discovery.replace(_records(1, 2))
    devices = discovery.devices("disk")
    assert {d.name for d in devices} == names
    assert all(not d.composite for d in devices) or offer == "both"


def test_parts_are_named_by_part_name_and_the_pool_tells_whole_from_part() -> None:
    group = {**DISK["group"], "partName": "{group}-part{number}"}  # type: ignore[dict-item]
    config = _config({**DISK, "group": group})
    pool = {d.name: d for d in _pool(config, _records(1, 2))}
    assert set(pool) == {"disk-loop200", "disk-loop200-part1", "disk-loop200-part2"}
    assert {n: d.attributes["part"] for n, d in pool.items()} == {
        "disk-loop200": False,
        "disk-loop200-part1": True,
        "disk-loop200-part2": True,
    }


def test_a_serial_adapter_groups_its_ports_by_a_property() -> None:
    def tty(n: int) -> DeviceRecord:
        return DeviceRecord(
            sys_path=f"/sys/devices/pci0000:00/usb1/1-1/1-1:1.{n}/ttyUSB{n}/tty/ttyUSB{n}",
            subsystem="tty",
            sys_name=f"ttyUSB{n}",
            sys_number=str(n),
            devnode=f"/dev/ttyUSB{n}",
            major=188,
            minor=n,
            properties={"ID_SERIAL": "FTDI_Quad_RS232-HS_FT4ABC", "ID_USB_INTERFACE_NUM": f"0{n}"},
        )

    config = _config(
        {
            "name": "serial",
            "match": {"subsystem": "tty", "kernel": "ttyUSB*"},
            "group": {"by": "property", "property": "ID_SERIAL", "offer": "both"},
            "deviceName": "{group}",
            "api": "dra",
        }
    )
    pool = _pool(config, [tty(n) for n in range(4)])
    assert {d.cdi_name: d.part for d in pool} == {
        "example.com/serial=FTDI_Quad_RS232-HS_FT4ABC": False,
        **{f"example.com/serial=ttyUSB{n}": True for n in range(4)},
    }
    whole = [d for d in pool if not d.part]
    assert len(whole) == 1 and len(pool) == 5
    slices = _slices(pool)
    assert pool_problems(slices) == []
    parts = [d.name for d in pool if d.part]
    assert not allocatable(slices, [parts[0]], whole[0].name)
    assert allocatable(slices, parts[:3], parts[3])


# -- the pool: counters that keep the whole and its parts apart -----------------------------


def test_the_whole_excludes_every_part_and_parts_are_independent() -> None:
    pool = _pool(_config(), _records(1, 3))
    slices = _slices(pool)
    assert pool_problems(slices) == []
    whole, p1, p2, p3 = "disk-loop200", "disk-loop200p1", "disk-loop200p2", "disk-loop200p3"
    # Devices and counter sets never share a slice.
    assert all(not (s["spec"].get("devices") and s["spec"].get("sharedCounters")) for s in slices)
    (counter_set,) = [cs for s in slices for cs in s["spec"].get("sharedCounters") or ()]
    assert counter_set["counters"] == {p: {"value": "1"} for p in (p1, p2, p3)}
    assert allocatable(slices, [], whole)
    for part in (p1, p2, p3):
        assert not allocatable(slices, [part], whole), part
        assert not allocatable(slices, [whole], part), part
    assert allocatable(slices, [p1, p2], p3)
    assert not allocatable(slices, [p1], p1)


def test_a_disk_without_partitions_is_a_plain_device() -> None:
    pool = _pool(_config(), _records(1, 0))
    (slice_,) = _slices(pool)
    assert [d["name"] for d in slice_["spec"]["devices"]] == ["disk-loop200"]
    assert "consumesCounters" not in slice_["spec"]["devices"][0]


def test_a_fleet_of_disks_is_split_within_every_limit() -> None:
    # 100 disks of 8 partitions: 900 devices that consume counters (64 a slice) and 100
    # counter sets (8 a slice), which the API server's rules accept.
    pool = _pool(_config(), _records(100, 8))
    slices = _slices(pool)
    assert pool_problems(slices) == []
    devices = [d for s in slices for d in s["spec"].get("devices") or ()]
    sets = [cs for s in slices for cs in s["spec"].get("sharedCounters") or ()]
    assert len(devices) == 900 and len(sets) == 100
    assert max(len(s["spec"].get("devices") or ()) for s in slices) == 64
    assert max(len(s["spec"].get("sharedCounters") or ()) for s in slices) == 8
    assert len(slices) == 15 + 13


def test_a_whole_counts_at_most_64_parts_and_the_rest_are_left_out() -> None:
    records = [_disk(200), *(_partition(200, p) for p in range(1, 71))]
    pool = _pool(_config(), records)
    slices = _slices(pool)
    assert pool_problems(slices) == []
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or ()}
    assert len(devices) == 1 + MAX_PARTS
    whole = devices["disk-loop200"]
    assert [len(u["counters"]) for u in whole["consumesCounters"]] == [32, 32]
    # Every part offered excludes the whole; none is offered without its counter.
    for name, device in devices.items():
        if name != "disk-loop200":
            assert not allocatable(list(slices), [name], "disk-loop200")
            assert device["consumesCounters"]


@pytest.mark.parametrize("change", ["added", "removed"])
def test_any_order_of_slice_writes_never_frees_the_whole_beside_a_held_part(change: str) -> None:
    # A partition comes or goes while partition 1 is allocated: whichever slices the API
    # server holds from before and after (the publisher writes one at a time), the whole is
    # never allocatable beside the held part.
    config = _config()
    before = _slices(_pool(config, _records(1, 2 if change == "added" else 3)), 1)
    after = _slices(_pool(config, _records(1, 3 if change == "added" else 2)), 1)
    held = "disk-loop200p1"
    for old_devices, old_counters in itertools.product([True, False], repeat=2):
        mixed = [
            s
            for source, devices in ((before, True), (after, False))
            for s in source
            if (bool(s["spec"].get("devices")) and old_devices == devices)
            or (bool(s["spec"].get("sharedCounters")) and old_counters == devices)
        ]
        assert not allocatable(mixed, [held], "disk-loop200"), (old_devices, old_counters)


def test_without_counters_the_parts_are_published_alone() -> None:
    config = _config()
    pool = _pool(config, [*_records(1, 2), _disk(201)])
    alone = {d.name for d in parts_alone(pool)}
    # A disk with partitions: its parts; a disk without: itself (it overlaps nothing).
    assert alone == {"disk-loop200p1", "disk-loop200p2", "disk-loop201"}
    entries = PoolEntries(DRIVER, config.class_names)
    (change,) = Discovery(config).replace(_records(1, 2))
    by_name = {d.name: d for d in change.devices}
    built = entries.build(config.classes[0], change.after_write, by_name)
    assert {d.name for d in built} == {"disk-loop200p1", "disk-loop200p2"}
    entries.partitionable = True
    assert {d.name for d in entries.current(config.classes[0])} == {
        "disk-loop200",
        "disk-loop200p1",
        "disk-loop200p2",
    }


def test_the_node_holds_a_whole_and_its_parts_apart() -> None:
    pool = {d.name: d for d in _pool(_config(), [*_records(1, 2), *_records(1, 1, 201)])}
    assert sorted(overlapping(pool, "disk-loop200")) == ["disk-loop200p1", "disk-loop200p2"]
    assert overlapping(pool, "disk-loop200p1") == ["disk-loop200"]
    assert overlapping(pool, "disk-loop201") == ["disk-loop201p1"]
    plain = dataclasses.replace(pool["disk-loop200"], composite="")
    assert overlapping({plain.name: plain}, plain.name) == []


# -- the config ------------------------------------------------------------------------------


def test_check_config_refuses_both_for_a_device_plugin_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "vendor: example.com\nclasses:\n- name: disk\n  match: {subsystem: block}\n"
        "  api: devicePlugin\n  group: {by: parent, subsystem: block, offer: both}\n"
    )
    with pytest.raises(SystemExit) as exc:
        main(["check-config", str(path)])
    assert exc.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{path}: classes[0].group.offer: 'both' needs api: dra, not 'devicePlugin'" in line


@pytest.mark.parametrize(
    ("api_line", "flag", "refused"),
    [
        ("  api: dra\n", "devicePlugin", True),  # the agent's --api wins
        ("", "config", True),  # left out: a device plugin's, as the class's default
        ("", "dra", False),  # left out, served through DRA by the agent's --api
        ("  api: dra\n", "config", False),
    ],
)
def test_the_run_refuses_a_composite_class_its_device_plugin_would_serve(
    tmp_path: Path, api_line: str, flag: str, refused: bool
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "vendor: example.com\nclasses:\n- name: disk\n  match: {subsystem: block}\n"
        f"{api_line}  group: {{by: parent, subsystem: block, offer: both}}\n"
    )
    settings = Settings(paths={"config": path}, api=flag)  # type: ignore[arg-type]
    if not refused:
        assert settings.class_config().classes[0].api == "dra"
        return
    with pytest.raises(ConfigError, match=r"classes\[0\]\.group\.offer: 'both' needs api: dra"):
        settings.class_config()


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        ({**DISK, "sharing": {"replicas": 2}}, "never shared"),
        ({**DISK, "group": {"by": "parent", "offer": "some"}}, "'whole', 'parts' or 'both'"),
    ],
)
def test_bad_composite_configs_are_refused(cls: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(cls)
