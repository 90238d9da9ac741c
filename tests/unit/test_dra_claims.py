"""What NodePrepareResources answers for one claim: every rule, each naming the claim."""

from __future__ import annotations

import pytest

from cdi_gen.kubelet.claims import ClaimRefused, PreparedDevice, Refusal, prepare_claim
from cdi_gen.model import AllocatedDevice, ClaimView, PoolDevice

DRIVER, POOL = "cdi-gen.example.com", "node-a"
DEVICES = {
    d.name: d
    for d in (
        PoolDevice("fpga-0", "example.com/fpga=0", "fpga", "/p0"),
        PoolDevice("fpga-1", "example.com/fpga=1", "fpga", "/p1", healthy=False),
        PoolDevice("fpga-2", "example.com/fpga=2", "fpga", "/p2", gone=True),
        PoolDevice("fpga-3", "example.com/fpga=3", "fpga", "/p3"),
    )
}


def claim(*results: AllocatedDevice, uid: str = "u1", allocated: bool = True) -> ClaimView:
    return ClaimView("ns", "c", uid, tuple(results) if allocated else None)


def prepare(view: ClaimView, uid: str = "u1") -> list[PreparedDevice]:
    return prepare_claim(uid, view, driver=DRIVER, pool_name=POOL, devices=DEVICES)


def test_our_results_become_devices_in_order_and_others_are_ignored() -> None:
    view = claim(
        AllocatedDevice("b", DRIVER, POOL, "fpga-3"),
        AllocatedDevice("gpu", "gpu.example.com", "elsewhere", "gpu-0"),
        AllocatedDevice("a", DRIVER, POOL, "fpga-0", share_id="s"),
    )
    assert prepare(view) == [
        PreparedDevice(("b",), POOL, "fpga-3", ("example.com/fpga=3",)),
        PreparedDevice(("a",), POOL, "fpga-0", ("example.com/fpga=0",), "s"),
    ]


@pytest.mark.parametrize(
    ("view", "uid", "reason", "parts"),
    [
        (claim(uid="u2"), "u1", Refusal.UID_MISMATCH, ["'u1'", "'u2'"]),
        (claim(), "", Refusal.NO_UID, ["no claim UID"]),
        (claim(allocated=False), "u1", Refusal.NOT_ALLOCATED, ["not allocated"]),
        (
            claim(AllocatedDevice("r", "other.example.com", POOL, "fpga-0")),
            "u1",
            Refusal.NO_DEVICES,
            [f"no device of driver '{DRIVER}'"],
        ),
        (claim(), "u1", Refusal.NO_DEVICES, ["no device of driver"]),
        (
            claim(AllocatedDevice("r", DRIVER, "node-b", "fpga-0")),
            "u1",
            Refusal.OTHER_POOL,
            ["'fpga-0'", "'node-b'", f"'{POOL}'"],
        ),
        (
            claim(AllocatedDevice("r", DRIVER, POOL, "fpga-9")),
            "u1",
            Refusal.UNKNOWN_DEVICE,
            ["'fpga-9'", "request 'r'"],
        ),
        (
            claim(AllocatedDevice("r", DRIVER, POOL, "fpga-1")),
            "u1",
            Refusal.UNHEALTHY,
            ["'fpga-1'", "unhealthy"],
        ),
        (
            claim(AllocatedDevice("r", DRIVER, POOL, "fpga-2")),
            "u1",
            Refusal.GONE,
            ["'fpga-2'", "gone"],
        ),
        (
            # One bad device refuses the whole claim: the pod needs all of them.
            claim(
                AllocatedDevice("ok", DRIVER, POOL, "fpga-0"),
                AllocatedDevice("bad", DRIVER, POOL, "fpga-1"),
            ),
            "u1",
            Refusal.UNHEALTHY,
            ["request 'bad'"],
        ),
    ],
)
def test_refusals_name_the_claim_the_device_and_why(
    view: ClaimView, uid: str, reason: Refusal, parts: list[str]
) -> None:
    with pytest.raises(ClaimRefused) as refused:
        prepare(view, uid)
    assert refused.value.reason is reason
    message = str(refused.value)
    assert message.startswith(f"claim ns/c (uid {uid!r})"), message
    for part in parts:
        assert part in message, message
    assert "\n" not in message


def test_a_hostile_value_is_quoted_and_cut() -> None:
    view = claim(AllocatedDevice("r", DRIVER, POOL, "x" * 5000))
    with pytest.raises(ClaimRefused) as refused:
        prepare(view)
    assert len(str(refused.value)) < 400
