"""Shared devices: slot naming, expansion of changes, and the allocation rules for slots."""

from __future__ import annotations

import pytest

from cdi_gen.deviceplugin.allocation import (
    AllocationError,
    AllocationRefusal,
    check_request,
    preferred_allocation,
)
from cdi_gen.discovery.sharing import expand_advertised, slot_names
from cdi_gen.errors import InvalidNameError
from cdi_gen.model import AdvertisedDevice


def test_slot_names_are_stable_and_valid() -> None:
    assert slot_names("kvm", 3) == ["kvm-0", "kvm-1", "kvm-2"]
    with pytest.raises(InvalidNameError, match="longer than 63"):
        slot_names("d" * 62, 10)


def _slots(
    physical: dict[str, int], replicas: int, numa: int | None = None
) -> dict[str, AdvertisedDevice]:
    devices = [AdvertisedDevice(name, True, numa, f"/sys/{name}") for name in physical]
    return {d.id: d for d in expand_advertised(devices, replicas)}


def test_slots_follow_physical_health() -> None:
    gone = AdvertisedDevice("loop300", healthy=False, physical="/sys/loop300")
    slots = expand_advertised([gone], 3)
    assert [s.id for s in slots] == ["loop300-0", "loop300-1", "loop300-2"]
    assert all(not s.healthy and s.physical == "/sys/loop300" for s in slots)


def test_one_slot_per_device_rule() -> None:
    devices = _slots({"a": 1, "b": 1}, 3)
    check_request(["a-0", "a-1"], devices, "example.com/x")  # allowed by default
    check_request(["a-0", "b-1"], devices, "example.com/x", one_per_physical=True)
    with pytest.raises(AllocationError) as info:
        check_request(["a-0", "b-0", "a-2"], devices, "example.com/x", one_per_physical=True)
    assert info.value.reason is AllocationRefusal.SAME_PHYSICAL
    assert "'a-0' and 'a-2'" in str(info.value) and "/sys/a" in str(info.value)


def test_preferred_allocation_spreads_or_packs_slots() -> None:
    devices = _slots({"a": 1, "b": 1, "c": 1}, 3)
    available = list(devices)
    spread = preferred_allocation(available, [], 3, devices, physical="spread")
    assert sorted({devices[i].physical for i in spread}) == ["/sys/a", "/sys/b", "/sys/c"]
    packed = preferred_allocation(available, [], 3, devices, physical="pack")
    assert len({devices[i].physical for i in packed}) == 1
    # pack fills the device already in use first
    partly_used = [i for i in available if i != "b-0"]
    assert set(preferred_allocation(partly_used, [], 2, devices, physical="pack")) == {"b-1", "b-2"}


def test_cli_spec_and_agent_agree_on_slot_order() -> None:
    """`cdi-gen write` (Discovery.document) and the agent (expand_change) list slots alike."""
    from cdi_gen.cdi.builder import assemble, build_entry
    from cdi_gen.cdi.codec import dump_document
    from cdi_gen.config.loader import parse_config
    from cdi_gen.discovery.inventory import Discovery
    from cdi_gen.discovery.sharing import expand_change
    from cdi_gen.model import DeviceRecord

    config = parse_config(
        {
            "vendor": "example.com",
            "classes": [
                {"name": "loop", "match": {"subsystem": "block"}, "sharing": {"replicas": 12}}
            ],
        },
        "t",
    )
    records = [
        DeviceRecord(
            sys_path=f"/sys/block/loop{n}",
            subsystem="block",
            sys_name=f"loop{n}",
            devnode=f"/dev/loop{n}",
        )
        for n in (3, 10)
    ]
    discovery = Discovery(config)
    (change,) = discovery.replace(records)
    doc = discovery.class_spec("loop").document
    assert doc is not None
    assert [d["name"] for d in doc["devices"]][:3] == ["loop10-0", "loop10-1", "loop10-2"]
    slots = expand_change(change, 12)
    entries = [build_entry(d.name, d.edits) for d in slots.devices]
    assert dump_document(assemble("example.com/loop", entries)) == dump_document(doc)
