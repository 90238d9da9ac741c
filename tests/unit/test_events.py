"""Events (events.k8s.io/v1) through the real API client against the fake API server:
written as the API validates them, a repeated Event counted in its series, a flapping
device's Events coalesced and rate-limited, the pending ones bounded."""

from __future__ import annotations

import datetime
import logging

import pytest

from cdi_gen.apiserver.client import ApiClient
from cdi_gen.apiserver.events import EventRecorder, Regarding
from cdi_gen.paced import TokenBucket
from tests.fakes.apiserver import FakeApiServer
from tests.waiting import until

POD = Regarding("Pod", "ns", "app-0", "pod-uid")
WHEN = datetime.datetime(2026, 12, 3, 14, 0, 0, tzinfo=datetime.UTC)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _recorder(client: ApiClient, clock: Clock, burst: int = 25, rate: float = 0.5) -> EventRecorder:
    return EventRecorder(
        client,
        "example.com",
        "example.com/node-a",
        bucket=TokenBucket(burst, rate, clock),
        clock=clock,
        now=lambda: WHEN,
    )


def test_the_bucket_gives_its_burst_then_one_per_interval() -> None:
    clock = Clock()
    bucket = TokenBucket(2, 0.5, clock)
    assert (bucket.take(), bucket.take()) == (0.0, 0.0)
    assert bucket.take() == pytest.approx(2.0)
    clock.now += 2.0
    assert bucket.take() == 0.0
    clock.now += 100.0  # idle: no more than the burst saved up
    assert [bucket.take() for _ in range(3)][2] > 0


async def test_an_event_is_written_as_the_api_validates_it_and_a_repeat_is_its_series(
    api: FakeApiServer, client: ApiClient
) -> None:
    clock = Clock()
    recorder = _recorder(client, clock)
    recorder.record(POD, "Warning", "DeviceGone", "Taint", "device loop-a left node n")
    await until(lambda: recorder.written == 1, "the Event written")
    ((key, event),) = api.events.items()
    assert key[0] == "ns" and key[1].startswith("app-0.")
    assert event["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ns",
        "name": "app-0",
        "uid": "pod-uid",
    }
    assert (event["type"], event["reason"], event["action"]) == ("Warning", "DeviceGone", "Taint")
    assert event["reportingController"] == "example.com"
    assert event["eventTime"] == "2026-12-03T14:00:00.000000Z"
    assert "series" not in event

    recorder.record(POD, "Warning", "DeviceGone", "Taint", "device loop-a left node n")
    await until(lambda: recorder.written == 2, "the repeat written")
    assert len(api.events) == 1, "a repeat is counted, not a new Event"
    assert event["series"] == {"count": 2, "lastObservedTime": "2026-12-03T14:00:00.000000Z"}
    assert api.requests[-1][0] == "PATCH"

    # Past the series' window, or said otherwise: a new Event.
    clock.now += 601
    recorder.record(POD, "Warning", "DeviceGone", "Taint", "device loop-a left node n")
    recorder.record(POD, "Normal", "DeviceBack", "Untaint", "device loop-a came back")
    await until(lambda: recorder.written == 4, "both written")
    assert len(api.events) == 3
    await recorder.close()


async def test_a_flapping_device_is_coalesced_and_rate_limited(
    api: FakeApiServer, client: ApiClient
) -> None:
    # Burst 2, then (in this test's time) never another token: a thousand flaps write
    # two Events, each counting what it stands for, the last one what was said last.
    clock = Clock()
    recorder = _recorder(client, clock, burst=2, rate=1e-9)
    left = (POD, "Warning", "DeviceGone", "Taint", "left")
    back = (POD, "Normal", "DeviceBack", "Untaint", "back")
    for _ in range(1000):
        recorder.record(*left)  # type: ignore[arg-type]
        recorder.record(*back)  # type: ignore[arg-type]
    await until(lambda: recorder.written == 2, "the burst written")
    writes = [r for r in api.requests if "/events" in r[1]]
    assert len(writes) == 2
    first, last = api.events.values()  # in the order written
    assert (first["reason"], first["series"]["count"]) == ("DeviceGone", 1000)
    assert (last["reason"], last["series"]["count"]) == ("DeviceBack", 1000)
    await recorder.close()


async def test_what_waits_is_bounded_and_its_drops_are_said_once(
    api: FakeApiServer, client: ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    recorder = EventRecorder(
        client,
        "example.com",
        "example.com/node-a",
        bucket=TokenBucket(1, 1e-9, clock),
        clock=clock,
        max_pending=3,
    )
    caplog.set_level(logging.WARNING, "cdi_gen.apiserver.events")
    for i in range(10):
        recorder.record(Regarding("Pod", "ns", f"p{i}", f"u{i}"), "Normal", "R", "A", "n")
    assert recorder.dropped >= 6
    assert sum("Events wait to be written" in r.message for r in caplog.records) == 1
    await recorder.close()


async def test_a_refused_event_is_one_line_and_the_next_is_written(
    api: FakeApiServer, client: ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    recorder = _recorder(client, clock)
    caplog.set_level(logging.WARNING, "cdi_gen.apiserver.events")
    # A regarding object in another namespace than the Event's: refused (422).
    bad = Regarding("Pod", "ns", "p", "u")
    recorder.record(bad, "Normal", "", "A", "no reason")
    recorder.record(POD, "Normal", "DeviceBack", "Untaint", "back")
    await until(lambda: recorder.written == 1, "the good one written")
    assert any("Event  on Pod ns/p not written" in r.message for r in caplog.records)
    await recorder.close()
