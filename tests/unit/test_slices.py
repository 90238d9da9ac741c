"""ResourceSlice building, DeviceClass manifests, and the `slices`/`deviceclasses` commands
on recorded udev data."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdi_gen.cli.main import main
from cdi_gen.config.loader import parse_config
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.discovery.sharing import expand_change
from cdi_gen.dra.driver.deviceclasses import device_class, device_class_name
from cdi_gen.dra.driver.poolentries import pool_devices
from cdi_gen.dra.plugin.slices import (
    MAX_COUNTER_SETS,
    MAX_DEVICES,
    MAX_DEVICES_RESTRICTED,
    build_slices,
    counter_set_name,
    slice_name,
)
from cdi_gen.model import DeviceRecord, PoolDevice
from cdi_gen.names import is_dns_label, is_dns_subdomain
from cdi_gen.sources.records import record_to_json
from tests.conftest import examples
from tests.slicerules import pool_problems, slice_problems

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
    d = dev("a", attributes={"flag": True, "count": 3, "text": "x", "fw": "1.2.3"})
    (s,) = build_slices(DRIVER, "n", [d], 1, node_uid=None)
    assert s["spec"]["devices"][0]["attributes"] == {
        "count": {"int": 3},
        "flag": {"bool": True},
        "fw": {"string": "1.2.3"},
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
    assert pool_problems(slices) == []
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


# --- every slice we build is one the API server accepts -----------------------------------------
# tests/slicerules.py states the API server's rules; these tests feed it what cdi-gen builds.


def test_the_rules_refuse_what_the_api_server_refuses() -> None:
    # The oracle itself: each of these was seen refused by an API server (issue 26).
    ok = build_slices(DRIVER, "n", [dev("a"), dev("b")], 1, node_uid="u")
    assert pool_problems(ok) == []
    twice = build_slices(DRIVER, "n", [dev("a"), dev("b")], 1, node_uid="u")
    twice[0]["spec"]["devices"][1]["name"] = "a"
    assert "spec.devices: a name twice" in slice_problems(twice[0])
    wide = build_slices(DRIVER, "n", [dev("a", attributes={"v": "é" * 33})], 1, node_uid=None)
    assert any("66 bytes" in p for p in slice_problems(wide[0]))
    many = {f"a{i}": i for i in range(33)}
    crowded = build_slices(DRIVER, "n", [dev("a", attributes=many)], 1, node_uid=None)
    assert any("at most 32" in p for p in slice_problems(crowded[0]))
    long_driver = build_slices("a" * 61 + ".io", "n", [dev("a")], 1, node_uid=None)
    assert any("spec.driver" in p for p in slice_problems(long_driver[0]))
    huge = build_slices(DRIVER, "n", [dev("a", attributes={"n": 2**63})], 1, node_uid=None)
    assert any("int64" in p for p in slice_problems(huge[0]))


_LABEL_CLASS = st.from_regex(r"[a-z]{2,4}(-[a-z0-9]{1,3}){0,2}", fullmatch=True)
_CLASS = st.from_regex(r"[A-Za-z][A-Za-z0-9_.-]{0,20}[A-Za-z0-9]", fullmatch=True)
_DEVICE = st.from_regex(r"[a-z0-9]{1,3}(-[a-z0-9]{1,3}){0,3}", fullmatch=True) | st.from_regex(
    r"[A-Za-z0-9]([A-Za-z0-9_.:-]{0,40}[A-Za-z0-9])?", fullmatch=True
)
_SUBDOMAIN = st.from_regex(
    r"[a-z0-9]{1,20}(\.[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?){0,5}", fullmatch=True
)
_VALUE = st.text(max_size=90) | st.text(alphabet="é€😀", max_size=40)


@st.composite
def _node(draw: st.DrawFn) -> tuple[dict[str, Any], list[DeviceRecord], str]:
    base = draw(st.lists(_LABEL_CLASS | _CLASS, min_size=1, max_size=3, unique=True))
    # Classes extending another with "-x": where plain joining of class and device is ambiguous.
    names = sorted({*base, *(f"{a}-{b}" for a in base for b in base[:2])})[:5]
    classes = [
        {
            "name": name,
            "match": {"subsystem": f"s{i}"},
            "api": "dra",
            "sharing": {"replicas": draw(st.integers(1, 3))},
            "attributes": {f"a{k}": f"{{property[P{k}]}}" for k in range(draw(st.integers(0, 21)))},
        }
        for i, name in enumerate(names)
    ]
    records = []
    for i, cls in enumerate(classes):
        devices = draw(st.lists(_DEVICE, max_size=4, unique_by=str.lower))
        devices += [
            f"{o[len(cls['name']) + 1 :]}-{d}"
            for o in names
            for d in devices[:1]
            if o.startswith(f"{cls['name']}-")
        ]
        for j, device in enumerate(devices):
            props = {
                key: draw(_VALUE)
                for key in (
                    "ID_VENDOR",
                    "ID_MODEL",
                    "ID_SERIAL",
                    *(f"P{k}" for k in range(len(cls["attributes"]))),
                )
            }
            records.append(
                DeviceRecord(
                    sys_path=f"/sys/devices/c{i}/d{j}",
                    subsystem=f"s{i}",
                    sys_name=device,
                    devnode=f"/dev/c{i}-{j}",
                    major=200,
                    minor=i * 100 + j,
                    driver=draw(st.none() | _VALUE),
                    properties=props,
                    numa_node=draw(st.none() | st.integers(0, 3) | st.integers(0, 2**70)),
                )
            )
    vendor = draw(
        st.from_regex(r"[a-z][a-z0-9-]{0,30}[a-z0-9](\.[a-z][a-z0-9]{0,12}){1,2}", fullmatch=True)
    )
    return {"vendor": vendor, "classes": classes}, records, draw(_SUBDOMAIN)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_node(), st.booleans(), st.none() | st.uuids())
def test_every_pool_built_is_one_the_api_server_accepts(
    node: tuple[dict[str, Any], list[DeviceRecord], str], sick: bool, uid: object
) -> None:
    data, records, node_name = node
    config = parse_config(data, "test.yaml")
    devices = []
    for found in Discovery(config).replace(records):
        cls = config.get_class(found.class_name)
        change = expand_change(found, cls.sharing.replicas)
        advertised = [
            dataclasses.replace(a, healthy=not (sick and n % 2), gone=sick and n % 3 == 0)
            for n, a in enumerate(change.after_write)
        ]
        by_name = {d.name: d for d in change.devices}
        devices += pool_devices(config.vendor, cls, advertised, by_name, classes=config.class_names)
    slices = build_slices(config.vendor, node_name, devices, 7, node_uid=str(uid) if uid else None)
    assert pool_problems(slices) == []
    # Nothing was lost to make it so: every device discovered is in the pool.
    assert len(devices_of(slices)) == len(devices)


def _records_file(tmp_path: Path, records: list[DeviceRecord]) -> str:
    path = tmp_path / "records.json"
    path.write_text(json.dumps([record_to_json(r) for r in records]))
    return str(path)


def _config_file(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _record(subsystem: str, name: str, n: int, **kw: Any) -> DeviceRecord:
    return DeviceRecord(
        sys_path=f"/sys/devices/virtual/{subsystem}/{name}",
        subsystem=subsystem,
        sys_name=name,
        devnode=f"/dev/{subsystem}-{n}",
        major=200,
        minor=n,
        **kw,
    )


def _slices_cli(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    data: dict[str, Any],
    records: list[DeviceRecord],
    *extra: str,
) -> list[dict[str, Any]]:
    code, out, err = _cli(
        capsys,
        "slices",
        "--config",
        _config_file(tmp_path, data),
        "--records",
        _records_file(tmp_path, records),
        "--node",
        "node-1",
        *extra,
    )
    assert code == 0, err
    return list(yaml.safe_load_all(out))


def test_classes_whose_names_join_alike_publish_distinct_devices(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Issue 26, item 9: class "ab-cd" device "c" and class "ab" device "cd-c" both joined as
    # "ab-cd-c"; the slice listed the name twice and the API server refused it.
    data = {
        "vendor": "example.com",
        "classes": [
            {"name": "ab-cd", "match": {"subsystem": "one"}},
            {"name": "ab", "match": {"subsystem": "two"}},
        ],
    }
    docs = _slices_cli(capsys, tmp_path, data, [_record("one", "c", 1), _record("two", "cd-c", 2)])
    assert pool_problems(docs) == []
    by_cdi = {d["attributes"]["cdiName"]["string"]: d["name"] for d in devices_of(docs)}
    assert by_cdi["example.com/ab-cd=c"] == "ab-cd-c"
    assert by_cdi["example.com/ab=cd-c"].startswith("ab-cd-c--")


def test_values_over_64_bytes_are_left_out_not_the_slice(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Issue 26, item 10: a 64-character, 128-byte vendor and an 80-byte templated attribute
    # were published as they were; the API server refused the whole slice.
    data = {
        "vendor": "example.com",
        "classes": [
            {
                "name": "loop",
                "match": {"subsystem": "block"},
                "attributes": {"fw": "{property[FW]}"},
            }
        ],
    }
    record = _record(
        "block", "loop1", 1, properties={"ID_VENDOR": "ü" * 64, "FW": "v" * 80, "ID_MODEL": "ok"}
    )
    docs = _slices_cli(capsys, tmp_path, data, [record])
    assert pool_problems(docs) == []
    (device,) = devices_of(docs)
    assert "vendor" not in device["attributes"] and "fw" not in device["attributes"]
    assert device["attributes"]["model"] == {"string": "ok"}


LONG_DRIVER = "d" * 61 + ".io"  # 64 characters: a DNS subdomain, one over the limit


@pytest.mark.parametrize("command", ["slices", "deviceclasses"])
def test_a_driver_name_over_63_characters_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    # Issue 26, item 12: accepted, then every slice got 422.
    extra = ("--records", HW) if command == "slices" else ()
    code, out, err = _cli(capsys, command, *extra, "--driver", LONG_DRIVER)
    assert (code, out) == (2, "")
    assert "--driver" in err and "longer than 63 characters" in err
    data = {"vendor": LONG_DRIVER, "classes": [{"name": "loop", "match": {"subsystem": "block"}}]}
    code, out, err = _cli(capsys, command, *extra, "--config", _config_file(tmp_path, data))
    assert (code, out) == (2, "")
    assert "vendor as the DRA driver name" in err and "--driver" in err
    code, out, _ = _cli(capsys, command, *extra, "--driver", "d" * 60 + ".io")
    assert code == 0 and out


def test_by_capacity_shows_a_shared_device_once_with_its_shares(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The preview of what the agent publishes where the API server serves consumable
    capacity; without the flag, the slots every API server takes."""
    data = {
        "vendor": "example.com",
        "classes": [
            {"name": "kvm", "match": {"subsystem": "misc"}, "sharing": {"replicas": 3}},
            {"name": "loop", "match": {"subsystem": "block"}},
        ],
    }
    records = [_record("misc", "kvm", 1), _record("block", "loop1", 2)]
    by_capacity = _slices_cli(capsys, tmp_path, data, records, "--by-capacity")
    assert pool_problems(by_capacity) == []
    named = {d["name"]: d for d in devices_of(by_capacity)}
    assert sorted(named) == ["kvm-kvm", "loop-loop1"]
    assert named["kvm-kvm"]["allowMultipleAllocations"] is True
    assert named["kvm-kvm"]["capacity"]["shares"]["value"] == "3"
    assert named["kvm-kvm"]["attributes"]["cdiName"] == {"string": "example.com/kvm=kvm-0"}
    assert "slot" not in named["kvm-kvm"]["attributes"]
    assert "allowMultipleAllocations" not in named["loop-loop1"]

    slots = {d["name"] for d in devices_of(_slices_cli(capsys, tmp_path, data, records))}
    assert slots == {"kvm-kvm-0", "kvm-kvm-1", "kvm-kvm-2", "loop-loop1"}
