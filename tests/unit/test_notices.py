"""What the claims holding a device are told when it leaves and comes back: coalesced per
device and rate-limited, only holders told, the agent's announcements mapped to the pool
entries of the device (its slots too)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from cdi_gen.apiserver.events import Regarding
from cdi_gen.dra.plugin.claims import ClaimRef, HeldClaim, PreparedDevice
from cdi_gen.dra.plugin.notices import DeviceNotices
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.model import ClaimView, PoolDevice
from cdi_gen.paced import TokenBucket
from tests.waiting import until

DEVICE = PoolDevice("c-d0", "example.com/c=d0", "c", "/sys/d0")
HELD = HeldClaim(
    ClaimRef("ns", "claim", "uid-1"), (PreparedDevice(("r",), "n", "c-d0", (DEVICE.cdi_name,)),)
)


class Recorder:
    def __init__(self) -> None:
        self.said: list[tuple[Regarding, str, str, str, str]] = []

    def record(self, regarding: Regarding, type: str, reason: str, action: str, note: str) -> None:
        self.said.append((regarding, type, reason, action, note))

    async def close(self) -> None:
        pass


class Claims:
    def __init__(self) -> None:
        self.reads = 0

    async def get_claim(self, namespace: str, name: str) -> ClaimView:
        self.reads += 1
        return ClaimView(namespace, name, "uid-1", None, pods=(("app-0", "pod-uid"),))


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _notices(pool: DevicePool, recorder: Recorder, claims: Claims, clock: Clock) -> DeviceNotices:
    held = {"c-d0": [HELD]}
    return DeviceNotices(
        "example.com",
        "n",
        pool,
        lambda device: held.get(device, []),
        status=None,
        claims=claims,
        events=recorder,  # type: ignore[arg-type]
        bucket=TokenBucket(1, 1e-9, clock),
        clock=clock,
    )


async def test_a_flapping_device_is_told_once_as_it_is_now_and_its_claim_read_once() -> None:
    pool, recorder, claims, clock = DevicePool(), Recorder(), Claims(), Clock()
    notices = _notices(pool, recorder, claims, clock)
    gone = dataclasses.replace(DEVICE, gone=True, healthy=False)
    for _ in range(500):
        notices.published([DEVICE], [gone])
        notices.published([gone], [DEVICE])
    notices.published([DEVICE], [gone])  # it is away now
    await until(lambda: notices.told == 1, "the one notice told")
    ((regarding, kind, reason, _, note),) = recorder.said
    assert (regarding.kind, regarding.name, kind, reason) == (
        "Pod",
        "app-0",
        "Warning",
        "DeviceGone",
    )
    assert "tainted example.com/gone:NoSchedule" in note
    assert claims.reads == 1
    assert notices.conditions["c-d0"]["status"] == "False"
    await notices.close()


async def test_only_a_device_that_left_comes_back_and_only_holders_are_told() -> None:
    pool, recorder, claims, clock = DevicePool(), Recorder(), Claims(), Clock()
    notices = _notices(pool, recorder, claims, clock)
    other = PoolDevice("c-d1", "example.com/c=d1", "c", "/sys/d1")
    # Present from the start (an agent's start fills the pool): not a return.
    notices.published([], [DEVICE, other])
    notices.published([DEVICE, other], [DEVICE])  # d1 left, and no claim holds it
    await until(lambda: notices.told == 1, "d1's notice")
    assert recorder.said == []
    await notices.close()


async def test_an_announcement_reaches_each_pool_entry_of_the_device_its_slots_too() -> None:
    pool, recorder, claims, clock = DevicePool(), Recorder(), Claims(), Clock()
    slots = [
        PoolDevice(f"c-d0-{i}", f"example.com/c=d0-{i}", "c", "/sys/d0", slots=2) for i in range(2)
    ]
    pool.publish("c", [*slots, dataclasses.replace(DEVICE, name="c-d00", cdi_name="x/c=d00")])
    notices = _notices(pool, recorder, claims, clock)
    announced: list[tuple[str, Any]] = []
    notices.announce = lambda device, *args, **kw: announced.append((device, args))  # type: ignore[method-assign]
    await asyncio.to_thread(notices.announce_device, "c", "d0", "follow", ["done"], failed=False)
    await until(lambda: len(announced) == 2, "both slots announced")
    assert sorted(d for d, _ in announced) == ["c-d0-0", "c-d0-1"]
    await notices.close()
