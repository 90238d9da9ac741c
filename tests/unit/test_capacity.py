"""Consumable capacity (KEP-5075): a shared device's slots published as one device with
shares, the slices rendering both ways, and the start's question to the API server (answered
by the stand-in with and without the field)."""

from __future__ import annotations

import json

import pytest

from cdi_gen.apiserver.client import ApiClient
from cdi_gen.apiserver.errors import ApiServerError
from cdi_gen.config.loader import parse_config
from cdi_gen.discovery.sharing import slot_device, slot_names
from cdi_gen.dra.driver.poolentries import pool_devices, shared_once
from cdi_gen.dra.plugin.capacity import consumable_capacity, probe_slice
from cdi_gen.dra.plugin.slicerecord import GATES, dropped_fields
from cdi_gen.dra.plugin.slices import build_slices
from cdi_gen.model import AdvertisedDevice
from tests.fakes.apiserver import SLICES, Answer, FakeApiServer
from tests.slicerules import pool_problems, slice_problems
from tests.unit.conftest import API_NODE

DRIVER = "example.com"
CONFIG = parse_config(
    {
        "vendor": DRIVER,
        "classes": [
            {
                "name": "kvm",
                "match": {"subsystem": "misc"},
                "api": "dra",
                "sharing": {"replicas": 3},
            },
            {"name": "fpga", "match": {"subsystem": "block"}, "api": "dra"},
        ],
    },
    "test.yaml",
)
KVM, FPGA = CONFIG.classes


def _slots(device: str, physical: str, healthy: bool = True) -> list[AdvertisedDevice]:
    return [
        AdvertisedDevice(name, healthy=healthy, physical=physical)
        for name in slot_names(device, KVM.sharing.replicas)
    ]


def _kvm_pool(*devices: tuple[str, str]) -> list[object]:
    advertised = [a for name, physical in devices for a in _slots(name, physical)]
    return list(pool_devices(DRIVER, KVM, advertised, {}, classes=CONFIG.class_names))


@pytest.mark.parametrize(
    ("slot", "device"), [("kvm-0", "kvm"), ("loop-3-12", "loop-3"), ("a-b-c-1023", "a-b-c")]
)
def test_a_slot_names_its_device(slot: str, device: str) -> None:
    assert slot_device(slot) == device
    assert slot in slot_names(device, 1024)


@pytest.mark.parametrize("text", ["kvm", "kvm-", "-3", "kvm-x"])
def test_what_is_no_slot_id_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a slot ID"):
        slot_device(text)


def test_the_slots_of_each_device_become_one_device_with_as_many_shares() -> None:
    slots = _kvm_pool(("kvm", "/sys/kvm"), ("kvm-b", "/sys/kvm-b"))
    assert [d.name for d in slots] == [f"kvm-kvm-{i}" for i in range(3)] + [
        f"kvm-kvm-b-{i}" for i in range(3)
    ]
    once = shared_once(slots, classes=CONFIG.class_names)  # type: ignore[arg-type]
    assert [(d.name, d.cdi_name, d.shares, d.slots) for d in once] == [
        ("kvm-kvm", "example.com/kvm=kvm-0", 3, 1),
        ("kvm-kvm-b", "example.com/kvm=kvm-b-0", 3, 1),
    ]
    assert all("slot" not in d.attributes for d in once)
    assert once[0].attributes["class"] == "kvm"


def test_unshared_devices_pass_as_they_are() -> None:
    plain = pool_devices(DRIVER, FPGA, [AdvertisedDevice("fpga0")], {}, classes=CONFIG.class_names)
    assert shared_once(plain, classes=CONFIG.class_names) == plain


def test_a_shared_device_is_one_multi_allocatable_device_with_its_shares() -> None:
    once = shared_once(_kvm_pool(("kvm", "/sys/kvm")), classes=CONFIG.class_names)  # type: ignore[arg-type]
    slices = build_slices(DRIVER, API_NODE, once, 1, node_uid="u")
    assert pool_problems(slices) == []
    assert [s.get("sharedCounters") for s in slices] == [None]
    (device,) = slices[0]["spec"]["devices"]
    assert device["name"] == "kvm-kvm"
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"] == {
        "shares": {
            "value": "3",
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}},
        }
    }
    assert "consumesCounters" not in device


def test_without_capacity_the_slots_consume_counters_as_before() -> None:
    slices = build_slices(DRIVER, API_NODE, _kvm_pool(("kvm", "/sys/kvm")), 1, node_uid="u")  # type: ignore[arg-type]
    assert pool_problems(slices) == []
    devices = [d for s in slices for d in s["spec"].get("devices") or ()]
    assert [d["name"] for d in devices] == [f"kvm-kvm-{i}" for i in range(3)]
    assert not any("allowMultipleAllocations" in d or "capacity" in d for d in devices)
    assert all(d["consumesCounters"] for d in devices)


def test_the_probe_is_a_slice_the_api_server_accepts() -> None:
    probe = probe_slice(DRIVER, API_NODE)
    # The oracle wants a name; the API server makes one from generateName.
    named = {**probe, "metadata": {"name": probe["metadata"]["generateName"] + "abcde"}}
    assert slice_problems(named) == []


async def test_an_api_server_that_keeps_the_field_serves_capacity_and_stores_nothing(
    api: FakeApiServer, client: ApiClient
) -> None:
    assert await consumable_capacity(client, DRIVER, API_NODE) is None
    assert api.slices == {}
    ((method, path, query),) = api.requests
    assert (method, path, query["dryRun"]) == ("POST", SLICES, ["All"])


async def test_an_api_server_that_drops_the_field_keeps_the_slots(
    api: FakeApiServer, client: ApiClient
) -> None:
    api.consumable_capacity = False
    why = await consumable_capacity(client, DRIVER, API_NODE)
    assert why == "the API server drops allowMultipleAllocations"
    assert api.slices == {}


async def test_a_refused_dry_run_keeps_the_slots_and_no_answer_is_retried(
    api: FakeApiServer, client: ApiClient
) -> None:
    refused = {"kind": "Status", "status": "Failure", "message": "denied by policy", "code": 403}
    api.answers[("POST", SLICES)] = Answer(403, json.dumps(refused).encode(), times=1)
    why = await consumable_capacity(client, DRIVER, API_NODE)
    assert why is not None and "refused a dry-run slice" in why and "denied by policy" in why
    busy = {**refused, "message": "etcd busy", "code": 500}
    api.answers[("POST", SLICES)] = Answer(500, json.dumps(busy).encode(), times=1)
    with pytest.raises(ApiServerError, match="etcd busy"):
        await consumable_capacity(client, DRIVER, API_NODE)


def test_a_later_drop_of_the_field_is_named_by_its_gate() -> None:
    """Asked at start; should the API server drop the field later (a rollback), the
    publisher's check of what was stored names the gate."""
    once = shared_once(_kvm_pool(("kvm", "/sys/kvm")), classes=CONFIG.class_names)  # type: ignore[arg-type]
    (sent,) = build_slices(DRIVER, API_NODE, once, 1, node_uid="u")
    stored = json.loads(json.dumps(sent))
    assert dropped_fields(sent, stored) == set()
    stored["spec"]["devices"][0].pop("allowMultipleAllocations")
    assert dropped_fields(sent, stored) == {"capacity"}
    assert GATES["capacity"].startswith("DRAConsumableCapacity ")
