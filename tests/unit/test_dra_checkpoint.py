"""The DRA checkpoint: round trips, refusals of files that are not ours (left untouched),
and atomic replacement."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdi_gen.kubelet.checkpoint import (
    CHECKPOINT_KIND,
    Checkpoint,
    CheckpointError,
    PreparedClaim,
    checkpoint_path,
)
from cdi_gen.kubelet.claims import PreparedDevice

DRIVER = "cdi-gen.example.com"
CLAIM = PreparedClaim(
    "ns",
    "c",
    (
        PreparedDevice(("a",), "node", "fpga-0", ("example.com/fpga=0",)),
        PreparedDevice(("b", "c"), "node", "fpga-1", ("example.com/fpga=1",), "share"),
    ),
)


def fresh(tmp_path: Path) -> Checkpoint:
    return Checkpoint(checkpoint_path(tmp_path / "state", DRIVER), DRIVER)


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
    assert (doc["kind"], doc["version"], doc["driver"]) == (CHECKPOINT_KIND, 1, DRIVER)
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
devices = st.builds(
    PreparedDevice,
    st.tuples(names),
    names,
    names,
    st.lists(names, max_size=3).map(tuple),
    st.none() | names,
)
claims = st.dictionaries(
    names, st.builds(PreparedClaim, names, names, st.lists(devices, max_size=3).map(tuple))
)


@settings(max_examples=50, deadline=None)
@given(claims)
def test_any_claims_survive_the_file(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, PreparedClaim]
) -> None:
    cp = fresh(tmp_path_factory.mktemp("cp"))
    cp.load()
    for uid, claim in data.items():
        cp.add(uid, claim)
    again = Checkpoint(cp.path, DRIVER)
    again.load()
    assert dict(again.claims) == data


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "not a cdi-gen DRA checkpoint"),
        (b'{"kind": "other"}', "not a cdi-gen DRA checkpoint (kind 'other'"),
        (
            orjson.dumps({"kind": CHECKPOINT_KIND, "version": 2, "driver": DRIVER, "claims": {}}),
            "checkpoint version 2, this cdi-gen reads 1",
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
    assert "move it away" in text
    assert "\n" not in text
    assert cp.path.read_bytes() == content


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

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(CheckpointError, match="No space left"):
        cp.add("u2", CLAIM)
    with pytest.raises(CheckpointError):
        cp.remove("u1")
    assert cp.path.read_bytes() == before
    assert set(cp.claims) == {"u1"}
    assert [p.name for p in cp.path.parent.iterdir()] == [cp.path.name]


def test_a_reader_sees_the_old_or_the_new_file(tmp_path: Path) -> None:
    """The file is replaced by rename: an open reader keeps the old complete content."""
    cp = fresh(tmp_path)
    cp.load()
    cp.add("u1", CLAIM)
    with cp.path.open("rb") as old:
        cp.add("u2", CLAIM)
        assert set(orjson.loads(old.read())["claims"]) == {"u1"}
    assert set(orjson.loads(cp.path.read_bytes())["claims"]) == {"u1", "u2"}
