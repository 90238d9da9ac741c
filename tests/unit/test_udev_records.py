"""udev records from recorded data, their JSON forms (a record, a recording), and the choice
of netlink source."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest
import pyudev
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.model import DeviceRecord, ParentRecord
from cdi_gen.sources.records import (
    JSON_RECORDING,
    parse_recording,
    record_from_json,
    record_to_json,
    recording_to_json,
    records_from_export_db,
)
from cdi_gen.sources.udev import UdevWatcher, resolve_source

DATA = Path(__file__).resolve().parents[1] / "data" / "udev"


def test_export_db_records_with_rebuilt_parents() -> None:
    records = records_from_export_db((DATA / "export-db-vm.txt").read_text())
    assert all(r.devnode for r in records)
    by_name = {r.sys_name: r for r in records}
    loop0 = by_name["loop0"]
    assert (loop0.subsystem, loop0.devnode, loop0.major, loop0.minor) == (
        "block",
        "/dev/loop0",
        7,
        0,
    )
    assert (loop0.devtype, loop0.sys_number, loop0.parents) == ("disk", "0", ())
    vda = by_name["vda"]
    assert [p.driver for p in vda.parents] == ["virtio_blk", "virtio-pci"]
    assert list(vda.drivers) == ["virtio_blk", "virtio-pci"]
    assert by_name["tun"].devnode == "/dev/net/tun"


def test_export_db_block_without_node_is_skipped() -> None:
    text = "P: /devices/virtual/x/y\nU: x\nE: SUBSYSTEM=x\n\nP: /devices/virtual/misc/kvm\n"
    text += "N: kvm\nE: SUBSYSTEM=misc\nE: MAJOR=10\nE: MINOR=232\n"
    (kvm,) = records_from_export_db(text)
    assert (kvm.sys_path, kvm.devnode, kvm.major) == (
        "/sys/devices/virtual/misc/kvm",
        "/dev/kvm",
        10,
    )


_names = st.from_regex(r"[a-z][a-z0-9_.-]{0,8}", fullmatch=True)
_maps = st.dictionaries(_names, st.text(max_size=5), max_size=3)
_parents = st.builds(
    ParentRecord,
    sys_path=_names.map(lambda n: f"/sys/devices/{n}"),
    sys_name=_names,
    subsystem=st.none() | _names,
    devtype=st.none() | _names,
    driver=st.none() | _names,
    attributes=_maps,
)
_records = st.builds(
    DeviceRecord,
    sys_path=_names.map(lambda n: f"/sys/devices/virtual/{n}"),
    subsystem=_names,
    sys_name=_names,
    sys_number=st.none() | st.from_regex(r"[0-9]{1,3}", fullmatch=True),
    devnode=st.none() | _names.map(lambda n: f"/dev/{n}"),
    devtype=st.none() | _names,
    major=st.none() | st.integers(0, 4095),
    minor=st.none() | st.integers(0, 2**20),
    driver=st.none() | _names,
    properties=_maps,
    attributes=_maps,
    parents=st.lists(_parents, max_size=3).map(tuple),
    numa_node=st.none() | st.integers(0, 7),
    node_exists=st.booleans(),
    action=st.none() | st.sampled_from(["add", "remove", "change", "bind"]),
)


@given(_records)
def test_record_json_round_trip(record: DeviceRecord) -> None:
    data = json.loads(json.dumps(record_to_json(record)))
    assert record_from_json(data) == record


@given(
    st.lists(_records, max_size=4),
    st.frozensets(_names, max_size=3),
    st.frozensets(_names, max_size=3),
)
def test_json_recording_round_trip(
    records: list[DeviceRecord], attributes: frozenset[str], parents: frozenset[str]
) -> None:
    recording = parse_recording(recording_to_json(records, attributes, parents))
    assert recording.records == tuple(records)
    assert recording.format == JSON_RECORDING
    assert (recording.attributes, recording.parent_attributes) == (attributes, parents)
    assert recording.numa


def test_source_auto_needs_a_live_udevd() -> None:
    # Socket paths must stay under 107 bytes: a short directory, not tmp_path.
    tmp_path = Path(tempfile.mkdtemp(dir="/tmp", prefix="cg"))
    assert resolve_source("auto", tmp_path) == "kernel"
    # /run/udev outlives udevd: a socket file nobody listens on is not udevd.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dead.bind(str(tmp_path / "control"))
    dead.close()
    assert resolve_source("auto", tmp_path) == "kernel"
    (tmp_path / "control").unlink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as live:
        live.bind(str(tmp_path / "control"))
        live.listen(1)
        assert resolve_source("auto", tmp_path) == "udev"
    assert resolve_source("kernel", tmp_path) == "kernel"
    assert resolve_source("udev", tmp_path) == "udev"
    shutil.rmtree(tmp_path)


class _FakeDevice:
    """The few pyudev Device attributes the watcher reads from an event."""

    def __init__(self, sys_path: str, action: str, device_node: str | None = None) -> None:
        self.sys_path = sys_path
        self.sys_name = sys_path.rsplit("/", 1)[-1]
        self.subsystem = "block"
        self.action: str | None = action
        self.device_node = device_node
        self.sys_number = self.sys_name.removeprefix("loop")
        self.device_type = "disk"
        self.driver = None
        self.parent = None
        self.properties: dict[str, str] = {}
        self.attributes: dict[str, str] = {}


class _RecordedContext:
    """What the watcher asks of a pyudev Context, answered from recorded devices: the
    machine's own udev database is never read (see tests/unit/conftest.py)."""

    def __init__(self, devices: list[_FakeDevice]) -> None:
        self.devices = devices

    def list_devices(self, subsystem: str | None = None) -> list[_FakeDevice]:
        return [d for d in self.devices if subsystem in (None, d.subsystem)]


def _recorded_loops() -> _RecordedContext:
    """The loop devices of the recorded VM (export-db-vm.txt), as pyudev devices."""
    records = records_from_export_db((DATA / "export-db-vm.txt").read_text())
    devices = []
    for r in records:
        if r.subsystem == "block" and r.sys_name.startswith("loop"):
            device = _FakeDevice(r.sys_path, "add", r.devnode)
            device.action = None  # enumerated, not an event
            device.properties = dict(r.properties)
            devices.append(device)
    assert devices, "the recording has loop devices"
    return _RecordedContext(devices)


def _watcher() -> UdevWatcher:
    return UdevWatcher(source="kernel", subsystems={"block"}, context=_recorded_loops())


class _FakeMonitor:
    """A monitor on a real pipe (so add_reader works) whose poll replays a script."""

    def __init__(self, script: list[object]) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.script = script

    def fileno(self) -> int:
        return self.read_fd

    def poll(self, timeout: float | None = None) -> object:
        if not self.script:
            with contextlib.suppress(BlockingIOError):
                os.set_blocking(self.read_fd, False)
                os.read(self.read_fd, 100)
            return None
        item = self.script.pop(0)
        if isinstance(item, OSError):
            raise item
        return item

    def fire(self) -> None:
        os.write(self.write_fd, b"x")


def test_parent_driver_event_refreshes_known_children(monkeypatch: pytest.MonkeyPatch) -> None:
    watcher = _watcher()
    loop0 = "/sys/devices/virtual/block/loop0"
    watcher._known = {loop0}
    # The refresh looks the child up by its sys path: answered from the recording.
    context = watcher._context
    monkeypatch.setattr(
        pyudev.Devices,
        "from_sys_path",
        lambda ctx, path: next(d for d in context.devices if d.sys_path == path),
    )
    watcher._handle(_FakeDevice("/sys/devices/virtual/block", "bind"))
    assert [(r.sys_path, r.action) for r in watcher._pending] == [(loop0, "change")]


async def test_receive_error_turns_into_full_batch() -> None:
    watcher = _watcher()
    monitor = _FakeMonitor([OSError(errno.ENOBUFS, "No buffer space available")])
    watcher._monitor = monitor
    batches = watcher.batches()
    monitor.fire()
    batch = await asyncio.wait_for(anext(batches), 5)
    assert batch.full
    assert "loop0" in [r.sys_name for r in batch.records]
    assert watcher.resyncs == 1
    watcher.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(batches), 5)
    os.close(monitor.read_fd)
    os.close(monitor.write_fd)


async def test_pending_events_coalesce_into_one_batch() -> None:
    watcher = _watcher()
    events = [
        _FakeDevice(f"/sys/devices/virtual/block/loop{n}", "remove", f"/dev/loop{n}")
        for n in (1, 2)
    ]
    monitor = _FakeMonitor(list(events))
    watcher._monitor = monitor
    batches = watcher.batches()
    monitor.fire()
    batch = await asyncio.wait_for(anext(batches), 5)
    assert not batch.full
    assert [(r.sys_name, r.action) for r in batch.records] == [
        ("loop1", "remove"),
        ("loop2", "remove"),
    ]
    watcher.close()
    await batches.aclose()
    os.close(monitor.read_fd)
    os.close(monitor.write_fd)
