"""The DRA checkpoint, the one store of prepared claims: round trips, refusals of files that
are not ours or that someone else could have written (left untouched), recorded claims that
are not our devices (dropped), what is written can be read back, atomic replacement without
fsync, older formats and the claim records of owner records adopted at the first load."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdi_gen.dra.driver.boot import Boot
from cdi_gen.dra.driver.checkpoint import (
    CHECKPOINT_KIND,
    CHECKPOINT_MAX_BYTES,
    Checkpoint,
    CheckpointError,
    PreparedClaim,
    SpecName,
    checkpoint_path,
)
from cdi_gen.dra.driver.claimcheck import MAX_ALLOCATION_RESULTS
from cdi_gen.dra.driver.preparedclaim import claim_doc, read_claim_record
from cdi_gen.dra.plugin.claims import PreparedDevice
from tests.conftest import examples

DATA = Path(__file__).resolve().parents[1] / "data" / "checkpoint"
DRIVER = "cdi-gen.example.com"
POOL = "node"
KINDS = ("example.com/fpga", "example.com/gpu")
SHARE = "7f3b0a1e-0000-4000-8000-00000000000b"
CLAIM = PreparedClaim(
    "ns",
    "c",
    (
        PreparedDevice(("a",), POOL, "fpga-0", ("example.com/fpga=0",)),
        PreparedDevice(("b", "c"), POOL, "fpga-1", ("example.com/fpga=1",), SHARE),
    ),
)


def fresh(tmp_path: Path, max_bytes: int = CHECKPOINT_MAX_BYTES) -> Checkpoint:
    path = checkpoint_path(tmp_path / "state", DRIVER)
    return Checkpoint(path, DRIVER, pool=POOL, kinds=KINDS, max_bytes=max_bytes)


def write(cp: Checkpoint, claims: dict[str, object], mode: int = 0o600) -> bytes:
    """A checkpoint file of ours holding ``claims`` (wire form)."""
    cp.path.parent.mkdir(exist_ok=True)
    doc = {"kind": CHECKPOINT_KIND, "version": 1, "driver": DRIVER, "claims": claims}
    content = orjson.dumps(doc)
    cp.path.write_bytes(content)
    cp.path.chmod(mode)
    return content


def wire(
    *cdi_ids: str, pool: str = POOL, devices: int = 1, share: str | None = None
) -> dict[str, object]:
    one = {"requestNames": ["r"], "pool": pool, "device": "fpga-0", "cdiDeviceIds": list(cdi_ids)}
    if share is not None:
        one["shareId"] = share
    return {"namespace": "ns", "name": "c", "devices": [one] * devices}


def test_missing_file_means_no_claims(tmp_path: Path) -> None:
    cp = fresh(tmp_path)
    cp.load()
    assert cp.claims == {}
    assert not cp.path.exists()


def test_round_trip_and_removal(tmp_path: Path) -> None:
    cp = fresh(tmp_path)
    cp.load()
    cp.add("u1", CLAIM)
    assert cp.path.stat().st_mode & 0o777 == 0o600
    doc = orjson.loads(cp.path.read_bytes())
    assert (doc["kind"], doc["version"], doc["driver"]) == (CHECKPOINT_KIND, 5, DRIVER)
    again = fresh(tmp_path)
    again.load()
    assert again.claims == {"u1": CLAIM}
    assert again.remove("u1") is True
    assert again.remove("u1") is False
    last = fresh(tmp_path)
    last.load()
    assert last.claims == {}
    assert [p.name for p in cp.path.parent.iterdir()] == [cp.path.name]  # no temporaries


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
cdi_names = st.builds(
    "{}={}".format, st.sampled_from(KINDS), st.from_regex(r"[a-z0-9]{1,10}", fullmatch=True)
)
devices = st.builds(
    PreparedDevice,
    st.tuples(names),
    st.just(POOL),
    names,
    st.lists(cdi_names, max_size=3).map(tuple),
    st.none() | st.uuids().map(str),  # share IDs: what prepare lets through
)
claims = st.dictionaries(
    names, st.builds(PreparedClaim, names, names, st.lists(devices, max_size=3).map(tuple))
)


@settings(max_examples=examples(50), deadline=None)
@given(claims)
def test_any_claims_survive_the_file(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, PreparedClaim]
) -> None:
    cp = fresh(tmp_path_factory.mktemp("cp"))
    cp.load()
    for uid, claim in data.items():
        cp.add(uid, claim)
    again = Checkpoint(cp.path, DRIVER, pool=POOL, kinds=KINDS)
    again.load()
    assert dict(again.claims) == data
    assert dict(cp.claims) == data


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not JSON"),
        (b"", "not JSON"),  # of this boot: not torn by a power loss, so not ours
        (b"[]", "not a cdi-gen DRA checkpoint"),
        (b'{"kind": "other"}', "not a cdi-gen DRA checkpoint (kind 'other'"),
        (
            orjson.dumps({"kind": CHECKPOINT_KIND, "version": 6, "driver": DRIVER, "claims": {}}),
            "checkpoint format 6 (written by a newer cdi-gen); this cdi-gen reads formats 1 to 5",
        ),
        (
            orjson.dumps({"kind": CHECKPOINT_KIND, "version": "2", "driver": DRIVER}),
            "checkpoint format '2'; this cdi-gen reads formats 1 to 5",
        ),
        (
            orjson.dumps({"kind": CHECKPOINT_KIND, "version": True, "driver": DRIVER}),
            "checkpoint format True; this cdi-gen reads formats 1 to 5",
        ),
        (
            orjson.dumps({"kind": CHECKPOINT_KIND, "version": 5.0, "driver": DRIVER}),
            "checkpoint format 5.0; this cdi-gen reads formats 1 to 5",
        ),
        (
            orjson.dumps({"kind": CHECKPOINT_KIND, "version": 1, "driver": "x.io", "claims": {}}),
            "checkpoint of driver 'x.io'",
        ),
        (
            orjson.dumps(
                {
                    "kind": CHECKPOINT_KIND,
                    "version": 1,
                    "driver": DRIVER,
                    "claims": {"u1": {"namespace": "ns", "name": 3, "devices": []}},
                }
            ),
            "claims['u1'].name: want a string, got 3",
        ),
    ],
)
def test_a_file_that_is_not_ours_is_refused_and_kept(
    tmp_path: Path, content: bytes, message: str
) -> None:
    cp = fresh(tmp_path)
    cp.path.parent.mkdir()
    cp.path.write_bytes(content)
    with pytest.raises(CheckpointError) as refused:
        cp.load()
    text = str(refused.value)
    assert text.startswith(str(cp.path)), text
    assert message in text
    assert "left as it is" in text
    assert "not left" not in text  # it is left as it is, and says so
    assert "move it away" in text
    assert "\n" not in text
    assert cp.path.read_bytes() == content


@pytest.mark.parametrize(
    ("mode", "owner", "message"),
    [
        (0o666, None, "writable by group or others (mode 0666)"),
        (0o620, None, "writable by group or others (mode 0620)"),
        (0o602, None, "writable by group or others (mode 0602)"),
        (0o600, 65534, "owned by uid 65534, not by this agent's user"),
        (0o644, 65534, "owned by uid 65534"),
    ],
)
def test_a_file_someone_else_could_have_written_is_refused_and_kept(
    tmp_path: Path, mode: int, owner: int | None, message: str
) -> None:
    cp = fresh(tmp_path)
    content = write(cp, {"u1": wire("evil.example/host=root")}, mode)
    if owner is not None:
        os.chown(cp.path, owner, -1)
    with pytest.raises(CheckpointError) as refused:
        cp.load()
    text = str(refused.value)
    assert text.startswith(str(cp.path)), text
    assert message in text, text
    assert "left as it is" in text
    assert "\n" not in text
    assert cp.path.read_bytes() == content
    assert cp.path.stat().st_mode & 0o777 == mode
    assert cp.claims == {}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (wire("evil.example/host=root"), "'evil.example/host=root', not of this driver's kinds"),
        (wire("example.com/fpga=0", "example.com/other=1"), "'example.com/other=1'"),
        (wire("../../etc/passwd"), "invalid"),
        (wire("example.com/fpga=0", pool="node-b"), "pool 'node-b', not in this node's pool"),
        (
            wire("example.com/fpga=0", devices=MAX_ALLOCATION_RESULTS + 1),
            f"records {MAX_ALLOCATION_RESULTS + 1} devices; a claim has at most",
        ),
        # Recorded by a cdi-gen that took any shareID: answered again only as prepare would.
        (wire("example.com/fpga=0", share=""), "shareID '', not a share ID: want a lowercase"),
        (wire("example.com/fpga=0", share="s\n" * 900), "shareID 's\\ns\\n"),
    ],
)
def test_a_recorded_claim_that_is_not_our_devices_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, entry: dict[str, object], message: str
) -> None:
    cp = fresh(tmp_path)
    good = wire("example.com/fpga=0", "example.com/gpu=1")
    write(cp, {"u-good": good, "u-bad": entry})
    with caplog.at_level(logging.WARNING, "cdi_gen.dra.driver.checkpoint"):
        cp.load()
    assert set(cp.claims) == {"u-good"}
    [line] = [r.getMessage() for r in caplog.records]
    assert "'u-bad'" in line
    assert "dropped" in line
    assert message in line, line
    assert "\n" not in line


def test_what_is_written_can_be_read_back(tmp_path: Path) -> None:
    """Claims are added until the next one would make the file larger than the read cap:
    that one is refused and the file still loads, with every claim it accepted."""
    cp = fresh(tmp_path, max_bytes=4096)
    cp.load()
    accepted = []
    with pytest.raises(CheckpointError) as refused:
        for n in range(1000):
            cp.add(f"u{n}", CLAIM)
            accepted.append(f"u{n}")
    text = str(refused.value)
    assert "over the 4096 bytes it can read back; not recorded" in text
    assert f"u{len(accepted)}" not in cp.claims
    assert cp.path.stat().st_size <= 4096
    again = fresh(tmp_path, max_bytes=4096)
    again.load()
    assert sorted(again.claims) == sorted(accepted)


def test_the_largest_claims_fit_by_the_hundred(tmp_path: Path) -> None:
    """A claim of the most devices the API allows, with names at their limits, is small
    enough that the read cap holds hundreds of them."""
    longest = PreparedDevice(
        ("r" * 63 + "/" + "s" * 63,),
        "p" * 253,
        "d" * 63,
        (f"{'v' * 253}/{'c' * 63}={'n' * 63}",),
        "0" * 36,
    )
    claim = PreparedClaim("n" * 63, "m" * 253, (longest,) * MAX_ALLOCATION_RESULTS)
    cp = fresh(tmp_path)
    one = len(cp.encode({"u" * 128: claim})) - len(cp.encode({}))
    assert CHECKPOINT_MAX_BYTES // one >= 300, one


def test_a_link_or_a_fifo_is_refused(tmp_path: Path) -> None:
    cp = fresh(tmp_path)
    cp.path.parent.mkdir()
    target = tmp_path / "elsewhere.json"
    target.write_bytes(b"{}")
    cp.path.symlink_to(target)
    with pytest.raises(CheckpointError, match="cannot read"):
        cp.load()
    cp.path.unlink()
    os.mkfifo(cp.path)
    with pytest.raises(CheckpointError, match="FIFO"):
        cp.load()  # and does not block


def test_a_failed_write_changes_neither_file_nor_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = fresh(tmp_path)
    cp.load()
    cp.add("u1", CLAIM)
    before = cp.path.read_bytes()

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    # The data's write fails (a full disk), whatever puts the file in place after it.
    monkeypatch.setattr(os, "write", crash)
    with pytest.raises(CheckpointError, match="No space left"):
        cp.add("u2", CLAIM)
    with pytest.raises(CheckpointError):
        cp.remove("u1")
    assert cp.path.read_bytes() == before
    assert set(cp.claims) == {"u1"}
    assert [p.name for p in cp.path.parent.iterdir()] == [cp.path.name]


def test_a_reader_sees_the_old_or_the_new_file(tmp_path: Path) -> None:
    """The file is replaced whole (swapped in): an open reader keeps the old complete
    content."""
    cp = fresh(tmp_path)
    cp.load()
    cp.add("u1", CLAIM)
    with cp.path.open("rb") as old:
        cp.add("u2", CLAIM)
        assert set(orjson.loads(old.read())["claims"]) == {"u1"}
    assert set(orjson.loads(cp.path.read_bytes())["claims"]) == {"u1", "u2"}


def load_stored(
    tmp_path: Path, version: int, caplog: pytest.LogCaptureFixture
) -> tuple[Checkpoint, bytes]:
    """A checkpoint loaded from the stored file of format ``version``, and that file."""
    cp = Checkpoint(
        checkpoint_path(tmp_path, DRIVER), DRIVER, pool=POOL, kinds=["example.com/fpga"]
    )
    stored = (DATA / f"v{version}.json").read_bytes()
    assert orjson.loads(stored)["version"] == version
    cp.path.write_bytes(stored)
    cp.path.chmod(0o600)
    with caplog.at_level(logging.INFO, "cdi_gen.dra.driver.checkpoint"):
        cp.load()
    assert f"checkpoint format {version} read as format 5 (written so now)" in caplog.text
    return cp, stored


def test_a_stored_format_1_checkpoint_is_read_and_written_anew_as_format_5(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The file the agent wrote before per-claim specs (format 1), stored as it was written:
    # an upgraded agent answers its claims as before, recorded in format 5 at start.
    cp, stored = load_stored(tmp_path, 1, caplog)
    first = cp.claims["0b5e7c9a-3f41-4d2e-9c7b-5a1f2e3d4c5b"]
    assert first == PreparedClaim(
        "default",
        "fpga-claim",
        (PreparedDevice(("fpga",), POOL, "fpga-fpga0", ("example.com/fpga=fpga0",)),),
    )
    shared = cp.claims["7c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f"].devices[0]
    assert (shared.share_id, shared.admin_access) == ("3d0f6a52-8c1e-4b7a-9f25-6e4c1b8d2a70", False)
    doc = orjson.loads(cp.path.read_bytes())
    assert (doc["version"], doc["claims"]) == (5, orjson.loads(stored)["claims"])
    cp.remove("0b5e7c9a-3f41-4d2e-9c7b-5a1f2e3d4c5b")
    doc = orjson.loads(cp.path.read_bytes())
    assert doc["version"] == 5
    assert list(doc["claims"]) == ["7c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f"]


def test_a_stored_format_2_checkpoint_is_read_with_its_configured_claim(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The file the agent wrote before claim records rode with their specs (format 2), stored
    # as it was written: a plain claim, one with admin access and one with a spec of its own.
    # That spec's owner record holds no claim, so the file is the configured claim's record.
    cp, stored = load_stored(tmp_path, 2, caplog)
    plain, admin, configured = (
        "0b5e7c9a-3f41-4d2e-9c7b-5a1f2e3d4c5b",
        "3e8a1c2b-5d4f-4a6e-9b7c-1d2e3f4a5b6c",
        "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a",
    )
    assert cp.claims[admin].devices[0].admin_access
    assert cp.claims[configured].specs == (SpecName("example.com/fpga", configured),)
    assert cp.claims[configured].devices[0].cdi_device_ids == (
        f"example.com/fpga=claim-{configured}-0",
    )
    doc = orjson.loads(cp.path.read_bytes())
    assert (doc["version"], doc["claims"]) == (5, orjson.loads(stored)["claims"])
    cp.remove(plain)
    doc = orjson.loads(cp.path.read_bytes())
    assert (doc["version"], sorted(doc["claims"])) == (5, [admin, configured])
    cp.remove(configured)
    assert sorted(orjson.loads(cp.path.read_bytes())["claims"]) == [admin]


def test_a_checkpoint_of_this_format_is_not_written_at_load(tmp_path: Path) -> None:
    cp = fresh(tmp_path)
    cp.load()
    cp.add("u1", CLAIM)
    before = cp.path.stat().st_ino
    again = fresh(tmp_path)
    again.load()
    assert again.claims == {"u1": CLAIM}
    assert cp.path.stat().st_ino == before  # not replaced


def test_admin_access_survives_the_file(tmp_path: Path) -> None:
    claim = PreparedClaim(
        "ns", "c", (PreparedDevice(("a",), POOL, "fpga-0", ("example.com/fpga=0",), None, True),)
    )
    cp = fresh(tmp_path)
    cp.load()
    cp.add("u1", claim)
    again = fresh(tmp_path)
    again.load()
    assert again.claims == {"u1": claim}


SPEC_HELD = PreparedClaim(
    "ns",
    "c",
    (PreparedDevice(("a",), POOL, "fpga-0", ("example.com/fpga=claim-u1-0",)),),
    (SpecName("example.com/fpga", "u1"),),
)


def test_a_claim_with_its_own_specs_is_in_the_file_with_them(tmp_path: Path) -> None:
    # The one store: a claim with specs of its own is recorded, with them, like any other.
    cp = fresh(tmp_path)
    cp.load()
    cp.add("u1", SPEC_HELD)
    cp.add("u2", CLAIM)
    doc = orjson.loads(cp.path.read_bytes())
    assert doc["claims"]["u1"]["specs"] == [{"kind": "example.com/fpga", "transient": "u1"}]
    again = fresh(tmp_path)
    again.load()
    assert again.claims == {"u1": SPEC_HELD, "u2": CLAIM}
    assert again.remove("u1") is True
    assert set(orjson.loads(cp.path.read_bytes())["claims"]) == {"u2"}


def test_the_file_is_replaced_without_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A change must outlive the agent, not a power loss (a reboot voids every record).
    cp = fresh(tmp_path)
    cp.load()

    def fsync(fd: int) -> None:
        raise AssertionError("the checkpoint is fsynced")

    monkeypatch.setattr(os, "fsync", fsync)
    cp.add("u1", CLAIM)
    assert cp.remove("u1") is True
    assert orjson.loads(cp.path.read_bytes())["claims"] == {}


A = "0a0a0a0a-1111-4222-8333-444444444444"


def adopting(
    tmp_path: Path, recorded: dict[str, PreparedClaim], seen: list[Boot] | None = None
) -> Checkpoint:
    """A checkpoint of boot A that adopts ``recorded`` (what a cdi-gen before format 5 left in
    owner records), counting the reads in ``seen``."""

    def adopt_from(boot: Boot) -> dict[str, PreparedClaim]:
        if seen is not None:
            seen.append(boot)
        return recorded

    path = checkpoint_path(tmp_path / "state", DRIVER)
    return Checkpoint(
        path, DRIVER, pool=POOL, kinds=KINDS, boot=Boot(A, 0.0), adopt_from=adopt_from
    )


def test_the_first_load_adopts_our_claims_recorded_with_their_specs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    foreign = dataclasses.replace(SPEC_HELD, specs=(SpecName("other.com/x", "u3"),))
    older = dataclasses.replace(SPEC_HELD, name="older")
    recorded = {"u1": SPEC_HELD, "u2": CLAIM, "u3": foreign, "u4": older}
    seen: list[Boot] = []
    cp = adopting(tmp_path, recorded, seen)
    cp.path.parent.mkdir()
    # A format-4 file of this boot holds u4 already: its record stands.
    held = orjson.loads(orjson.dumps(claim_doc(SPEC_HELD)))
    doc = {"kind": CHECKPOINT_KIND, "version": 4, "driver": DRIVER, "bootId": A,
           "claims": {"u4": held}}  # fmt: skip
    cp.path.write_bytes(orjson.dumps(doc))
    cp.path.chmod(0o600)
    with caplog.at_level(logging.INFO, "cdi_gen.dra.driver.checkpoint"):
        cp.load()
    # u2 names no spec (such a claim was never recorded with specs), u3 is not ours.
    assert cp.claims == {"u1": SPEC_HELD, "u4": SPEC_HELD}
    assert "spec 'other.com/x' is not of this" in caplog.text
    assert "1 prepared claims adopted from their specs' owner records" in caplog.text
    written = orjson.loads(cp.path.read_bytes())
    assert (written["version"], written["bootId"], sorted(written["claims"])) == (
        5,
        A,
        ["u1", "u4"],
    )
    # Read again (the other instance changed the file): no adoption, no write (a write
    # replaces the file).
    cp.remove("u1")
    before = cp.path.stat().st_ino
    cp.load()
    assert cp.claims == {"u4": SPEC_HELD}
    assert seen == [Boot(A, 0.0)]
    assert cp.path.stat().st_ino == before


def test_nothing_to_adopt_or_convert_writes_nothing(tmp_path: Path) -> None:
    cp = adopting(tmp_path, {})
    cp.load()
    assert cp.claims == {}
    assert not cp.path.exists()


def test_a_format_2_file_keeps_its_claims_with_specs(tmp_path: Path) -> None:
    # Their owner records (written before format 3) carry no claim: the file is their record.
    cp = fresh(tmp_path)
    cp.path.parent.mkdir()
    held = {
        **wire("example.com/fpga=claim-u1-0"),
        "specs": [{"kind": "example.com/fpga", "transient": "u1"}],
    }
    doc = {"kind": CHECKPOINT_KIND, "version": 2, "driver": DRIVER, "claims": {"u1": held}}
    cp.path.write_bytes(orjson.dumps(doc))
    cp.path.chmod(0o600)
    cp.load()
    cp.add("u2", CLAIM)
    written = orjson.loads(cp.path.read_bytes())
    assert (written["version"], set(written["claims"])) == (5, {"u1", "u2"})
    cp.remove("u1")
    assert set(orjson.loads(cp.path.read_bytes())["claims"]) == {"u2"}


def record(uid: str, claim: PreparedClaim) -> dict[str, object]:
    """A claim record as a cdi-gen before format 5 wrote it into its specs' owner records."""
    return {"uid": uid, **claim_doc(claim)}


@pytest.mark.parametrize(
    "claim", [SPEC_HELD, dataclasses.replace(SPEC_HELD, devices=(), namespace="")]
)
def test_a_claim_record_reads_back(claim: PreparedClaim) -> None:
    assert read_claim_record(orjson.loads(orjson.dumps(record("u1", claim)))) == ("u1", claim)


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ([], "want an object"),
        ({**record("u1", SPEC_HELD), "uid": 3}, "record.uid: want a string, got 3"),
        (record("u1", CLAIM), "record.specs: a claim recorded with its specs names them"),
        ({**record("u1", SPEC_HELD), "devices": {}}, "record.devices: want a list"),
    ],
)
def test_an_unreadable_claim_record_is_refused_naming_the_field(doc: object, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        read_claim_record(doc)


@pytest.mark.parametrize(
    ("specs", "why"),
    [
        ([{"kind": "other.com/x", "transient": "u1"}], "spec 'other.com/x' is not of this"),
        ([{"kind": "example.com/fpga", "transient": "../u1"}], "transient spec ID"),
    ],
)
def test_a_recorded_spec_that_is_not_ours_drops_the_claim(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, specs: list[object], why: str
) -> None:
    cp = fresh(tmp_path)
    write(cp, {"u1": {**wire("example.com/fpga=0"), "specs": specs}})
    cp.load()
    assert cp.claims == {}
    assert why in caplog.text
