"""The spec writer: atomicity under a kill at every step, ownership, modes, symlinks."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest

from cdi_gen.cdi import atomicfile, ownerrecords, writer
from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.cdi.codec import dump_document, load_spec
from cdi_gen.errors import SpecWriteError
from cdi_gen.files import OWNER_MAX_BYTES

STEPS = [
    "owner-temp-created",
    "owner-temp-written",
    "owner-temp-synced",
    "owner-renamed",
    "temp-created",
    "temp-written",
    "temp-synced",
    "renamed",
]


def make_spec(*names: str, kind: str = "example.com/loop") -> bytes:
    """A spec's bytes as the agent makes them: entries, assembled, serialised."""
    entries = [build_entry(n, {"deviceNodes": [{"path": f"/dev/{n}"}]}) for n in names]
    return dump_document(assemble(kind, entries))


def write(spec_dir: Path, data: bytes, **kw: Any) -> bool:
    """Write ``data`` under the name its kind gives, as the agent does."""
    vendor, _, cls = orjson.loads(data)["kind"].partition("/")
    return writer.write_bytes(spec_dir, vendor, cls, data, **kw)


def test_write_creates_folder_mode_and_skips_identical(tmp_path: Path) -> None:
    spec_dir = tmp_path / "run" / "cdi"
    old_umask = os.umask(0o077)
    try:
        assert write(spec_dir, make_spec("loop200")) is True
    finally:
        os.umask(old_umask)
    target = spec_dir / "example.com-loop.json"
    assert target.stat().st_mode & 0o777 == 0o644
    before = target.stat().st_mtime_ns, target.stat().st_ino
    assert write(spec_dir, make_spec("loop200")) is False
    assert (target.stat().st_mtime_ns, target.stat().st_ino) == before
    assert target.read_bytes() == make_spec("loop200")
    assert sorted(os.listdir(spec_dir)) == [
        ".example.com-loop.json.cdi-gen-owner",
        "example.com-loop.json",
    ]


def test_output_is_byte_stable(tmp_path: Path) -> None:
    """The same devices give the same bytes (so an unchanged spec is never rewritten), and a
    reader loads back exactly the document written."""
    a = make_spec("b", "a")
    assert a == make_spec("b", "a")
    assert a.endswith(b"\n")
    assert load_spec(a).to_wire() == orjson.loads(a)


def test_foreign_file_is_never_replaced_or_removed(tmp_path: Path) -> None:
    foreign = tmp_path / "example.com-loop.json"
    foreign.write_bytes(b'{"foreign": true}')
    with pytest.raises(SpecWriteError, match="not written by cdi-gen"):
        write(tmp_path, make_spec("loop200"))
    assert writer.remove_spec(tmp_path, "example.com", "loop") is False
    assert foreign.read_bytes() == b'{"foreign": true}'
    assert ownerrecords.owned_specs(tmp_path) == []


def test_replaced_by_someone_else_becomes_foreign(tmp_path: Path) -> None:
    write(tmp_path, make_spec("loop200"))
    (tmp_path / "example.com-loop.json").write_bytes(make_spec("other"))
    assert ownerrecords.owned_specs(tmp_path) == []
    assert writer.remove_spec(tmp_path, "example.com", "loop") is False
    assert (tmp_path / "example.com-loop.json").exists()


def test_symlink_planted_at_target_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "example.com-loop.json").symlink_to(victim)
    with pytest.raises(SpecWriteError):
        write(spec_dir, make_spec("loop200"))
    assert victim.read_text() == "precious"


def test_remove_ours_and_list_owned(tmp_path: Path) -> None:
    write(tmp_path, make_spec("loop200"))
    write(tmp_path, make_spec("x", kind="example.com/fpga.v2"))
    assert ownerrecords.owned_specs(tmp_path) == [
        ("example.com", "fpga.v2"),
        ("example.com", "loop"),
    ]
    assert writer.remove_spec(tmp_path, "example.com", "loop") is True
    assert writer.remove_spec(tmp_path, "example.com", "loop") is False
    assert ownerrecords.owned_specs(tmp_path) == [("example.com", "fpga.v2")]


def test_unwritable_folder_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SpecWriteError, match="cannot write"):
        write(blocker / "cdi", make_spec("loop200"))


CHILD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from cdi_gen.cdi import writer
    step = sys.argv[2]
    def hook(name):
        if name == step:
            os._exit(9)
    data = sys.argv[3].encode()
    writer.write_bytes(Path(sys.argv[1]), "example.com", "loop", data, step_hook=hook)
    """
)


@pytest.mark.parametrize("step", STEPS)
def test_kill_at_any_step_leaves_old_or_new_file(tmp_path: Path, step: str) -> None:
    old, new = make_spec("loop200"), make_spec("loop200", "loop201")
    write(tmp_path, old)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), step, new.decode()], check=False
    )
    assert proc.returncode == 9, "the child must have been killed at the step"
    on_disk = (tmp_path / "example.com-loop.json").read_bytes()
    assert on_disk in (old, new)
    load_spec(on_disk)  # complete and valid
    # Whatever is on disk is still recognised as ours...
    assert ownerrecords.owned_specs(tmp_path) == [("example.com", "loop")]
    # ...and the next run finishes the job and leaves no temporary file behind.
    write(tmp_path, new)
    assert (tmp_path / "example.com-loop.json").read_bytes() == new
    assert not [n for n in os.listdir(tmp_path) if n.endswith(atomicfile.TEMP_SUFFIX)]


def _no_space_at(step: str) -> atomicfile.StepHook:
    """A step hook failing at ``step`` as a full disk fails that step's call."""

    def hook(name: str) -> None:
        if name == step:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return hook


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("transient", [None, "u1"])
def test_a_failed_write_leaves_no_record_of_a_spec_it_did_not_write(
    tmp_path: Path, step: str, transient: str | None
) -> None:
    """A write failing between its owner record and its spec (a full disk at the spec's
    write, fsync or rename) takes the record back: a first write leaves nothing, a
    replacement the old spec with its old record; once the spec is in place (a failed folder
    fsync after the rename) its record names it. No temporary stays."""
    kw: dict[str, Any] = {"transient": transient, "instance": "me"}
    if transient is not None:
        kw["payload"] = {"uid": transient, "n": 1}
    first = make_spec("loop200")
    with pytest.raises(SpecWriteError, match="No space left on device"):
        write(tmp_path, first, step_hook=_no_space_at(step), **kw)
    if step == "renamed":
        with atomicfile.folder(tmp_path) as dir_fd:
            assert ownerrecords.is_owned_in(dir_fd, _name(transient))
        assert sorted(os.listdir(tmp_path)) == sorted([_name(transient), _owner(transient)])
        return
    assert os.listdir(tmp_path) == []

    write(tmp_path, first, **kw)
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    if transient is not None:
        kw["payload"] = {"uid": transient, "n": 2}
    with pytest.raises(SpecWriteError, match="No space left on device"):
        write(tmp_path, make_spec("loop200", "loop201"), step_hook=_no_space_at(step), **kw)
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before


def _name(transient: str | None) -> str:
    return "example.com-loop.json" if transient is None else f"example.com-loop@{transient}.json"


def _owner(transient: str | None) -> str:
    return ownerrecords.owner_name(_name(transient))


def test_write_file_is_atomic_and_readable_wherever_it_goes(tmp_path: Path) -> None:
    """`render --output`: the one writer, without an ownership record."""
    target = tmp_path / "new" / "folder" / "spec.json"
    old = os.umask(0o077)
    try:
        atomicfile.write_file(target, b"first")
    finally:
        os.umask(old)
    assert target.read_bytes() == b"first"
    assert target.stat().st_mode & 0o777 == atomicfile.SPEC_MODE  # not 0600 under umask 077
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    link = target.parent / "link.json"
    link.symlink_to(victim)
    atomicfile.write_file(link, b"second")  # the link is replaced by the file, not followed
    assert victim.read_bytes() == b"keep" and link.read_bytes() == b"second"
    assert not link.is_symlink()
    assert sorted(p.name for p in target.parent.iterdir()) == ["link.json", "spec.json"]
    with pytest.raises(SpecWriteError, match="not a file name"):
        atomicfile.write_file(tmp_path / "..", b"x")


def test_sync_and_remove_unconfigured_touch_only_ours(tmp_path: Path) -> None:
    """The agent and `cdi-gen write` share these: write/remove one class, drop stale ones."""
    assert writer.sync_spec(tmp_path, "example.com", "loop", make_spec("a")) == "written"
    assert writer.sync_spec(tmp_path, "example.com", "loop", make_spec("a")) == "unchanged"
    write(tmp_path, make_spec("b", kind="example.com/gone"))
    write(tmp_path, make_spec("c", kind="other.org/gone"))
    (tmp_path / "example.com-foreign.json").write_text("{}")
    configured = {("example.com", "loop")}
    # Each vendor's own instance (the default) removes its own stale specs, never another's.
    done = writer.remove_unconfigured(tmp_path, configured, instance="example.com")
    assert done == [("example.com", "gone", None)]
    assert writer.remove_unconfigured(tmp_path, configured, instance="other.org") == [
        ("other.org", "gone", None)
    ]
    assert writer.sync_spec(tmp_path, "example.com", "loop", None) == "removed"
    assert writer.sync_spec(tmp_path, "example.com", "loop", None) == "absent"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "example.com-foreign.json"
    ]


def test_an_instance_never_replaces_or_removes_another_instances_spec(tmp_path: Path) -> None:
    data = make_spec("loop200")
    assert writer.write_bytes(tmp_path, "example.com", "loop", data, instance="team-a")
    with pytest.raises(SpecWriteError, match="written by cdi-gen instance 'team-a', not 'team-b'"):
        writer.write_bytes(tmp_path, "example.com", "loop", b"{}", instance="team-b")
    assert writer.remove_spec(tmp_path, "example.com", "loop", instance="team-b") is False
    assert writer.remove_unconfigured(tmp_path, set(), instance="team-b") == []
    assert ownerrecords.owned_specs(tmp_path, instance="team-b") == []
    assert ownerrecords.owned_specs(tmp_path, instance="team-a") == [("example.com", "loop")]
    assert (tmp_path / "example.com-loop.json").read_bytes() == data
    assert writer.remove_unconfigured(tmp_path, set(), instance="team-a") == [
        ("example.com", "loop", None)
    ]


def test_a_record_from_before_instances_belongs_to_its_vendor(tmp_path: Path) -> None:
    write(tmp_path, make_spec("loop200"))
    owner = tmp_path / ".example.com-loop.json.cdi-gen-owner"
    record = orjson.loads(owner.read_bytes())
    assert record["instance"] == "example.com"
    del record["instance"]
    owner.write_bytes(orjson.dumps(record))
    assert writer.remove_unconfigured(tmp_path, set(), instance="other.example.com") == []
    assert writer.remove_unconfigured(tmp_path, set(), instance="example.com") == [
        ("example.com", "loop", None)
    ]


def test_transient_specs_are_named_apart_from_class_specs(tmp_path: Path) -> None:
    class_spec = make_spec("loop0")
    claim_spec = make_spec("claim-loop0")
    assert writer.write_bytes(tmp_path, "example.com", "loop", class_spec)
    assert writer.write_bytes(
        tmp_path, "example.com", "loop", claim_spec, transient="3f2a-11", instance="me"
    )
    assert (tmp_path / "example.com-loop@3f2a-11.json").read_bytes() == claim_spec
    assert (tmp_path / "example.com-loop.json").read_bytes() == class_spec
    # A class spec list never holds a claim's spec: the agent's start-up removal of classes
    # no longer configured must not take it (the DRA driver owns it through its checkpoint).
    assert ownerrecords.owned_specs(tmp_path) == [("example.com", "loop")]
    assert ownerrecords.owned_transient_specs(tmp_path, instance="me") == [
        ("example.com", "loop", "3f2a-11")
    ]
    assert ownerrecords.owned_transient_specs(tmp_path, instance="other") == []
    assert writer.remove_unconfigured(tmp_path, [], instance="me") == []
    assert (tmp_path / "example.com-loop@3f2a-11.json").exists()
    assert not writer.remove_spec(
        tmp_path, "example.com", "loop", transient="3f2a-11", instance="other"
    )
    assert writer.remove_spec(tmp_path, "example.com", "loop", transient="3f2a-11", instance="me")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".example.com-loop.json.cdi-gen-owner",
        "example.com-loop.json",
    ]


def test_a_transient_specs_payload_lives_and_goes_with_it(tmp_path: Path) -> None:
    data = make_spec("claim-loop0")
    first = {"uid": "3f2a-11", "devices": [1]}
    write = partial(writer.write_bytes, tmp_path, "example.com", "loop", data, instance="me")
    assert write(transient="3f2a-11", payload=first)
    # A transient spec without a payload, and another instance's, are not read back.
    assert write(transient="no-payload")
    assert writer.write_bytes(
        tmp_path, "example.com", "loop", data, transient="x", instance="other", payload={"a": 1}
    )
    assert ownerrecords.owned_transient_payloads(tmp_path, instance="me") == [
        ("example.com", "loop", "3f2a-11", first)
    ]
    # The same bytes with the same payload are no write; a new payload alone is one.
    assert not write(transient="3f2a-11", payload=first)
    second = {"uid": "3f2a-11", "devices": [2]}
    assert write(transient="3f2a-11", payload=second)
    assert ownerrecords.owned_transient_payloads(tmp_path, instance="me")[0][3] == second
    assert writer.remove_spec(tmp_path, "example.com", "loop", transient="3f2a-11", instance="me")
    assert ownerrecords.owned_transient_payloads(tmp_path, instance="me") == []


def test_removing_a_spec_already_gone_removes_its_record(tmp_path: Path) -> None:
    writer.write_bytes(tmp_path, "example.com", "loop", make_spec("a"))
    (tmp_path / "example.com-loop.json").unlink()
    assert not writer.remove_spec(tmp_path, "example.com", "loop")
    assert list(tmp_path.iterdir()) == []


def test_a_transient_record_whose_spec_is_gone_is_removed_for_its_instance_only(
    tmp_path: Path,
) -> None:
    data = make_spec("a")
    for transient, instance in (("kept", "me"), ("lone", "me"), ("theirs", "other")):
        writer.write_bytes(
            tmp_path, "example.com", "loop", data, transient=transient, instance=instance
        )
    writer.write_bytes(tmp_path, "example.com", "loop", data, instance="me")
    # A writer killed between the record and the spec leaves the record alone; so does a
    # class spec removed by hand, which is not transient and is left as it is.
    for name in ("example.com-loop@lone.json", "example.com-loop@theirs.json"):
        (tmp_path / name).unlink()
    (tmp_path / "example.com-loop.json").unlink()
    assert ownerrecords.remove_lone_transient_records(tmp_path, instance="me") == [
        "example.com-loop@lone.json"
    ]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [
        ".example.com-loop.json.cdi-gen-owner",
        ".example.com-loop@kept.json.cdi-gen-owner",
        ".example.com-loop@theirs.json.cdi-gen-owner",
    ]
    assert ownerrecords.remove_lone_transient_records(tmp_path / "absent", instance="me") == []


def test_a_payload_too_large_to_read_back_is_refused_before_any_write(tmp_path: Path) -> None:
    payload = {"blob": "x" * OWNER_MAX_BYTES}
    with pytest.raises(SpecWriteError, match=r"owner record would be \d+ bytes, over the 65536"):
        writer.write_bytes(
            tmp_path, "example.com", "loop", make_spec("a"), transient="t", payload=payload
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("transient", ["", "../x", "a/b", ".hidden", "x" * 129, "a\nb"])
def test_a_transient_id_that_is_not_a_plain_name_is_refused(tmp_path: Path, transient: str) -> None:
    with pytest.raises(SpecWriteError, match="transient spec ID"):
        writer.write_bytes(tmp_path, "example.com", "loop", make_spec("a"), transient=transient)
    assert list(tmp_path.iterdir()) == []


def test_a_planted_transient_record_is_not_ours(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = make_spec("a")
    (tmp_path / "passwd").write_bytes(data)
    record = {
        "vendor": "example.com",
        "class": "loop",
        "transient": "../../passwd",
        "instance": "me",
    }
    record["sha256"] = [ownerrecords.digest(data)]
    (tmp_path / ".example.com-loop_x.json.cdi-gen-owner").write_bytes(orjson.dumps(record))
    assert ownerrecords.owned_transient_specs(tmp_path, instance="me") == []
    assert "not one cdi-gen wrote" in caplog.text


def test_a_class_named_like_a_claims_spec_keeps_its_own_file(tmp_path: Path) -> None:
    """Issue 38: class ``memdev_u1`` and claim ``u1`` of class ``memdev`` once shared
    ``<vendor>-memdev_u1.json``: the claim's write replaced the class's spec and its removal
    deleted it. Transient names hold ``@``, which no vendor, class or ID can."""
    class_spec, claim_spec = make_spec("mem0"), make_spec("claim-u1-0")
    assert writer.write_bytes(tmp_path, "example.com", "memdev_u1", class_spec, instance="me")
    assert writer.write_bytes(
        tmp_path, "example.com", "memdev", claim_spec, transient="u1", instance="me"
    )
    assert (tmp_path / "example.com-memdev_u1.json").read_bytes() == class_spec
    assert writer.remove_spec(tmp_path, "example.com", "memdev", transient="u1", instance="me")
    assert (tmp_path / "example.com-memdev_u1.json").read_bytes() == class_spec
    assert ownerrecords.owned_specs(tmp_path, instance="me") == [("example.com", "memdev_u1")]


def _legacy_transient(tmp_path: Path, transient: str, instance: str, data: bytes) -> None:
    """A transient spec as an agent before ``@`` names wrote it."""
    name = f"example.com-loop_{transient}.json"
    (tmp_path / name).write_bytes(data)
    record = {
        "vendor": "example.com",
        "class": "loop",
        "file": name,
        "instance": instance,
        "sha256": [ownerrecords.digest(data)],
        "transient": transient,
        "payload": {"uid": transient},
    }
    (tmp_path / f".{name}{ownerrecords.OWNER_SUFFIX}").write_bytes(orjson.dumps(record))


def test_an_older_agents_claim_specs_are_renamed_once_and_only_its_own(tmp_path: Path) -> None:
    data = make_spec("claim-u1-0")
    _legacy_transient(tmp_path, "u1", "me", data)
    _legacy_transient(tmp_path, "u2", "other", data)
    _legacy_transient(tmp_path, "gone", "me", data)
    (tmp_path / "example.com-loop_gone.json").unlink()
    (tmp_path / "example.com-loop_foreign.json").write_bytes(data)  # no record: not ours
    assert writer.migrate_transient_names(tmp_path, instance="me") == ["example.com-loop@u1.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".example.com-loop@u1.json.cdi-gen-owner",
        ".example.com-loop_u2.json.cdi-gen-owner",
        "example.com-loop@u1.json",
        "example.com-loop_foreign.json",
        "example.com-loop_u2.json",
    ]
    assert (tmp_path / "example.com-loop@u1.json").read_bytes() == data
    assert ownerrecords.owned_transient_payloads(tmp_path, instance="me") == [
        ("example.com", "loop", "u1", {"uid": "u1"})
    ]
    assert writer.migrate_transient_names(tmp_path, instance="me") == []
