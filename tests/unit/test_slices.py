"""ResourceSlice building, DeviceClass manifests, and the `slices`/`deviceclasses` commands
on recorded udev data."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.apiserver.deviceclasses import device_class, device_class_name
from cdi_gen.apiserver.slices import (
    MAX_COUNTER_SETS,
    MAX_DEVICES,
    MAX_DEVICES_RESTRICTED,
    build_slices,
    counter_set_name,
    slice_name,
)
from cdi_gen.cli.main import main
from cdi_gen.model import PoolDevice
from cdi_gen.names import is_dns_label, is_dns_subdomain

DRIVER = "cdi-gen.example.com"
HW = str(Path(__file__).resolve().parents[1] / "data" / "udev" / "hardware.json")


def dev(name: str, **kw: object) -> PoolDevice:
    kw.setdefault("physical", f"/sys/devices/{name}")
    return PoolDevice(name=name, cdi_name=f"x.io/c={name}", class_name="c", **kw)  # type: ignore[arg-type]


def devices_of(slices: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    return [d for s in slices for d in s["spec"].get("devices") or ()]


def test_one_slice_pool_named_after_node_with_owner() -> None:
    (s,) = build_slices(DRIVER, "node-1", [dev("a"), dev("b")], 5, node_uid="uid-1")
    assert s["apiVersion"] == "resource.k8s.io/v1" and s["kind"] == "ResourceSlice"
    assert s["metadata"]["name"] == "node-1-cdi-gen.example.com-0"
    assert s["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "uid-1", "controller": True}
    ]
    assert s["spec"]["pool"] == {"name": "node-1", "generation": 5, "resourceSliceCount": 1}
    assert s["spec"]["nodeName"] == "node-1" and s["spec"]["driver"] == DRIVER
    assert [d["name"] for d in s["spec"]["devices"]] == ["a", "b"]


def test_no_owner_without_uid_and_empty_pool_is_one_empty_slice() -> None:
    (s,) = build_slices(DRIVER, "n", [], 1, node_uid=None)
    assert "ownerReferences" not in s["metadata"]
    assert "devices" not in s["spec"] and s["spec"]["pool"]["resourceSliceCount"] == 1


def test_attribute_types() -> None:
    d = dev(
        "a",
        attributes={"flag": True, "count": 3, "text": "x", "fw": "1.2.3"},
        versions=frozenset({"fw"}),
    )
    (s,) = build_slices(DRIVER, "n", [d], 1, node_uid=None)
    assert s["spec"]["devices"][0]["attributes"] == {
        "count": {"int": 3},
        "flag": {"bool": True},
        "fw": {"version": "1.2.3"},
        "text": {"string": "x"},
    }


@pytest.mark.parametrize(
    ("kw", "taints"),
    [
        ({}, None),
        ({"healthy": False}, [{"key": f"{DRIVER}/unhealthy", "effect": "NoSchedule"}]),
        ({"gone": True, "healthy": False}, [{"key": f"{DRIVER}/gone", "effect": "NoSchedule"}]),
        (
            {"gone": True, "healthy": False, "taint_when_gone": True},
            [{"key": f"{DRIVER}/gone", "effect": "NoExecute"}],
        ),
    ],
)
def test_taints(kw: dict[str, object], taints: object) -> None:
    (s,) = build_slices(DRIVER, "n", [dev("a", **kw)], 1, node_uid=None)
    assert s["spec"]["devices"][0].get("taints") == taints


def test_chunking_at_128_and_64() -> None:
    plain = [dev(f"p{i}") for i in range(MAX_DEVICES + 1)]
    sick = [dev(f"s{i}", healthy=False) for i in range(MAX_DEVICES_RESTRICTED + 1)]
    slices = build_slices(DRIVER, "n", plain + sick, 2, node_uid=None)
    sizes = [len(s["spec"]["devices"]) for s in slices]
    assert sizes == [128, 1, 64, 1]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {4}
    assert [s["metadata"]["name"] for s in slices] == [slice_name("n", DRIVER, i) for i in range(4)]


def test_shared_device_counters_in_their_own_slices() -> None:
    slots = [
        dev(f"kvm{p}-{i}", physical=f"/sys/kvm{p}", slots=2) for p in range(9) for i in range(2)
    ]
    slices = build_slices(DRIVER, "n", slots, 1, node_uid=None)
    device_slices = [s for s in slices if "devices" in s["spec"]]
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    assert all("sharedCounters" not in s["spec"] for s in device_slices)
    assert [len(s["spec"]["sharedCounters"]) for s in counter_slices] == [MAX_COUNTER_SETS, 1]
    sets = {c["name"]: c for s in counter_slices for c in s["spec"]["sharedCounters"]}
    assert len(sets) == 9
    assert all(c["counters"] == {"slots": {"value": "2"}} for c in sets.values())
    for d in devices_of(slices):
        (use,) = d["consumesCounters"]
        assert use["counterSet"] in sets and use["counters"] == {"slots": {"value": "1"}}
    assert all(is_dns_label(name) for name in sets)
    assert counter_set_name(slots[0]) == counter_set_name(slots[1])
    assert counter_set_name(slots[0]) != counter_set_name(slots[2])


def test_long_names_stay_valid_and_distinct() -> None:
    node_a, node_b = "a" * 200 + ".x", "a" * 200 + ".y"
    names = {slice_name(n, DRIVER, i) for n in (node_a, node_b) for i in range(12)}
    assert len(names) == 24 and all(is_dns_subdomain(n) for n in names)


device_sets = st.lists(
    st.tuples(st.booleans(), st.booleans(), st.integers(min_value=1, max_value=3)),
    max_size=400,
)


@given(device_sets)
def test_every_device_exactly_once_within_limits(spec: list[tuple[bool, bool, int]]) -> None:
    devices = [
        dev(f"d{i}", healthy=healthy, gone=gone, slots=slots, physical=f"/p{i // 3}")
        for i, (healthy, gone, slots) in enumerate(spec)
    ]
    slices = build_slices(DRIVER, "n", devices, 3, node_uid=None)
    assert sorted(d["name"] for d in devices_of(slices)) == sorted(d.name for d in devices)
    for s in slices:
        entries = s["spec"].get("devices") or []
        restricted = any("taints" in d or "consumesCounters" in d for d in entries)
        assert len(entries) <= (MAX_DEVICES_RESTRICTED if restricted else MAX_DEVICES)
        assert not (entries and s["spec"].get("sharedCounters"))
        assert len(s["spec"].get("sharedCounters") or []) <= MAX_COUNTER_SETS
        assert s["spec"]["pool"] == {
            "name": "n",
            "generation": 3,
            "resourceSliceCount": len(slices),
        }
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)


def test_device_class() -> None:
    doc = device_class("fpga", DRIVER, "example.com")
    assert doc["metadata"]["name"] == "fpga.cdi-gen.example.com"
    assert doc["spec"]["extendedResourceName"] == "example.com/fpga"
    assert doc["spec"]["selectors"] == [
        {
            "cel": {
                "expression": f'device.driver == "{DRIVER}" && '
                f'device.attributes["{DRIVER}"].class == "fpga"'
            }
        }
    ]
    assert is_dns_subdomain(device_class_name("My_Class", DRIVER))


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_slices_command_on_a_recording(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "slices", "--records", HW, "--node", "node-1", "--driver", DRIVER)
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    assert docs and all(d["kind"] == "ResourceSlice" for d in docs)
    devices = devices_of(docs)
    fpga = [d for d in devices if d["attributes"]["class"] == {"string": "fpga"}]
    assert [d["attributes"]["cdiName"]["string"] for d in fpga] == [
        "cdi-gen.io/fpga=region0",
        "cdi-gen.io/fpga=region1",
    ]
    assert all(is_dns_label(d["name"]) for d in devices)


def test_slices_command_dra_only_and_bad_node(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "slices", "--records", HW, "--node", "n", "--dra-only")
    assert code == 0
    (doc,) = yaml.safe_load_all(out)  # the catalogue serves nothing through DRA by default
    assert "devices" not in doc["spec"]
    code, _, err = _cli(capsys, "slices", "--records", HW, "--node", "Bad_Node")
    assert code == 2 and "--node 'Bad_Node'" in err


def test_deviceclasses_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "deviceclasses", "--driver", DRIVER)
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    names = [d["metadata"]["name"] for d in docs]
    assert "kvm.cdi-gen.example.com" in names
    assert all(is_dns_subdomain(n) for n in names)
