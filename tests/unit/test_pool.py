"""The DRA pool: names as DNS labels, attributes from udev and templates, slots, versions."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen import names
from cdi_gen.config.deviceattributes import BUILT_IN, OWN
from cdi_gen.config.loader import load_config, parse_config
from cdi_gen.config.models import AgentConfig
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.discovery.sharing import expand_change
from cdi_gen.discovery.topology import NUMA_NODE
from cdi_gen.dra.driver.poolentries import device_name, pool_devices
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.dra.plugin.slices import device_taints
from cdi_gen.errors import ConfigError
from cdi_gen.model import DeviceRecord, ParentRecord, PoolDevice

CDI_DEVICE = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_.:-]{0,62})?", fullmatch=True)


@given(CDI_DEVICE)
def test_dns_label_always_gives_a_stable_label(name: str) -> None:
    label = names.dns_label(name)
    assert names.is_dns_label(label), label
    assert names.dns_label(name) == label


@given(CDI_DEVICE, CDI_DEVICE)
def test_dns_label_keeps_different_names_apart(a: str, b: str) -> None:
    if a != b:
        assert names.dns_label(a) != names.dns_label(b)


@pytest.mark.parametrize(
    ("name", "label"),
    [("loop7", "loop7"), ("fpga-0", "fpga-0"), ("Fpga_0", "fpga-0-"), ("__", "x")],
)
def test_dns_label_keeps_labels_and_readable_forms(name: str, label: str) -> None:
    assert names.dns_label(name).startswith(label)


def _config(cls: dict[str, Any]) -> AgentConfig:
    return parse_config({"vendor": "example.com", "classes": [cls]}, "test.yaml")


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
        **kw,
    )


def _pool(config: AgentConfig, records: list[DeviceRecord]) -> list[PoolDevice]:
    cls = config.classes[0]
    (change,) = Discovery(config).replace(records)
    change = expand_change(change, cls.sharing.replicas)
    by_name = {d.name: d for d in change.devices}
    return pool_devices(config.vendor, cls, change.after_write, by_name, classes=config.class_names)


LOOP = {"name": "loop", "match": {"subsystem": "block", "kernel": "loop*"}, "api": "dra"}


def test_attributes_from_udev_and_templates() -> None:
    config = _config({**LOOP, "attributes": {"disk": "{devtype}", "missing": "{property[NOPE]}"}})
    record = _loop(
        3,
        numa_node=1,
        properties={
            "ID_VENDOR": "ACME ",
            "ID_MODEL_FROM_DATABASE": "Frobnicator",
            "ID_SERIAL": "x" * 65,
        },
        parents=(ParentRecord("/sys/devices/virtual", "virtual", driver="loopdrv"),),
    )
    (device,) = _pool(config, [record])
    assert device.name == "loop-loop3"
    assert device.cdi_name == "example.com/loop=loop3"
    assert dict(device.attributes) == {
        "class": "loop",
        "cdiName": "example.com/loop=loop3",
        "subsystem": "block",
        "kernelName": "loop3",
        "driver": "loopdrv",
        "vendor": "ACME",
        "model": "Frobnicator",
        "numaNode": 1,
        # Kubernetes' standard name beside it (KEP-6072), for a claim's matchAttribute
        NUMA_NODE: 1,
        # the 65-character serial does not fit a ResourceSlice string; the unrenderable
        # template is left out, the device is not
        "disk": "disk",
    }


def test_slots_share_their_physical_device() -> None:
    config = _config({**LOOP, "sharing": {"replicas": 3}})
    devices = _pool(config, [_loop(1), _loop(2)])
    assert [d.name for d in devices] == [f"loop-loop{n}-{s}" for n in (1, 2) for s in range(3)]
    assert [d.attributes["slot"] for d in devices] == [0, 1, 2, 0, 1, 2]
    assert {d.slots for d in devices} == {3}
    assert len({d.physical for d in devices}) == 2


def test_the_reserved_attribute_names_are_exactly_those_the_pool_sets_itself() -> None:
    # The config refuses a class's own attribute under a reserved name and bounds the class's
    # own ones by what the reserved names leave of a device's 32: a name reserved but never
    # set costs every class a slot, one set but not reserved could be overwritten. Every
    # attribute the pool can set is here (udev properties, a driver, a NUMA node, a slot);
    # the standard ones (a domain, never a C identifier) take only the room that is left.
    config = _config({**LOOP, "sharing": {"replicas": 2}})
    record = _loop(
        3,
        numa_node=1,
        properties={"ID_VENDOR": "v", "ID_MODEL": "m", "ID_SERIAL": "s"},
        parents=(ParentRecord("/sys/devices/virtual", "virtual", driver="loopdrv"),),
    )
    for device in _pool(config, [record]):
        own = {k for k in device.attributes if "/" not in k}
        # ``part`` is a composite group's, which is never shared: it takes the slot's room.
        assert own == OWN - {"part"}
    composite = _config(
        {
            **LOOP,
            "group": {"by": "parent", "subsystem": "block", "offer": "both"},
            "deviceName": "{group}",
        }
    )
    for device in _pool(composite, [record]):
        own = {k for k in device.attributes if "/" not in k}
        assert own == OWN - {"slot"}


def test_when_gone_taint_keeps_the_device_marked_gone() -> None:
    config = _config({**LOOP, "whenGone": "taint"})
    discovery = Discovery(config)
    discovery.replace([_loop(4)])
    remove = DeviceRecord(
        sys_path="/sys/devices/virtual/block/loop4",
        subsystem="block",
        sys_name="loop4",
        action="remove",
    )
    (change,) = discovery.apply([remove])
    cls = config.classes[0]
    (device,) = pool_devices(
        "example.com", cls, change.after_write, {d.name: d for d in change.devices}, classes=()
    )
    assert (device.healthy, device.gone, device.taint_when_gone) == (False, True, True)


@pytest.mark.parametrize(
    ("extra", "taints"),
    [
        # A DRA class whose devices come back keeps a gone device, whatever whenGone says:
        # NoSchedule keeps new claims off it; whenGone: taint keeps its NoExecute eviction.
        (
            {"api": "dra", "whenBack": "follow"},
            [{"key": "example.com/gone", "effect": "NoSchedule"}],
        ),
        (
            {"api": "dra", "whenBack": "restart"},
            [{"key": "example.com/gone", "effect": "NoSchedule"}],
        ),
        (
            {"api": "dra", "whenBack": "follow", "whenGone": "unhealthy"},
            [{"key": "example.com/gone", "effect": "NoSchedule"}],
        ),
        (
            {"api": "dra", "whenBack": "restart", "whenGone": "taint"},
            [{"key": "example.com/gone", "effect": "NoExecute"}],
        ),
        # whenBack: keep, or a device plugin's class: withdrawn as before.
        ({"api": "dra", "whenBack": "keep"}, None),
        ({"api": "devicePlugin", "whenBack": "follow"}, None),
    ],
)
def test_a_gone_device_of_a_class_whose_devices_come_back_stays_in_the_slice_tainted(
    extra: dict[str, Any], taints: list[dict[str, str]] | None
) -> None:
    config = _config({**LOOP, **extra})
    discovery = Discovery(config)
    discovery.replace([_loop(4)])
    remove = DeviceRecord(
        sys_path="/sys/devices/virtual/block/loop4",
        subsystem="block",
        sys_name="loop4",
        action="remove",
    )
    (change,) = discovery.apply([remove])
    devices = pool_devices(
        "example.com",
        config.classes[0],
        change.after_write,
        {d.name: d for d in change.devices},
        classes=(),
    )
    if taints is None:
        assert devices == []
        return
    (device,) = devices
    assert (device.healthy, device.gone) == (False, True)
    assert device_taints("example.com", device) == taints
    # Back: the taint goes.
    (change,) = discovery.apply([_loop(4)])
    (device,) = pool_devices(
        "example.com",
        config.classes[0],
        change.after_write,
        {d.name: d for d in change.devices},
        classes=(),
    )
    assert (device.healthy, device.gone) == (True, False)
    assert device_taints("example.com", device) == []


def test_pool_versions_wake_waiters_once_per_change() -> None:
    async def main() -> None:
        pool = DevicePool()
        a = PoolDevice(name="a", cdi_name="v.com/c=a", class_name="c", physical="/a")
        waiter = asyncio.ensure_future(pool.wait_newer(0))
        assert pool.publish("c", [a])
        assert await waiter == 1
        assert not pool.publish("c", [a])  # unchanged: no new version
        assert pool.version == 1
        pool.publish("d", [dataclasses.replace(a, name="b", class_name="d")])
        assert list(pool.devices) == ["a", "b"]
        pool.publish("c", [])
        assert list(pool.devices) == ["b"] and pool.get("a") is None

    asyncio.run(main())


def test_device_name_includes_the_class() -> None:
    classes = ("fpga", "loop")
    assert device_name("fpga", "fpga0", classes) != device_name("loop", "fpga0", classes)


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"9lives": "{kernel}"}, "is not a C identifier"),
        ({"x" * 33: "{kernel}"}, "is not a C identifier"),
        ({"class": "{kernel}"}, "is one cdi-gen sets itself"),
        ({"numaNode": "{numa}"}, "is one cdi-gen sets itself"),
        # Kubernetes' standard names (the pool sets them) and any other qualified name.
        ({"resource.kubernetes.io/numaNode": "{numa}"}, "'resource.kubernetes.io/numaNode' has"),
        ({"resource.kubernetes.io/pciBusID": "{kernel}"}, "has a domain"),
        ({"example.com/x": "{kernel}"}, "'example.com/x' has a domain"),
        ({"ok": "{nope}"}, "nope"),
    ],
)
def test_bad_attributes_are_config_errors(attributes: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _config({**LOOP, "attributes": attributes})
    assert message in str(info.value)
    assert "classes[0].attributes" in str(info.value)


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_a_class_may_not_use_a_name_the_pool_sets_itself(name: str) -> None:
    # The config reads the same table the pool builder does (see test_numa.py's
    # test_the_pool_sets_exactly_the_attributes_of_the_table).
    with pytest.raises(ConfigError) as info:
        _config({**LOOP, "attributes": {name: "{kernel}"}})
    assert ("is one cdi-gen sets itself" if name in OWN else "has a domain") in str(info.value)


def test_api_must_be_known() -> None:
    with pytest.raises(ConfigError) as info:
        _config({**LOOP, "api": "grpc"})
    assert "classes[0].api" in str(info.value) and "'grpc'" in str(info.value)


def test_the_cache_rebuilds_only_what_changed_and_gives_the_same_entries() -> None:
    config = _config(LOOP)
    cls = config.classes[0]
    discovery = Discovery(config)
    (change,) = discovery.replace([_loop(1), _loop(2)])
    cache: dict[str, Any] = {}
    by_name = {d.name: d for d in change.devices}
    first = pool_devices("example.com", cls, change.after_write, by_name, cache, classes=())
    assert first == pool_devices("example.com", cls, change.after_write, by_name, classes=())
    (change,) = discovery.apply([dataclasses.replace(_loop(3), action="add")])
    by_name = {d.name: d for d in change.devices}
    second = pool_devices("example.com", cls, change.after_write, by_name, cache, classes=())
    assert second == pool_devices("example.com", cls, change.after_write, by_name, classes=())
    assert second[0] is first[0] and second[1] is first[1]  # unchanged: not built again
    assert set(cache) == {"loop1", "loop2", "loop3"}
    unhealthy = [dataclasses.replace(a, healthy=False) for a in change.after_write]
    third = pool_devices("example.com", cls, unhealthy, by_name, cache, classes=())
    assert [d.healthy for d in third] == [False] * 3


# --- device names: unique on the node by construction -----------------------------------------

CLASS = st.from_regex(r"[A-Za-z][A-Za-z0-9_.-]{0,20}[A-Za-z0-9]", fullmatch=True)
LABEL_CLASS = st.from_regex(r"[a-z]{1,3}(-[a-z0-9]{1,3}){0,3}", fullmatch=True).filter(
    lambda c: len(c) > 1
)
LABEL_DEVICE = st.from_regex(r"[a-z0-9]{1,3}(-[a-z0-9]{1,3}){0,3}", fullmatch=True)


def _derived_classes(base: list[str]) -> list[str]:
    # Classes that extend another with "-x", the case where plain joining is ambiguous.
    return sorted({*base, *(f"{a}-{b}" for a in base for b in base)})


@given(
    st.lists(LABEL_CLASS | CLASS, min_size=1, max_size=4, unique=True),
    st.lists(st.tuples(st.integers(0, 30), LABEL_DEVICE | CDI_DEVICE), min_size=2, max_size=30),
)
def test_device_names_are_unique_for_any_classes_and_devices(
    base: list[str], picks: list[tuple[int, str]]
) -> None:
    classes = _derived_classes(base)
    pairs = {(classes[i % len(classes)], d) for i, d in picks}
    # Devices of a longer class spelled as the shorter class plus a device, and back.
    pairs |= {
        (c, f"{o[len(c) + 1 :]}-{d}") for c, d in pairs for o in classes if o.startswith(f"{c}-")
    }
    by_name: dict[str, tuple[str, str]] = {}
    for c, d in pairs:
        name = device_name(c, d, classes)
        assert names.is_dns_label(name), name
        assert by_name.setdefault(name, (c, d)) == (c, d), (name, by_name[name], (c, d))
        assert device_name(c, d, classes) == name  # stable


def test_classes_that_join_alike_get_different_names() -> None:
    # Issue 26, item 9: both pairs join as "ab-cd-c". The longer class keeps the readable
    # name (it is the one the name starts with); the other pair is hashed.
    classes = ("ab", "ab-cd")
    assert device_name("ab-cd", "c", classes) == "ab-cd-c"
    other = device_name("ab", "cd-c", classes)
    assert other != "ab-cd-c" and other.startswith("ab-cd-c--")
    # Without the longer class, the readable name stays; catalogue names are unchanged.
    assert device_name("ab", "cd-c", ("ab",)) == "ab-cd-c"
    catalogue = load_config(None).class_names
    assert device_name("fpga", "region0", catalogue) == "fpga-region0"
    assert device_name("fpga-port", "dfl-port-0", catalogue) == "fpga-port-dfl-port-0"
    assert device_name("kvm", "kvm-3", catalogue) == "kvm-kvm-3"


def test_the_pool_never_holds_two_devices_under_one_name() -> None:
    pool = DevicePool()
    a = PoolDevice(name="same", cdi_name="v.com/a=x", class_name="a", physical="/a")
    b = PoolDevice(name="same", cdi_name="v.com/b=y", class_name="b", physical="/b")
    pool.publish("a", [a])
    pool.publish("b", [b])
    assert dict(pool.devices) == {"same": a}


def test_attribute_limits_are_bytes_and_numbers_fit_int64() -> None:
    # Issue 26, item 10: 64 characters but 128 bytes; 80 bytes from a template; a NUMA node
    # beyond int64. Each value is left out, the device stays.
    config = _config({**LOOP, "attributes": {"fw": "{property[FW]}", "ok": "{property[OK]}"}})
    record = dataclasses.replace(
        _loop(1, properties={"ID_VENDOR": "é" * 64, "FW": "x" * 80, "OK": "é" * 32}),
        numa_node=2**64,
    )
    (device,) = _pool(config, [record])
    assert "vendor" not in device.attributes and "fw" not in device.attributes
    assert "numaNode" not in device.attributes and NUMA_NODE not in device.attributes
    assert device.attributes["ok"] == "é" * 32  # 64 bytes: the limit itself fits
    lone = _loop(2, properties={"ID_MODEL": "bad\udcff"})  # not UTF-8: cannot be sent
    (device,) = _pool(config, [lone])
    assert "model" not in device.attributes
