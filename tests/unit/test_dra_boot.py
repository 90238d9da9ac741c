"""The boot a DRA record names: read from the kernel, bounded; a checkpoint of another boot
is void (never answered, kept aside whole, one line); a file from before records named their
boot, or one torn (not JSON: it is written without fsync), is of this boot only if written
after it started; a claim record an older cdi-gen left in an owner record names its boot."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import orjson
import pytest

from cdi_gen.dra.driver import boot as bootmod
from cdi_gen.dra.driver.boot import BOOT_ID_PATH, Boot, BootError, read_boot, record_boot
from cdi_gen.dra.driver.checkpoint import (
    CHECKPOINT_KIND,
    Checkpoint,
    CheckpointError,
    PreparedClaim,
    checkpoint_path,
)
from cdi_gen.dra.plugin.claims import PreparedDevice

DRIVER, POOL = "cdi-gen.example.com", "node"
A = "0a0a0a0a-1111-4222-8333-444444444444"
B = "0b0b0b0b-5555-4666-8777-888888888888"
CLAIM = PreparedClaim("ns", "c", (PreparedDevice(("a",), POOL, "fpga-0", ("example.com/fpga=0",)),))
#: A boot that started an hour ago.
STARTED = time.time() - 3600


def checkpoint(tmp_path: Path, boot_id: str) -> Checkpoint:
    path = checkpoint_path(tmp_path / "state", DRIVER)
    return Checkpoint(
        path, DRIVER, pool=POOL, kinds=["example.com/fpga"], boot=Boot(boot_id, STARTED)
    )


def test_the_boot_is_read_from_the_kernel() -> None:
    boot = read_boot()
    assert boot.id == BOOT_ID_PATH.read_text().strip()
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    assert abs(boot.started - (time.time() - uptime)) < 5


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"not-a-uuid\n", "'not-a-uuid' is not a boot ID: want a lowercase UUID"),
        (b"", "'' is not a boot ID"),
        (A.upper().encode(), f"{A.upper()!r} is not a boot ID"),
        (b"x" * 65, "too large"),
        (None, "cannot read the node's boot ID"),
    ],
)
def test_a_boot_id_that_is_not_one_is_refused_in_one_line(
    tmp_path: Path, content: bytes | None, why: str
) -> None:
    path = tmp_path / "boot_id"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(BootError) as refused:
        read_boot(path)
    assert str(refused.value).startswith(str(path))
    assert why in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_fifo_at_the_boot_id_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "boot_id")
    with pytest.raises(BootError, match="not a regular file"):
        read_boot(tmp_path / "boot_id")


def test_a_checkpoint_names_its_boot_and_is_answered_in_it(tmp_path: Path) -> None:
    cp = checkpoint(tmp_path, A)
    cp.load()
    cp.add("u1", CLAIM)
    assert orjson.loads(cp.path.read_bytes())["bootId"] == A
    again = checkpoint(tmp_path, A)
    again.load()
    assert again.claims == {"u1": CLAIM}


def test_a_checkpoint_of_another_boot_is_void_and_kept_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cp = checkpoint(tmp_path, A)
    cp.load()
    cp.add("u1", CLAIM)
    before = cp.path.read_bytes()
    rebooted = checkpoint(tmp_path, B)
    with caplog.at_level(logging.WARNING, "cdi_gen.dra.driver.boot"):
        rebooted.load()
    assert rebooted.claims == {}
    aside = cp.path.with_name(f"{cp.path.name}.void-{A}")
    assert aside.read_bytes() == before
    assert not cp.path.exists()
    [line] = caplog.messages
    assert f"written in boot {A}, not this boot {B}" in line
    assert "its 1 prepared claims are void" in line and str(aside) in line
    # The claim prepared anew in this boot: a file of this boot, the old one left aside.
    rebooted.add("u1", CLAIM)
    assert orjson.loads(cp.path.read_bytes())["bootId"] == B
    caplog.clear()
    again = checkpoint(tmp_path, B)
    again.load()
    assert again.claims == {"u1": CLAIM}
    assert caplog.messages == []  # logged once
    assert aside.read_bytes() == before


def _format_3(cp: Checkpoint, mtime: float) -> bytes:
    """A file as cdi-gen wrote it before records named their boot, last written at ``mtime``."""
    cp.path.parent.mkdir(exist_ok=True)
    claim = {
        "namespace": "ns",
        "name": "c",
        "devices": [
            {"requestNames": ["a"], "pool": POOL, "device": "fpga-0",
             "cdiDeviceIds": ["example.com/fpga=0"]}
        ],
    }  # fmt: skip
    doc = {"kind": CHECKPOINT_KIND, "version": 3, "driver": DRIVER, "claims": {"u1": claim}}
    content = orjson.dumps(doc)
    cp.path.write_bytes(content)
    cp.path.chmod(0o600)
    os.utime(cp.path, (mtime, mtime))
    return content


def test_a_file_from_before_boots_written_in_this_boot_is_answered(tmp_path: Path) -> None:
    # An upgrade within one boot: the older cdi-gen's claims are answered as before.
    cp = checkpoint(tmp_path, B)
    _format_3(cp, STARTED + 60)
    cp.load()
    assert cp.claims == {"u1": CLAIM}
    cp.add("u2", CLAIM)
    assert orjson.loads(cp.path.read_bytes())["bootId"] == B


def test_a_file_from_before_boots_written_before_this_boot_is_void(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The node rebooted with the older cdi-gen's file: its claims are not answered.
    cp = checkpoint(tmp_path, B)
    content = _format_3(cp, STARTED - 60)
    with caplog.at_level(logging.WARNING, "cdi_gen.dra.driver.boot"):
        cp.load()
    assert cp.claims == {}
    aside = cp.path.with_name(f"{cp.path.name}.void-before-{int(STARTED - 60)}")
    assert aside.read_bytes() == content
    [line] = caplog.messages
    assert f"before this boot {B} started at {int(STARTED)}" in line


def _torn(cp: Checkpoint, content: bytes, mtime: float) -> None:
    cp.path.parent.mkdir(exist_ok=True)
    cp.path.write_bytes(content)
    cp.path.chmod(0o600)
    os.utime(cp.path, (mtime, mtime))


#: What a power loss may leave of a file written without fsync: nothing, a part, zeros.
TORN = [b"", b'{"claims": {"u1": {"devices": [{"cdiDev', b"\0" * 4096]


@pytest.mark.parametrize("content", TORN)
def test_a_torn_checkpoint_written_before_this_boot_is_void_and_kept_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    cp = checkpoint(tmp_path, B)
    _torn(cp, content, STARTED - 60)
    with caplog.at_level(logging.WARNING, "cdi_gen.dra.driver.boot"):
        cp.load()
    assert cp.claims == {}
    aside = cp.path.with_name(f"{cp.path.name}.void-before-{int(STARTED - 60)}")
    assert aside.read_bytes() == content
    assert not cp.path.exists()
    [line] = caplog.messages
    assert f"before this boot {B} started at {int(STARTED)}" in line, line
    assert "not JSON (torn by the power loss that ended that boot)" in line, line
    assert f"kept aside as {aside}" in line and "\n" not in line
    # The claims prepared anew in this boot go to a file of this boot.
    cp.add("u1", CLAIM)
    assert orjson.loads(cp.path.read_bytes())["bootId"] == B


@pytest.mark.parametrize("content", TORN)
def test_a_checkpoint_of_this_boot_that_is_not_json_is_refused_and_kept(
    tmp_path: Path, content: bytes
) -> None:
    # Written after the boot started, it was not torn by a power loss: not ours to set aside.
    cp = checkpoint(tmp_path, B)
    _torn(cp, content, STARTED + 60)
    with pytest.raises(CheckpointError, match=r"json: not JSON \(.*left as it is"):
        cp.load()
    assert cp.path.read_bytes() == content
    assert [p.name for p in cp.path.parent.iterdir()] == [cp.path.name]


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("value", ["", "A", 3, A.upper()])
def test_a_checkpoint_naming_no_boot_id_is_refused_and_kept(
    tmp_path: Path, value: object, version: int
) -> None:
    cp = checkpoint(tmp_path, A)
    cp.path.parent.mkdir()
    doc = {"kind": CHECKPOINT_KIND, "version": version, "driver": DRIVER, "bootId": value,
           "claims": {}}  # fmt: skip
    cp.path.write_bytes(orjson.dumps(doc))
    cp.path.chmod(0o600)
    with pytest.raises(CheckpointError, match=r"json: bootId: want a lowercase UUID.*left as it"):
        cp.load()
    assert orjson.loads(cp.path.read_bytes()) == doc


def test_an_unreadable_boot_id_stops_the_load_and_leaves_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = checkpoint(tmp_path, A)
    cp.load()
    cp.add("u1", CLAIM)
    before = cp.path.read_bytes()
    monkeypatch.setattr(bootmod, "BOOT_ID_PATH", tmp_path / "none")
    unread = Checkpoint(cp.path, DRIVER, pool=POOL, kinds=["example.com/fpga"])
    with pytest.raises(CheckpointError) as refused:
        unread.load()
    text = str(refused.value)
    assert text.startswith(f"{tmp_path / 'none'}: cannot read the node's boot ID"), text
    assert text.endswith(f"the DRA checkpoint {cp.path} is not read"), text
    assert "move it away" not in text  # the file is fine
    assert cp.path.read_bytes() == before


def test_a_checkpoint_that_cannot_be_set_aside_is_refused_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = checkpoint(tmp_path, A)
    cp.load()
    cp.add("u1", CLAIM)
    before = cp.path.read_bytes()

    def fail(*args: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(os, "rename", fail)
    rebooted = checkpoint(tmp_path, B)
    with pytest.raises(CheckpointError, match="Read-only file system"):
        rebooted.load()
    assert rebooted.claims == {}
    assert cp.path.read_bytes() == before


@pytest.mark.parametrize(
    ("doc", "found"),
    [({"bootId": A}, A), ({}, None), ({"bootId": None}, None), ("not a record", None)],
)
def test_a_record_names_its_boot(doc: object, found: str | None) -> None:
    assert record_boot(doc) == found


@pytest.mark.parametrize("value", ["", "x" * 400, 3, [A]])
def test_a_record_naming_no_boot_id_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(ValueError, match=r"record\.bootId: want a lowercase UUID") as refused:
        record_boot({"bootId": value})
    assert len(str(refused.value)) < 200
