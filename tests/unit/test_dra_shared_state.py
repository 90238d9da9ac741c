"""Two instances of one DRA driver on a node (a rolling update) share their state through
files: either may get any call, so a claim prepared by one is answered, unprepared and held
by the other (also one with specs of its own: the checkpoint names them); the lock between
them is a real flock, held across processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.cdi.codec import dump_document
from cdi_gen.cdi.store import SpecStore
from cdi_gen.dra.driver.checkpoint import CheckpointError
from cdi_gen.dra.driver.claimfiles import ClaimFiles
from cdi_gen.dra.driver.preparer import PoolPreparer
from cdi_gen.dra.driver.refusal import DriverRefusal
from cdi_gen.dra.driver.statelock import StateLock, StateLockError, lock_path
from cdi_gen.dra.plugin.calls import ClaimCalls
from cdi_gen.dra.plugin.claims import ClaimRef
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.model import PoolDevice
from tests.dracalls import claim_calls, driver_part_of
from tests.fakes.countingclaims import CountingClaims

DRIVER, POOL = "cdi-gen.example.com", "node-a"
FIRST = ClaimRef("default", "c1", "uid-1")
SECOND = ClaimRef("default", "c2", "uid-2")


def _instance(
    state_dir: Path, reader: CountingClaims, specs: ClaimFiles | None = None
) -> ClaimCalls:
    pool = DevicePool()
    pool.publish("fpga", [PoolDevice("fpga-0", "example.com/fpga=0", "fpga", "/sys/f0")])
    preparer = claim_calls(
        PoolPreparer(
            DRIVER,
            pool,
            pool_name=POOL,
            cdi_kinds=["example.com/fpga"],
            state_dir=state_dir,
            claim_files=specs,
        ),
        reader,
    )
    preparer.load()
    return preparer


@pytest.fixture
def readers() -> tuple[CountingClaims, CountingClaims]:
    return CountingClaims(DRIVER, POOL), CountingClaims(DRIVER, POOL)


@pytest.fixture
def pair(
    tmp_path: Path, readers: tuple[CountingClaims, CountingClaims]
) -> tuple[ClaimCalls, ClaimCalls]:
    old, new = readers
    return _instance(tmp_path, old), _instance(tmp_path, new)


def test_a_claim_prepared_by_one_instance_is_answered_by_the_other_without_a_read(
    pair: tuple[ClaimCalls, ClaimCalls], readers: tuple[CountingClaims, CountingClaims]
) -> None:
    old, new = pair
    [prepared] = old.prepare([FIRST], 5)
    assert prepared.error == "" and readers[0].reads == 1
    [again] = new.prepare([FIRST], 5)
    assert again == prepared
    assert readers[1].reads == 0  # from the shared checkpoint, not the API server


def test_a_device_held_through_one_instance_is_refused_by_the_other(
    pair: tuple[ClaimCalls, ClaimCalls],
) -> None:
    old, new = pair
    assert old.prepare([FIRST], 5)[0].error == ""
    [refused] = new.prepare([SECOND], 5)
    assert refused.reason == str(DriverRefusal.IN_USE)
    assert "in use by claim default/c1" in refused.error


def test_an_unprepare_through_the_other_instance_frees_the_claim_for_both(
    pair: tuple[ClaimCalls, ClaimCalls], readers: tuple[CountingClaims, CountingClaims]
) -> None:
    old, new = pair
    assert old.prepare([FIRST], 5)[0].error == ""
    assert new.unprepare([FIRST], 5) == [""]
    assert new.count == 0
    # The old instance reads the change: the device is free, the claim read anew.
    [other] = old.prepare([SECOND], 5)
    assert other.error == ""
    assert old.count == 1 and set(driver_part_of(old).checkpoint.claims) == {"uid-2"}
    assert new.prepare([FIRST], 5)[0].reason == str(DriverRefusal.IN_USE)


def test_a_claim_with_specs_of_its_own_is_shared_through_the_checkpoint(
    tmp_path: Path, readers: tuple[CountingClaims, CountingClaims]
) -> None:
    # With device metadata every claim gets a spec of its own, recorded with the claim.
    spec_dir, metadata = tmp_path / "cdi", tmp_path / "metadata"
    store = SpecStore()
    doc = assemble("example.com/fpga", [build_entry("0", {"deviceNodes": [{"path": "/dev/null"}]})])
    store.sync(spec_dir, "example.com", "fpga", dump_document(doc), instance=None)

    def specs() -> ClaimFiles:
        return ClaimFiles(
            spec_dir, "example.com", store=store, driver=DRIVER, metadata_dir=metadata
        )

    old = _instance(tmp_path / "state", readers[0], specs())
    new = _instance(tmp_path / "state", readers[1], specs())
    [prepared] = old.prepare([FIRST], 5)
    assert prepared.error == ""
    assert (spec_dir / "example.com-fpga@uid-1.metadata.json").is_file()
    assert new.prepare([FIRST], 5) == [prepared]
    assert readers[1].reads == 0  # from the shared checkpoint, not the API server
    assert new.unprepare([FIRST], 5) == [""]
    assert sorted(p.name for p in spec_dir.iterdir()) == [
        ".example.com-fpga.json.cdi-gen-owner",
        "example.com-fpga.json",
    ]
    assert list(metadata.iterdir()) == []
    assert old.prepare([SECOND], 5)[0].error == ""  # the device is free for the old one too


def test_the_lock_is_the_same_whatever_instance_made_it(tmp_path: Path) -> None:
    lock = StateLock(lock_path(tmp_path, DRIVER))
    with lock.held(1) as stale:
        assert stale  # never looked: read the state
    with lock.held(1) as stale:
        assert not stale  # nobody changed it since
    other = StateLock(lock_path(tmp_path, DRIVER))
    with other.held(1):
        other.changed()
    assert not lock.fresh()
    with lock.held(1) as stale:
        assert stale
    assert lock.fresh()


HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.readline()
    """
)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the driver's state lock until told (a line on its stdin)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock_path(tmp_path, DRIVER))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    try:
        yield proc
    finally:
        proc.kill()
        proc.communicate()


def test_a_lock_held_by_another_process_bounds_the_wait_and_is_then_taken(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    lock = StateLock(lock_path(tmp_path, DRIVER))
    with pytest.raises(StateLockError) as refused, lock.held(0.05):
        pass
    assert "another instance of the driver held the DRA state lock" in str(refused.value)
    assert isinstance(refused.value, CheckpointError)  # answered as the checkpoint's failure
    assert holder.stdin is not None
    holder.stdin.write("go\n")
    holder.stdin.flush()
    holder.wait()
    with lock.held(5) as stale:
        assert stale


@pytest.mark.parametrize("call", ["prepare", "unprepare"])
def test_a_call_waits_for_the_other_instance_no_longer_than_its_own_deadline(
    tmp_path: Path,
    readers: tuple[CountingClaims, CountingClaims],
    holder: subprocess.Popen[str],
    call: str,
) -> None:
    """Every wait on the prepare path is bounded by what is left of the call's deadline:
    with the state lock held elsewhere, a call given 0.1 s answers an error to retry at
    once, never after a wait of its own choosing (the load took the lock before)."""
    calls = _instance(tmp_path / "own", readers[0])
    calls.preparer.state.path = lock_path(tmp_path, DRIVER)  # type: ignore[attr-defined]
    calls.preparer.state.close()  # type: ignore[attr-defined]
    with ThreadPoolExecutor(1) as threads:
        if call == "prepare":
            answer = threads.submit(calls.prepare, [FIRST], 0.1)
            [result] = answer.result(timeout=3)  # unbounded, this raises TimeoutError
            # The look at what was prepared took the call's whole time: not read.
            assert result.reason == "claim-read", result
            assert "not read, the caller's deadline has passed" in result.error
        else:
            unprepared = threads.submit(calls.unprepare, [FIRST], 0.1)
            [error] = unprepared.result(timeout=3)
            assert "another instance of the driver held the DRA state lock" in error
