"""The device plugin's answers as pure functions: ID checks, preferred allocation, annotations."""

from __future__ import annotations

import itertools
import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.deviceplugin.allocation import (
    AllocationError,
    AllocationRefusal,
    PhysicalPolicy,
    annotation_key,
    build_cdi_annotations,
    check_request,
    natural_key,
    preferred_allocation,
)
from cdi_gen.model import AdvertisedDevice

RESOURCE = "example.com/loop"


def board(*devices: AdvertisedDevice) -> dict[str, AdvertisedDevice]:
    return {d.id: d for d in devices}


BOARD = board(
    AdvertisedDevice("loop200"),
    AdvertisedDevice("loop201"),
    AdvertisedDevice("loop202", healthy=False),
)


# -- check_request -------------------------------------------------------------------------


def test_check_request_accepts_known_healthy_distinct_ids() -> None:
    check_request(["loop201", "loop200"], BOARD, RESOURCE)
    check_request([], BOARD, RESOURCE)


@pytest.mark.parametrize(
    ("ids", "reason", "device", "message"),
    [
        (
            ["loop9"],
            AllocationRefusal.UNKNOWN,
            "loop9",
            "unknown device 'loop9' for resource " + RESOURCE,
        ),
        (
            ["loop200", "loop200"],
            AllocationRefusal.DUPLICATE,
            "loop200",
            "device 'loop200' requested more than once for resource " + RESOURCE,
        ),
        (
            ["loop202"],
            AllocationRefusal.UNHEALTHY,
            "loop202",
            "device 'loop202' of resource example.com/loop is unhealthy",
        ),
        # The first bad ID in request order is the one reported.
        (["loop200", "loop202", "loop9"], AllocationRefusal.UNHEALTHY, "loop202", None),
    ],
    ids=["unknown", "duplicate", "unhealthy", "first-wins"],
)
def test_check_request_names_the_bad_id(
    ids: list[str], reason: AllocationRefusal, device: str, message: str | None
) -> None:
    with pytest.raises(AllocationError) as caught:
        check_request(ids, BOARD, RESOURCE)
    assert caught.value.reason is reason
    assert caught.value.device_id == device
    if message is not None:
        assert str(caught.value) == message


def test_natural_key_orders_numbers_by_value() -> None:
    ids = ["loop10", "loop9", "a", "loop100", "loop09", "b2c10", "b2c9"]
    assert sorted(ids, key=natural_key) == [
        "a",
        "b2c9",
        "b2c10",
        "loop09",
        "loop9",
        "loop10",
        "loop100",
    ]


# -- preferred_allocation: examples -------------------------------------------------------


def numa_board(
    layout: dict[int | None, int], unhealthy: frozenset[str] = frozenset()
) -> dict[str, AdvertisedDevice]:
    """``{node: count}`` → devices d0, d1, ... laid out node by node."""
    counter = itertools.count()
    devices: dict[str, AdvertisedDevice] = {}
    for node, count in layout.items():
        for _ in range(count):
            name = f"d{next(counter)}"
            devices[name] = AdvertisedDevice(name, healthy=name not in unhealthy, numa_node=node)
    return devices


def test_preferred_allocation_uses_the_smallest_node_that_fits() -> None:
    devices = numa_board({0: 3, 1: 2, 2: 4})  # d0-d2 | d3-d4 | d5-d8
    assert preferred_allocation(devices, [], 2, devices) == ["d3", "d4"]
    assert preferred_allocation(devices, [], 3, devices) == ["d0", "d1", "d2"]
    assert preferred_allocation(devices, [], 4, devices) == ["d5", "d6", "d7", "d8"]


def test_preferred_allocation_spans_the_fewest_nodes() -> None:
    devices = numa_board({0: 3, 1: 2, 2: 4})
    picked = preferred_allocation(devices, [], 6, devices)
    # 4 from node 2 and the remaining 2 from node 1, which fits them exactly.
    assert picked == ["d5", "d6", "d7", "d8", "d3", "d4"]


def test_preferred_allocation_fills_the_must_include_node_first() -> None:
    devices = numa_board({0: 3, 1: 2})
    assert preferred_allocation(devices, ["d4"], 3, devices) == ["d4", "d3", "d0"]
    assert preferred_allocation(devices, ["d0"], 2, devices) == ["d0", "d1"]


def test_preferred_allocation_puts_must_include_first_even_if_unhealthy() -> None:
    devices = numa_board({0: 2, 1: 2}, unhealthy=frozenset({"d3"}))
    assert preferred_allocation(["d0", "d1", "d2", "d3"], ["d3"], 2, devices) == ["d3", "d2"]


def test_preferred_allocation_takes_unhealthy_or_unknown_only_when_short() -> None:
    devices = numa_board({0: 2}, unhealthy=frozenset({"d1"}))
    assert preferred_allocation(["d1", "x", "d0"], [], 1, devices) == ["d0"]
    assert preferred_allocation(["d1", "x", "d0"], [], 3, devices) == ["d0", "d1", "x"]


def test_preferred_allocation_returns_what_there_is() -> None:
    devices = numa_board({0: 2})
    assert preferred_allocation(["d0", "d1", "d0"], [], 5, devices) == ["d0", "d1"]
    assert preferred_allocation(["d0"], [], 0, devices) == []
    assert preferred_allocation([], ["d0"], 2, devices) == []
    assert preferred_allocation(["d0", "d1"], ["d1", "d0", "zz"], 1, devices) == ["d0"]


def slots(physical: str, count: int, numa: int | None = 0) -> list[AdvertisedDevice]:
    return [
        AdvertisedDevice(f"{physical}-s{i}", numa_node=numa, physical=physical)
        for i in range(count)
    ]


def test_preferred_allocation_packs_or_spreads_physical_devices() -> None:
    devices = board(*slots("gpu0", 3), *slots("gpu1", 2))
    # gpu1 has fewer free slots (more used), so packing fills it first.
    assert preferred_allocation(devices, [], 3, devices, physical="pack") == [
        "gpu1-s0",
        "gpu1-s1",
        "gpu0-s0",
    ]
    assert preferred_allocation(devices, [], 3, devices, physical="spread") == [
        "gpu0-s0",
        "gpu1-s0",
        "gpu0-s1",
    ]


# -- preferred_allocation: properties -----------------------------------------------------

NODES = st.one_of(st.none(), st.integers(0, 3))
DEVICES = st.lists(
    st.builds(
        AdvertisedDevice,
        id=st.from_regex(r"[a-c][0-9]{1,2}", fullmatch=True),
        healthy=st.booleans(),
        numa_node=NODES,
        physical=st.sampled_from(["", "p0", "p1"]),
    ),
    max_size=14,
    unique_by=lambda d: d.id,
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[dict[str, AdvertisedDevice], list[str], list[str], int]:
    devices = board(*draw(DEVICES))
    ids = [*devices, "ghost1", "ghost2"]
    available = draw(st.lists(st.sampled_from(ids), max_size=16))
    must = draw(st.lists(st.sampled_from(ids), max_size=4))
    size = draw(st.integers(-1, 18))
    return devices, available, must, size


@given(requests(), st.sampled_from(["pack", "spread"]), st.randoms(use_true_random=False))
def test_preferred_allocation_properties(
    request: tuple[dict[str, AdvertisedDevice], list[str], list[str], int],
    physical: PhysicalPolicy,
    rnd: random.Random,
) -> None:
    devices, available, must, size = request
    picked = preferred_allocation(available, must, size, devices, physical=physical)
    pool = set(available)
    assert len(picked) == len(set(picked)), "no ID twice"
    assert set(picked) <= pool, "only available IDs"
    assert len(picked) == max(0, min(size, len(pool))), "exactly the size when possible"
    musts = sorted(set(must) & pool, key=natural_key)
    assert picked[: len(musts)] == musts[: max(size, 0)], "must-include first"
    # The answer depends on the sets, not on the order the kubelet sends them in.
    shuffled_available, shuffled_must = list(available), list(must)
    rnd.shuffle(shuffled_available)
    rnd.shuffle(shuffled_must)
    again = preferred_allocation(
        shuffled_available, shuffled_must, size, devices, physical=physical
    )
    assert again == picked
    # Healthy devices go before any unhealthy or unknown one.
    rest = picked[len(musts) :]
    healthy = [d in devices and devices[d].healthy for d in rest]
    assert healthy == sorted(healthy, reverse=True)


def fewest_nodes(sizes: list[int], need: int) -> int:
    """Brute force: the fewest groups whose sizes sum to at least ``need``."""
    for k in range(len(sizes) + 1):
        if any(sum(c) >= need for c in itertools.combinations(sizes, k)):
            return k
    raise AssertionError("not enough devices")


@given(st.lists(st.integers(1, 4), min_size=1, max_size=5), st.data())
def test_preferred_allocation_spans_no_more_nodes_than_needed(
    layout: list[int], data: st.DataObject
) -> None:
    devices = numa_board(dict(enumerate(layout)))
    size = data.draw(st.integers(1, sum(layout)))
    picked = preferred_allocation(devices, [], size, devices)
    used = {devices[d].numa_node for d in picked}
    assert len(used) == fewest_nodes(layout, size)


# -- annotations ------------------------------------------------------------------------


def test_annotation_key_follows_the_runtime_rules() -> None:
    assert annotation_key("vendor.gpu", "uuid/1") == "cdi.k8s.io/vendor.gpu_uuid_1"
    for plugin, device, rule in [
        ("", "x", "needs a plugin name"),
        ("p", "", "needs a plugin name"),
        ("p" * 60, "abcd", "longer than 63"),
        ("-p", "x", "starting and ending"),
        ("p", "x-", "starting and ending"),
        ("p q", "x", "A-Z a-z 0-9"),
    ]:
        with pytest.raises(ValueError, match=rule):
            annotation_key(plugin, device)


@given(
    st.from_regex(r"[A-Za-z]([A-Za-z0-9_.-]{0,250}[A-Za-z0-9])?", fullmatch=True),
    st.from_regex(r"[A-Za-z]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?", fullmatch=True),
    st.lists(st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True), min_size=1, max_size=4),
)
def test_build_cdi_annotations_always_gives_a_valid_key(
    vendor: str, cls: str, ids: list[str]
) -> None:
    names = [f"{vendor}/{cls}={i}" for i in ids]
    [(key, value)] = build_cdi_annotations(vendor, cls, names).items()
    name = key.removeprefix("cdi.k8s.io/")
    assert key.startswith("cdi.k8s.io/")
    assert len(name) <= 63
    assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?", name)
    assert value == ",".join(names)
    assert build_cdi_annotations(vendor, cls, names) == {key: value}
