"""udev records from recorded data, their JSON form, and the choice of netlink source."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.udev import (
    DeviceRecord,
    ParentRecord,
    record_from_json,
    record_to_json,
    records_from_export_db,
    resolve_source,
)

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
