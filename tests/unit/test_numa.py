"""A device's NUMA node: read from the nearest PCI device at or above it (its sysfs
``numa_node``, -1 meaning none), published as the driver's ``numaNode`` and as Kubernetes'
standard ``resource.kubernetes.io/numaNode`` (KEP-6072), within a device's 32 attributes.

The sysfs side is recorded (tests/data/udev/pci-numa.json, a recording whose devices and
parents carry their ``numa_node``) and served to the udev reader as pyudev would: the reader
walks the parents itself, so the recording must not say the answer (its records have no
``numa_node`` key)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdi_gen.cli.main import main
from cdi_gen.config.deviceattributes import BUILT_IN
from cdi_gen.config.loader import parse_config
from cdi_gen.config.models import MAX_CLASS_ATTRIBUTES, MAX_DEVICE_ATTRIBUTES
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.discovery.sharing import expand_change
from cdi_gen.discovery.topology import NUMA_NODE, PCI_BUS_ID, PCIE_ROOT, standard_numa_node
from cdi_gen.dra.driver.poolentries import pool_devices
from cdi_gen.model import DeviceRecord, ParentRecord
from cdi_gen.sources.records import load_recording, record_to_json
from cdi_gen.sources.udev import record_from_device
from tests.slicerules import pool_problems

RECORDING = Path(__file__).resolve().parents[1] / "data" / "udev" / "pci-numa.json"


class _Attributes:
    """pyudev's ``Device.attributes``: values as bytes, None for a file the device lacks."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = values

    def get(self, name: str) -> bytes | None:
        value = self._values.get(name)
        return None if value is None else value.encode()


@dataclasses.dataclass
class _Device:
    """What :func:`record_from_device` reads of a pyudev Device, from a recorded record."""

    sys_path: str
    sys_name: str
    subsystem: str | None
    attributes: _Attributes
    parent: _Device | None
    properties: Mapping[str, str] = dataclasses.field(default_factory=dict)
    device_node: str | None = None
    sys_number: str | None = None
    device_type: str | None = None
    driver: str | None = None


def _parent(p: ParentRecord, above: _Device | None) -> _Device:
    return _Device(
        p.sys_path, p.sys_name, p.subsystem, _Attributes(p.attributes), above, driver=p.driver
    )


def _as_udev(record: DeviceRecord) -> _Device:
    above = None
    for p in reversed(record.parents):
        above = _parent(p, above)
    return _Device(
        record.sys_path,
        record.sys_name,
        record.subsystem,
        _Attributes(record.attributes),
        above,
        properties=record.properties,
        device_node=record.devnode,
        sys_number=record.sys_number,
        device_type=record.devtype,
        driver=record.driver,
    )


def _recorded() -> dict[str, DeviceRecord]:
    return {r.sys_name: r for r in load_recording(RECORDING).records}


def _read(record: DeviceRecord) -> int | None:
    return record_from_device(_as_udev(record)).numa_node


def _with_numa(record: DeviceRecord, by_name: Mapping[str, str | None]) -> DeviceRecord:
    """``record`` with the ``numa_node`` of the named parents set (None: the file is absent)."""

    def edit(p: ParentRecord) -> ParentRecord:
        if p.sys_name not in by_name:
            return p
        attrs = {k: v for k, v in p.attributes.items() if k != "numa_node"}
        value = by_name[p.sys_name]
        return dataclasses.replace(
            p, attributes=attrs if value is None else {**attrs, "numa_node": value}
        )

    return dataclasses.replace(record, parents=tuple(edit(p) for p in record.parents))


def test_the_recording_does_not_say_the_answer() -> None:
    assert all(r.numa_node is None for r in _recorded().values())


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # Node 1: the NVMe function (and the nvme controller mirroring it) and its port.
        ("nvme0n1", 1),
        # The SAS HBA says -1 (no affinity); the root port above it says 0, but it is
        # another device: the disk has no node.
        ("sda", None),
        # A virtio function right below the root complex, on node 0.
        ("vda", 0),
        # No PCI device above persistent memory: the dax device's own node.
        ("dax0.0", 0),
    ],
)
def test_the_node_is_the_nearest_pci_devices_own(name: str, expected: int | None) -> None:
    assert _read(_recorded()[name]) == expected


@pytest.mark.parametrize(
    ("numa", "expected"),
    [
        ({"0000:02:00.0": "1"}, 1),
        ({"0000:02:00.0": "-1", "0000:00:01.0": "1"}, None),
        ({"0000:02:00.0": "garbage"}, None),
        ({"0000:02:00.0": ""}, None),
        # A PCI device without the file (a kernel without NUMA): none, never the port's.
        ({"0000:02:00.0": None}, None),
        # The SCSI devices in between never decide, whatever they say.
        ({"0:0:0:0": "1", "host0": "1"}, None),
    ],
)
def test_what_the_nearest_pci_device_says_decides(
    numa: dict[str, str | None], expected: int | None
) -> None:
    assert _read(_with_numa(_recorded()["sda"], numa)) == expected


def test_a_pci_device_record_reads_its_own_file() -> None:
    record = _recorded()["sda"]
    hba = next(p for p in record.parents if p.subsystem == "pci")
    below = record.parents[record.parents.index(hba) + 1 :]
    pci = DeviceRecord(
        sys_path=hba.sys_path,
        subsystem="pci",
        sys_name=hba.sys_name,
        attributes={"numa_node": "-1"},
        parents=below,
    )
    assert _read(pci) is None
    assert _read(dataclasses.replace(pci, attributes={"numa_node": "1"})) == 1


def test_without_pci_the_nearest_device_with_a_node_decides() -> None:
    dax = _recorded()["dax0.0"]
    assert _read(dataclasses.replace(dax, attributes={})) == 0  # the region's
    assert _read(dataclasses.replace(dax, attributes={"numa_node": "-1"})) is None
    assert _read(dataclasses.replace(dax, attributes={}, parents=())) is None


def test_a_removed_device_reads_nothing() -> None:
    assert record_from_device(_as_udev(_recorded()["vda"]), action="remove").numa_node is None


_CLASSES = [
    {"name": "disk", "match": {"subsystem": "block", "kernel": "[sv]d[a-z]"}},
    {"name": "nvme", "match": {"subsystem": "block", "kernel": "nvme[0-9]n1"}},
    {"name": "pmem", "match": {"subsystem": "dax"}},
]


def test_slices_carry_both_names_where_there_is_a_node(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Read as the agent reads udev, written as `cdi-gen record` writes, published by
    # `cdi-gen slices`: the whole way from sysfs to what the API server gets.
    records = [
        record_to_json(record_from_device(_as_udev(r))) for r in load_recording(RECORDING).records
    ]
    (tmp_path / "records.json").write_text(json.dumps(records))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"vendor": "example.com", "classes": _CLASSES}))
    args = ["slices", "--config", str(config), "--records", str(tmp_path / "records.json")]
    with pytest.raises(SystemExit) as info:
        main([*args, "--node", "n1"])
    out, err = capsys.readouterr()
    assert info.value.code in (0, None), err
    docs = list(yaml.safe_load_all(out))
    assert pool_problems(docs) == []
    devices = [d["attributes"] for doc in docs for d in doc["spec"].get("devices", [])]
    numa = {a["kernelName"]["string"]: (a.get("numaNode"), a.get(NUMA_NODE)) for a in devices}
    assert numa == {
        "nvme0n1": ({"int": 1}, {"int": 1}),
        "sda": (None, None),
        "vda": ({"int": 0}, {"int": 0}),
        "dax0.0": ({"int": 0}, {"int": 0}),
    }


@pytest.mark.parametrize(
    ("node", "expected"),
    [(None, None), (-1, None), (0, 0), (7, 7), (1023, 1023), (1024, None), (2**63, None)],
)
def test_the_standard_value_is_a_node_linux_can_have(
    node: int | None, expected: int | None
) -> None:
    # Kubernetes' helper refuses -1 (it would align every device without a node) and
    # nodes beyond 1023; the driver's own numaNode keeps any int64 it had before.
    assert standard_numa_node(node) == expected


def _attributes(cls: dict[str, Any], record: DeviceRecord) -> list[dict[str, Any]]:
    config = parse_config({"vendor": "example.com", "classes": [cls]}, "test.yaml")
    (change,) = Discovery(config).replace([record])
    change = expand_change(change, config.classes[0].sharing.replicas)
    by_name = {d.name: d for d in change.devices}
    devices = pool_devices(
        config.vendor, config.classes[0], change.after_write, by_name, classes=config.class_names
    )
    return [dict(d.attributes) for d in devices]


@pytest.mark.parametrize(
    ("replicas", "properties", "standard"),
    [
        # 22 of the class's own and all 10 built-in ones the pool sets: no room left.
        (2, {"ID_VENDOR": "v", "ID_MODEL": "m", "ID_SERIAL": "s"}, []),
        # No slot: room for the root.
        (1, {"ID_VENDOR": "v", "ID_MODEL": "m", "ID_SERIAL": "s"}, [PCIE_ROOT]),
        # No serial either: the NUMA node fits too, the bus ID does not.
        (1, {"ID_VENDOR": "v", "ID_MODEL": "m"}, [PCIE_ROOT, NUMA_NODE]),
        (1, {"ID_VENDOR": "v"}, [PCIE_ROOT, NUMA_NODE, PCI_BUS_ID]),
    ],
)
def test_the_standard_node_counts_against_the_limit(
    replicas: int, properties: dict[str, str], standard: list[str]
) -> None:
    record = record_from_device(_as_udev(_recorded()["nvme0n1"]))
    record = dataclasses.replace(record, properties={**record.properties, **properties})
    own = {f"a{i}": "{kernel}" for i in range(MAX_CLASS_ATTRIBUTES)}
    cls = {**_CLASSES[1], "attributes": own, "sharing": {"replicas": replicas}}
    for attributes in _attributes(cls, record):
        assert len(attributes) <= MAX_DEVICE_ATTRIBUTES
        assert set(own) <= set(attributes) and attributes["numaNode"] == 1
        assert [k for k in attributes if k.startswith("resource.kubernetes.io/")] == standard


def test_the_pool_sets_exactly_the_attributes_of_the_table() -> None:
    """The attributes the pool sets itself are those of one table
    (``config/deviceattributes.py``), which the config's check of a class's own reads too:
    for devices with every source present (a PCI parent on a NUMA node, a driver, a vendor,
    model and serial, a slot of a shared device) the names not from the class config are
    exactly the table's. One the pool starts to set without the table fails here; so does
    one the table names but the pool never sets (it would cost every class a slot)."""
    record = record_from_device(_as_udev(_recorded()["nvme0n1"]))
    udev = {"ID_VENDOR": "v", "ID_MODEL": "m", "ID_SERIAL": "s"}
    record = dataclasses.replace(record, properties={**record.properties, **udev})
    own = {"firmware": "{kernel}"}
    cls = {**_CLASSES[1], "attributes": own, "sharing": {"replicas": 2}}
    devices = _attributes(cls, record)
    assert len(devices) == 2
    for attributes in devices:
        # ``part`` is a composite class's, which is never shared (tests/unit/test_pool.py
        # holds it to the table on a composite device).
        assert set(attributes) - set(own) == set(BUILT_IN) - {"part"}
