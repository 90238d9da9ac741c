"""A full spec folder never leaves a refused DRA claim's owner record behind (issue 53, item 9).

On a real small tmpfs, mounted in a private mount namespace (so nothing outlives the test,
even if it is killed), the DRA driver's preparer with per-claim specs (the agent's own
``PoolPreparer`` and ``ClaimFiles``; the metadata folder on the test's disk) prepares a
configured claim with the folder filled so that an owner record fits but its spec does not:
one page left, so the record is written and the spec's write fails; three pages left for a
claim with two specs, so the first spec and the second's record are written and the second
spec fails; one inode left, so the spec's temporary file cannot be created. Each time the
claim is refused naming the full disk, and the folder holds exactly what it held before (no
record, no spec, no temporary; no metadata file), also after the claim is unprepared; with
room again, the same claim prepares and unprepares cleanly.
"""

from __future__ import annotations

import errno
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.cdi.codec import dump_document
from cdi_gen.cdi.store import SpecStore
from cdi_gen.cdi.writer import write_bytes
from cdi_gen.dra.driver import claimfiles
from cdi_gen.dra.driver.claimfiles import ClaimFiles
from cdi_gen.dra.driver.preparer import PoolPreparer
from cdi_gen.dra.plugin.claims import ClaimRef
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.model import AllocatedDevice, ClaimView, ConfigEntry, PoolDevice
from tests.dracalls import claim_calls, driver_part_of
from tests.mountns import reported, run_private

pytestmark = pytest.mark.timeout(120)

SCENARIO = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from pathlib import Path

    from cdi_gen.cdi.builder import assemble, build_entry
    from cdi_gen.cdi.codec import dump_document
    from cdi_gen.cdi.store import SpecStore
    from cdi_gen.dra.driver.claimfiles import ClaimFiles
    from cdi_gen.dra.driver.preparer import PoolPreparer
    from cdi_gen.dra.plugin.calls import ClaimCalls
    from cdi_gen.dra.plugin.claims import ClaimRef
    from cdi_gen.dra.plugin.pool import DevicePool
    from cdi_gen.model import AllocatedDevice, ClaimView, ConfigEntry, PoolDevice

    mnt, work, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    DRIVER, POOL, UID = "cdi-gen.example.com", "node-a", "5d1c7c2e-9a43-4a57-8d1e-0c0a6f1f2b3c"
    KINDS = ("fpga", "gpu")
    options = "size=256k" + (",nr_inodes=64" if mode == "inodes" else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], check=True)
    spec_dir, metadata_dir = mnt / "cdi", work / "metadata"

    store = SpecStore()
    pool = DevicePool()
    for cls in KINDS:
        entries = [build_entry("0", {"deviceNodes": [{"path": "/dev/null"}]})]
        data = dump_document(assemble(f"example.com/{cls}", entries))
        store.sync(spec_dir, "example.com", cls, data, instance=None)
        attributes = {"class": cls, "numaNode": 0, "shared": False}
        device = PoolDevice(f"{cls}-0", f"example.com/{cls}=0", cls, f"/sys/{cls}0",
                            attributes=attributes)
        pool.publish(cls, [device])

    configured = KINDS if mode == "second-spec" else KINDS[:1]
    params = {"apiVersion": "cdi-gen.io/v1alpha1", "kind": "DeviceConfig", "env": {"M": "c"}}
    claim = ClaimView(
        "default",
        "c1",
        UID,
        tuple(AllocatedDevice(cls, DRIVER, POOL, f"{cls}-0") for cls in configured),
        (ConfigEntry("FromClaim", DRIVER, (), params, 0),),
    )

    class Claims:
        def read_claims(self, refs, timeout):
            return [claim for _ in refs]

    preparer = ClaimCalls(DRIVER, PoolPreparer(
        DRIVER,
        pool,
        pool_name=POOL,
        cdi_kinds=[f"example.com/{cls}" for cls in KINDS],
        state_dir=work / "state",
        claim_files=ClaimFiles(
            spec_dir, "example.com", store=store, driver=DRIVER, metadata_dir=metadata_dir
        ),
    ), Claims(), pool=pool, max_reading_calls=4)
    preparer.load()
    ref = ClaimRef("default", "c1", UID)

    def listing():
        meta = sorted(os.listdir(metadata_dir)) if metadata_dir.exists() else []
        return {"specs": sorted(os.listdir(spec_dir)), "metadata": meta}

    steps = {"before": listing()}
    fillers = mnt / "fill"
    fillers.mkdir()
    if mode == "inodes":  # every inode taken, then one given back
        made = 0
        try:
            while True:
                (fillers / str(made)).touch()
                made += 1
        except OSError:
            pass
        (fillers / str(made - 1)).unlink()
    else:  # every page taken, then some given back: room for records, not for specs
        pages = 3 if mode == "second-spec" else 1
        fd = os.open(fillers / "0", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"x" * 4096)
        except OSError:
            pass
        os.close(fd)
        os.truncate(fillers / "0", os.path.getsize(fillers / "0") - pages * 4096)
    st = os.statvfs(mnt)
    steps["free"] = {"pages": st.f_bavail, "inodes": st.f_favail}

    [answer] = preparer.prepare([ref], 5.0)
    steps["refused"] = {"error": answer.error, "reason": answer.reason, **listing()}
    steps["unprepared"] = {"error": preparer.unprepare([ref], 5.0)[0], **listing()}
    # Room again: the same claim prepares, and its files go at unprepare.
    subprocess.run(["rm", "-rf", str(fillers)], check=True)
    [answer] = preparer.prepare([ref], 5.0)
    steps["prepared"] = {"error": answer.error, **listing()}
    steps["again"] = {"error": preparer.unprepare([ref], 5.0)[0], **listing()}
    print("STEPS " + json.dumps(steps))
    """
)


@pytest.mark.parametrize("mode", ["one-page", "second-spec", "inodes"])
def test_a_full_spec_folder_leaves_no_record_of_a_refused_claim(tmp_path: Path, mode: str) -> None:
    (tmp_path / "mnt").mkdir()
    args = ["-c", SCENARIO, str(tmp_path / "mnt"), str(tmp_path), mode]
    steps = reported(run_private(args), "STEPS ")
    before = steps["before"]
    assert before["metadata"] == []
    assert len(before["specs"]) == 4, before  # the two class specs and their records

    refused = steps["refused"]
    assert refused["reason"] == "claim-spec", steps
    assert "No space left on device" in refused["error"], steps
    assert {k: refused[k] for k in before} == before, steps
    unprepared = steps["unprepared"]
    assert unprepared["error"] == ""
    assert {k: unprepared[k] for k in before} == before, steps

    prepared = steps["prepared"]
    assert prepared["error"] == "", steps
    claim_files = sorted(set(prepared["specs"]) - set(before["specs"]))
    specs = 2 if mode == "second-spec" else 1
    assert len(claim_files) == 2 * specs, claim_files  # each spec and its record
    assert len(prepared["metadata"]) == specs, prepared
    again = steps["again"]
    assert again["error"] == ""
    assert {k: again[k] for k in before} == before, steps


DRIVER, POOL = "cdi-gen.example.com", "node-a"
UID = "5d1c7c2e-9a43-4a57-8d1e-0c0a6f1f2b3c"
KINDS = ("fpga", "gpu")


class _Node:
    """The scenario's driver in this process: two classes' specs, a claim configured for a
    device of each (two specs of its own), metadata beside them."""

    def __init__(self, root: Path) -> None:
        self.spec_dir, self.metadata_dir = root / "cdi", root / "metadata"
        store = SpecStore()
        pool = DevicePool()
        for cls in KINDS:
            entries = [build_entry("0", {"deviceNodes": [{"path": "/dev/null"}]})]
            data = dump_document(assemble(f"example.com/{cls}", entries))
            store.sync(self.spec_dir, "example.com", cls, data, instance=None)
            attributes: dict[str, object] = {"class": cls, "numaNode": 0}
            pool.publish(
                cls,
                [PoolDevice(f"{cls}-0", f"example.com/{cls}=0", cls, "/s", attributes=attributes)],
            )
        params = {"apiVersion": "cdi-gen.io/v1alpha1", "kind": "DeviceConfig", "env": {"M": "c"}}
        self.claim = ClaimView(
            "default",
            "c1",
            UID,
            tuple(AllocatedDevice(cls, DRIVER, POOL, f"{cls}-0") for cls in KINDS),
            (ConfigEntry("FromClaim", DRIVER, (), params, 0),),
        )
        self.specs = ClaimFiles(
            self.spec_dir, "example.com", store=store, driver=DRIVER, metadata_dir=self.metadata_dir
        )
        self.preparer = claim_calls(
            PoolPreparer(
                DRIVER,
                pool,
                pool_name=POOL,
                cdi_kinds=[f"example.com/{cls}" for cls in KINDS],
                state_dir=root / "state",
                claim_files=self.specs,
            ),
            self,
            max_reading_calls=4,
        )
        self.preparer.load()
        self.ref = ClaimRef("default", "c1", UID)

    def read_claims(self, refs: Sequence[tuple[str, str]], timeout: float) -> list[ClaimView]:
        return [self.claim for _ in refs]

    def files(self) -> dict[str, list[str]]:
        meta = (
            sorted(p.name for p in self.metadata_dir.iterdir())
            if self.metadata_dir.exists()
            else []
        )
        return {"specs": sorted(p.name for p in self.spec_dir.iterdir()), "metadata": meta}


@pytest.mark.parametrize("step", ["owner-renamed", "temp-written", "temp-synced", "renamed"])
@pytest.mark.parametrize("which", [1, 2])
def test_a_claim_spec_failing_at_any_step_takes_all_of_the_claims_files_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, which: int
) -> None:
    """ENOSPC at the record's folder fsync, the spec's fsync, its rename or the folder fsync
    after it, on the first or the second spec of one claim: the claim is refused and nothing
    of it stays, not even a spec already in place under its name."""
    node = _Node(tmp_path)
    before = node.files()
    calls = 0

    def failing(*args: Any, **kwargs: Any) -> bool:
        nonlocal calls
        calls += 1

        def hook(name: str) -> None:
            if calls == which and name == step:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return write_bytes(*args, step_hook=hook, **kwargs)

    monkeypatch.setattr(claimfiles, "write_bytes", failing)
    [answer] = node.preparer.prepare([node.ref], 5.0)
    assert answer.reason == "claim-spec", answer
    assert "No space left on device" in answer.error
    assert node.files() == before
    assert node.preparer.unprepare([node.ref], 5.0) == [""]
    assert node.files() == before


def test_an_unprepare_of_a_claim_not_prepared_here_removes_what_it_left(tmp_path: Path) -> None:
    """A writer killed between a claim spec's record and the spec (another instance, in a
    rolling update) leaves a record this instance's start would not sweep for long; the
    claim's unprepare removes it, and a whole spec of it, by their names. Another instance's
    record and a file someone else put at such a name stay."""
    node = _Node(tmp_path)
    before = node.files()
    [answer] = node.preparer.prepare([node.ref], 5.0)
    assert answer.error == ""
    fpga, gpu = (f"example.com-{cls}@{UID}.json" for cls in KINDS)
    # What a killed prepare leaves, by hand: the claim unknown, one spec whole, one record
    # alone (its metadata files go as orphans at the next start).
    driver_part_of(node.preparer).checkpoint.remove(UID)
    (node.spec_dir / gpu).unlink()
    assert node.preparer.unprepare([node.ref], 5.0) == [""]
    assert node.files()["specs"] == before["specs"]
    # Someone else's files at such names are theirs.
    (node.spec_dir / fpga).write_text("{}")
    other = {"vendor": "example.com", "class": "gpu", "file": gpu, "instance": "other",
             "sha256": [], "transient": UID}  # fmt: skip
    (node.spec_dir / f".{gpu}.cdi-gen-owner").write_bytes(orjson.dumps(other))
    assert node.preparer.unprepare([node.ref], 5.0) == [""]
    assert sorted(set(node.files()["specs"]) - set(before["specs"])) == [
        f".{gpu}.cdi-gen-owner",
        fpga,
    ]
