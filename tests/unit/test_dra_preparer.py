"""The generic part of the DRA calls around the driver part, without the gRPC side: a call
reads its claims before it takes any lock, and calls on the same claim from several server
threads still never read it twice, record it twice, or leave a record behind an
unprepare."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from cdi_gen.dra.driver.preparer import PoolPreparer
from cdi_gen.dra.plugin.calls import ClaimCalls
from cdi_gen.dra.plugin.claims import ClaimRef, PrepareResult
from cdi_gen.dra.plugin.inflight import InFlight
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.errors import ClaimError
from cdi_gen.model import AllocatedDevice, ClaimView, PoolDevice
from tests.dracalls import driver_part_of
from tests.waiting import until_sync

DRIVER, POOL = "cdi-gen.example.com", "node-a"
REF = ClaimRef("default", "c1", "uid-1")


class BlockedReader:
    """A ClaimReader whose reads of claim ``c1`` wait for ``release``; counts the reads as
    they start. Claim ``c<n>`` (UID ``uid-<n>``) is allocated ``fpga-<n-1>``."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0
        #: Reads that answer that the API server did not answer, first.
        self.failing = 0
        self._lock = threading.Lock()

    def read_claims(
        self, refs: Sequence[tuple[str, str]], timeout: float
    ) -> list[ClaimView | ClaimError]:
        with self._lock:
            self.started += 1
            failing, self.failing = self.failing > 0, max(self.failing - 1, 0)
        if any(name == "c1" for _, name in refs):
            self.release.wait(timeout)
        if failing:
            return [ClaimError(f"claim {ns}/{name}: no answer") for ns, name in refs]
        return [_allocated(ns, name) for ns, name in refs]


def _allocated(namespace: str, name: str) -> ClaimView:
    n = int(name.removeprefix("c"))
    result = AllocatedDevice("fpga", DRIVER, POOL, f"fpga-{n - 1}")
    return ClaimView(namespace, name, f"uid-{n}", (result,))


@pytest.fixture
def reader() -> Iterator[BlockedReader]:
    reader = BlockedReader()
    yield reader
    reader.release.set()


@pytest.fixture
def preparer(tmp_path: Path, reader: BlockedReader) -> ClaimCalls:
    pool = DevicePool()
    pool.publish(
        "fpga",
        [PoolDevice(f"fpga-{i}", f"example.com/fpga={i}", "fpga", f"/sys/f{i}") for i in (0, 1)],
    )
    driver_part = PoolPreparer(
        DRIVER, pool, pool_name=POOL, cdi_kinds=["example.com/fpga"], state_dir=tmp_path
    )
    calls = ClaimCalls(DRIVER, driver_part, reader, pool=pool, max_reading_calls=4)
    calls.load()
    return calls


def _two_prepares(
    preparer: ClaimCalls, reader: BlockedReader
) -> tuple[list[PrepareResult], list[PrepareResult]]:
    """Prepare REF twice, the second call sent while the first one's read waits; the two
    answers."""
    with ThreadPoolExecutor(2) as threads:
        first = threads.submit(preparer.prepare, [REF], 20)
        until_sync(lambda: reader.started == 1, "the first read")
        second = threads.submit(preparer.prepare, [REF], 20)
        until_sync(lambda: preparer.in_flight.waits == 1, "the second prepare waiting")
        reader.release.set()
        return first.result(), second.result()


def test_a_second_prepare_of_a_claim_being_read_waits_and_reads_nothing(
    preparer: ClaimCalls, reader: BlockedReader
) -> None:
    answers = _two_prepares(preparer, reader)
    assert answers[0] == answers[1]
    [result] = answers[0]
    assert result.error == ""
    assert [d.device for d in result.devices] == ["fpga-0"]
    assert reader.started == 1


def test_a_second_prepare_reads_a_claim_the_first_could_not_read(
    preparer: ClaimCalls, reader: BlockedReader
) -> None:
    """The first call's read may fail within its own (shorter) deadline: the call that
    waited for it reads the claim itself rather than answer the first one's error."""
    reader.failing = 1
    [failed], [prepared] = _two_prepares(preparer, reader)
    assert failed.reason == "claim-read"
    assert "no answer" in failed.error
    assert prepared.error == ""
    assert [d.device for d in prepared.devices] == ["fpga-0"]
    assert reader.started == 2


def test_an_unprepare_during_a_prepare_removes_its_record(
    preparer: ClaimCalls, reader: BlockedReader
) -> None:
    with ThreadPoolExecutor(2) as threads:
        prepare: Future[list[PrepareResult]] = threads.submit(preparer.prepare, [REF], 20)
        until_sync(lambda: reader.started == 1, "the read")
        unprepare = threads.submit(preparer.unprepare, [REF], 20)
        until_sync(lambda: preparer.in_flight.waits == 1, "the unprepare waiting")
        reader.release.set()
        assert prepare.result()[0].error == ""
        assert unprepare.result() == [""]
    assert preparer.count == 0
    assert b"uid-1" not in driver_part_of(preparer).checkpoint.path.read_bytes()


def test_a_call_reads_its_other_claims_while_one_is_read_by_another_call(
    preparer: ClaimCalls, reader: BlockedReader
) -> None:
    """No lock is held while the API server answers: a call naming a claim that another
    call reads still reads (and prepares) its other claims meanwhile."""
    other = ClaimRef("default", "c2", "uid-2")
    with ThreadPoolExecutor(2) as threads:
        first = threads.submit(preparer.prepare, [REF], 20)
        until_sync(lambda: reader.started == 1, "the first read")
        second = threads.submit(preparer.prepare, [REF, other], 20)
        until_sync(lambda: reader.started == 2, "the second call's read of its other claim")
        until_sync(lambda: preparer.count == 1, "the other claim recorded")
        assert not first.done() and not second.done()
        reader.release.set()
        [mine] = first.result()
        theirs = second.result()
    assert theirs == [mine, theirs[1]]
    assert [d.device for d in theirs[1].devices] == ["fpga-1"]
    assert preparer.count == 2


def test_a_claim_held_longer_than_the_timeout_gets_an_error_to_retry(
    preparer: ClaimCalls, reader: BlockedReader
) -> None:
    with ThreadPoolExecutor(1) as threads:
        prepare = threads.submit(preparer.prepare, [REF], 20)
        until_sync(lambda: reader.started == 1, "the read")
        [error] = preparer.unprepare([REF], 0)
        [refused] = preparer.prepare([REF], 0.01)
        reader.release.set()
        prepare.result()
    assert error == "claim default/c1 (uid 'uid-1'): another call still prepares it; try again"
    assert refused.reason == "claim-read"
    assert "another call prepares or unprepares it; try again" in refused.error
    assert preparer.count == 1  # the unprepare that gave up changed nothing


def test_a_call_holds_its_claims_all_it_can_and_waits_for_the_others_bounded() -> None:
    """One call per claim at a time: a call takes what is free, waits for the rest only
    until its deadline, and a prepare takes over the answer of the prepare it waited for."""
    in_flight = InFlight(max_reading=1)
    mine, answered, late = in_flight.take(["a", "b"], prepare=True, deadline=0)
    assert (mine, answered, late) == (["a", "b"], {}, [])
    mine, answered, late = in_flight.take(["b", "c"], prepare=False, deadline=0)
    assert (mine, answered, late) == (["c"], {}, ["b"])
    with ThreadPoolExecutor(1) as threads:
        waiting = threads.submit(
            in_flight.take, ["a"], prepare=True, deadline=time.monotonic() + 20
        )
        until_sync(lambda: in_flight.waits == 1, "the second call waiting")
        answer = PrepareResult(error="refused", reason="in-use")
        in_flight.release("a", answer)
        assert waiting.result() == ([], {"a": answer}, [])
    with in_flight.reading() as first, in_flight.reading() as second:
        assert (first, second) == (True, False)
