"""Kubernetes' standard PCI attributes (``resource.kubernetes.io/pciBusID``, ``pcieRoot``):
derived from recorded udev records and their parents, published beside the driver's own
attributes, and kept only where every record of a grouped device agrees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.cli.main import main
from cdi_gen.config.loader import parse_config
from cdi_gen.config.models import MAX_CLASS_ATTRIBUTES, MAX_DEVICE_ATTRIBUTES
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.discovery.topology import (
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    device_topology,
    is_pci_bus_id,
    pcie_root,
    record_topology,
)
from cdi_gen.dra.driver.poolentries import pool_devices
from cdi_gen.model import DeviceRecord, ParentRecord
from cdi_gen.sources.records import record_from_json, records_from_export_db
from tests.slicerules import pool_problems

DATA = Path(__file__).resolve().parents[1] / "data" / "udev"
TOPOLOGY = DATA / "pci-topology.json"


def _recorded() -> dict[str, DeviceRecord]:
    records = [record_from_json(r) for r in json.loads(TOPOLOGY.read_text())]
    return {r.sys_name: r for r in records}


def _record(sys_path: str, parents: list[tuple[str, str | None]]) -> DeviceRecord:
    return DeviceRecord(
        sys_path=sys_path,
        subsystem="block",
        sys_name=sys_path.rsplit("/", 1)[-1],
        parents=tuple(
            ParentRecord(sys_path=p, sys_name=p.rsplit("/", 1)[-1], subsystem=s) for p, s in parents
        ),
    )


def test_the_virtual_disk_of_a_recorded_vm() -> None:
    records = {
        r.sys_name: r for r in records_from_export_db((DATA / "export-db-vm.txt").read_text())
    }
    assert record_topology(records["vda"]) == {
        PCI_BUS_ID: "0000:00:02.0",
        PCIE_ROOT: "pci0000:00",
    }
    # A loop device is virtual: no PCI device above it.
    assert record_topology(records["loop0"]) == {}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # The endpoint behind the root port, not the port.
        ("nvme0n1", {PCI_BUS_ID: "0000:3b:00.0", PCIE_ROOT: "pci0000:00"}),
        ("nvme1n1", {PCI_BUS_ID: "0000:81:00.0", PCIE_ROOT: "pci0000:80"}),
        # Behind a VMD domain: a five-digit domain is no BDF the standard accepts, and the
        # port above it is another device, so nothing is claimed.
        ("nvme2n1", {}),
        ("card0", {PCI_BUS_ID: "0000:01:00.0", PCIE_ROOT: "pci0000:00"}),
        ("loop0", {}),
    ],
)
def test_recorded_records(name: str, expected: dict[str, str]) -> None:
    assert record_topology(_recorded()[name]) == expected


def test_a_record_that_is_itself_the_pci_device() -> None:
    path = "/sys/devices/pci0000:00/0000:00:04.0"
    record = DeviceRecord(sys_path=path, subsystem="pci", sys_name="0000:00:04.0")
    assert record_topology(record) == {PCI_BUS_ID: "0000:00:04.0", PCIE_ROOT: "pci0000:00"}


@pytest.mark.parametrize(
    ("path", "bdf"),
    [
        ("/sys/devices/platform/0000:00:02.0", "0000:00:02.0"),  # not below a root complex
        ("/sys/devices/pci0000:00/0000:00:03.0", "0000:00:02.0"),  # not ending in the BDF
        ("/sys/devices/0000:00:02.0", "0000:00:02.0"),  # no root element
        ("/host/sys/devices/pci0000:00/0000:00:02.0", "0000:00:02.0"),
        ("/sys/devices/pci0000:00//0000:00:02.0", "0000:00:02.0"),
    ],
)
def test_a_path_the_helper_would_refuse_gives_no_root(path: str, bdf: str) -> None:
    assert pcie_root(path, bdf) is None
    # The BDF alone still stands: it is the device's name, checked on its own.
    pci = ParentRecord(sys_path=path, sys_name=bdf, subsystem="pci")
    record = DeviceRecord(
        sys_path=f"{path}/block/vda", subsystem="block", sys_name="vda", parents=(pci,)
    )
    assert record_topology(record) == {PCI_BUS_ID: bdf}


def test_a_malformed_nearest_pci_name_is_not_replaced_by_a_bridge_above() -> None:
    bridge = "/sys/devices/pci0000:00/0000:00:1d.0"
    record = _record(
        f"{bridge}/0000:3B:00.0/block/x", [(f"{bridge}/0000:3B:00.0", "pci"), (bridge, "pci")]
    )
    assert record_topology(record) == {}


def test_a_group_keeps_what_all_its_records_share() -> None:
    root = "/sys/devices/pci0000:00"
    a = _record(f"{root}/0000:00:02.0/block/a", [(f"{root}/0000:00:02.0", "pci")])
    b = _record(f"{root}/0000:00:03.0/block/b", [(f"{root}/0000:00:03.0", "pci")])
    other = "/sys/devices/pci0000:80/0000:80:02.0"
    c = _record(f"{other}/block/c", [(other, "pci")])
    virtual = _record("/sys/devices/virtual/block/loop0", [])
    assert device_topology([a, a]) == record_topology(a)
    assert device_topology([a, b]) == {PCIE_ROOT: "pci0000:00"}
    assert device_topology([a, c]) == {}
    assert device_topology([a, virtual]) == {}
    assert device_topology([]) == {}


_HEX = "0123456789abcdef"


@given(
    st.tuples(
        st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0xFF), st.integers(0, 0xF)
    ),
    st.integers(0, 0xFF),
    st.lists(st.integers(0, 0xFF), max_size=3),
)
def test_bdf_and_root_round_trip(
    address: tuple[int, int, int, int], root_bus: int, bridges: list[int]
) -> None:
    domain, bus, dev, fn = address
    bdf = f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"
    assert is_pci_bus_id(bdf)
    assert not is_pci_bus_id(bdf.upper()) or bdf == bdf.upper()
    assert not is_pci_bus_id(bdf + "0") and not is_pci_bus_id(bdf[1:])
    root = f"pci{domain:04x}:{root_bus:02x}"
    ports = [f"{domain:04x}:{root_bus:02x}:{b:02x}.0" for b in bridges]
    path = "/".join(["/sys/devices", root, *ports, bdf])
    assert pcie_root(path, bdf) == root
    parents = [(path, "pci")]
    parents += [
        ("/".join(["/sys/devices", root, *ports[: i + 1]]), "pci")
        for i in reversed(range(len(ports)))
    ]
    record = _record(f"{path}/nvme/nvme0/nvme0n1", [(f"{path}/nvme/nvme0", "nvme"), *parents])
    assert record_topology(record) == {PCI_BUS_ID: bdf, PCIE_ROOT: root}


@given(st.text(alphabet=_HEX + "ABCDEF:.x", max_size=14))
def test_a_bus_id_is_exactly_four_two_two_one_lower_hex_digits(text: str) -> None:
    parts = text.replace(".", ":").split(":")
    expected = (
        len(parts) == 4
        and text.count(".") == 1
        and text.index(".") > text.rindex(":")
        and [len(p) for p in parts] == [4, 2, 2, 1]
        and all(c in _HEX for p in parts for c in p)
    )
    assert is_pci_bus_id(text) == expected


def _config(classes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"vendor": "example.com", "classes": classes}


_CLASSES = [
    {"name": "nvme", "match": {"subsystem": "block", "kernel": "nvme[0-9]n1"}},
    {"name": "gpu", "match": {"subsystem": "drm"}, "group": {"by": "parent", "subsystem": "pci"}},
    {"name": "loop", "match": {"subsystem": "block", "kernel": "loop*"}},
]


def test_slices_command_shows_the_standard_attributes_fully_qualified(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_config(_CLASSES)))
    with pytest.raises(SystemExit) as info:
        main(["slices", "--config", str(config), "--records", str(TOPOLOGY), "--node", "n1"])
    out, err = capsys.readouterr()
    assert info.value.code in (0, None), err
    docs = list(yaml.safe_load_all(out))
    assert pool_problems(docs) == []
    devices = {d["name"]: d["attributes"] for doc in docs for d in doc["spec"].get("devices", [])}
    topology = {
        name: {k: v for k, v in attrs.items() if k.startswith("resource.kubernetes.io/")}
        for name, attrs in devices.items()
    }
    gpu = next(n for n in devices if n.startswith("gpu-"))

    def pci(bus_id: str, root: str, numa: int) -> dict[str, Any]:
        return {
            PCI_BUS_ID: {"string": bus_id},
            PCIE_ROOT: {"string": root},
            NUMA_NODE: {"int": numa},
        }

    assert topology == {
        "nvme-nvme0n1": pci("0000:3b:00.0", "pci0000:00", 0),
        "nvme-nvme1n1": pci("0000:81:00.0", "pci0000:80", 1),
        # Behind VMD: no bus ID or root the standard accepts, but a NUMA node all the same.
        "nvme-nvme2n1": {NUMA_NODE: {"int": 0}},
        # card0 and renderD128 of one GPU: one device, on the PCI function they share.
        gpu: pci("0000:01:00.0", "pci0000:00", 0),
        "loop-loop0": {},
    }
    # Beside the driver's own attributes, which stay unqualified (numaNode too: claims
    # deployed before the standard name select on it).
    assert devices["nvme-nvme0n1"]["class"] == {"string": "nvme"}
    assert devices["nvme-nvme0n1"]["numaNode"] == {"int": 0}


def _pool_attributes(
    classes: list[dict[str, Any]], records: list[DeviceRecord]
) -> list[dict[str, Any]]:
    config = parse_config(_config(classes), "test.yaml")
    out = []
    for change in Discovery(config).replace(records):
        cls = config.get_class(change.class_name)
        by_name = {d.name: d for d in change.devices}
        for d in pool_devices(
            config.vendor, cls, change.after_write, by_name, classes=config.class_names
        ):
            out.append(dict(d.attributes))
    return out


def test_a_group_across_two_root_complexes_gets_no_standard_attributes() -> None:
    recorded = _recorded()
    cls = {
        "name": "pair",
        "match": {"subsystem": "block", "kernel": "nvme[01]n1"},
        "group": {"by": "property", "property": "DEVTYPE"},
    }
    (attributes,) = _pool_attributes([cls], [recorded["nvme0n1"], recorded["nvme1n1"]])
    assert PCIE_ROOT not in attributes and PCI_BUS_ID not in attributes


def test_the_standard_attributes_take_only_the_room_a_full_class_leaves() -> None:
    record = _recorded()["nvme0n1"]
    own = {f"a{i}": "{kernel}" for i in range(MAX_CLASS_ATTRIBUTES)}
    full = {**_CLASSES[0], "attributes": own, "sharing": {"replicas": 2}}
    for attributes in _pool_attributes([full], [record]):
        assert len(attributes) <= MAX_DEVICE_ATTRIBUTES
        # Every attribute the class asked for is kept; the standard ones take what room is
        # left in their order: the root, the NUMA node, the bus ID.
        assert set(own) <= set(attributes)
        standard = [k for k in (PCIE_ROOT, NUMA_NODE, PCI_BUS_ID) if k in attributes]
        assert standard == [PCIE_ROOT, NUMA_NODE, PCI_BUS_ID][: len(standard)]
    (plain,) = _pool_attributes([_CLASSES[0]], [record])
    assert plain[PCIE_ROOT] == "pci0000:00" and plain[PCI_BUS_ID] == "0000:3b:00.0"
    assert plain[NUMA_NODE] == plain["numaNode"] == 0
