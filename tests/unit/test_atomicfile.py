"""A file replaced without fsync: the old file swapped out, never renamed over, with the
same guarantees as a rename (old or new at the name; nothing not ours moved or followed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdi_gen.cdi import atomicfile
from cdi_gen.cdi.atomicfile import TEMP_SUFFIX, replace_file
from cdi_gen.files import FileId


def _temps(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(TEMP_SUFFIX)]


def test_an_older_file_is_swapped_out_and_removed(tmp_path: Path) -> None:
    target = tmp_path / "dra-x.json"
    replace_file(target, b"old", mode=0o600, durable=False)
    old = FileId.of(os.lstat(target))
    replace_file(target, b"new", mode=0o600, durable=False)
    assert target.read_bytes() == b"new"
    assert not FileId.of(os.lstat(target)).same_inode(old)
    assert os.stat(target).st_mode & 0o777 == 0o600
    assert _temps(tmp_path) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["dra-x.json"]


def test_the_swap_is_what_replaces_a_file_not_kept_durably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename over the file makes ext4 write its blocks out at once: the swap is used
    whenever a regular file is there (and never for a durable write, which fsyncs anyway)."""
    swaps: list[str] = []
    real = atomicfile._exchanged

    def spy(dir_fd: int, tmp: str, filename: str) -> bool:
        done = real(dir_fd, tmp, filename)
        swaps.append(f"{filename}:{done}")
        return done

    monkeypatch.setattr(atomicfile, "_exchanged", spy)
    target = tmp_path / "f"
    replace_file(target, b"1", durable=False)  # nothing there yet: renamed, cheap
    replace_file(target, b"2", durable=False)
    replace_file(target, b"3")  # durable: a rename
    assert swaps == ["f:False", "f:True"]
    assert target.read_bytes() == b"3"


def test_a_link_at_the_name_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    target = tmp_path / "f"
    target.symlink_to(victim)
    replace_file(target, b"ours", durable=False)
    assert not target.is_symlink() and target.read_bytes() == b"ours"
    assert victim.read_bytes() == b"keep"
    assert _temps(tmp_path) == []


def test_a_folder_at_the_name_is_left_where_it_is(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.mkdir()
    (target / "inside").write_bytes(b"x")
    with pytest.raises(OSError):
        replace_file(target, b"ours", durable=False)
    assert (target / "inside").read_bytes() == b"x"
    assert _temps(tmp_path) == []


def test_an_old_file_that_cannot_be_removed_after_the_swap_leaves_the_write_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once swapped, the new file is in place: failing to remove the old one (now at the
    temporary name) is no failed write; the old file is a stale temporary, removed at the
    next start like any other."""
    target = tmp_path / "f"
    replace_file(target, b"old", durable=False)
    real_unlink = os.unlink

    def refusing(path: str, *, dir_fd: int | None = None) -> None:
        if str(path).endswith(TEMP_SUFFIX):
            raise PermissionError(1, "Operation not permitted", path)
        real_unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(atomicfile.os, "unlink", refusing)
    replace_file(target, b"new", durable=False)
    monkeypatch.undo()
    assert target.read_bytes() == b"new"
    [stale] = _temps(tmp_path)
    assert (tmp_path / stale).read_bytes() == b"old"
    assert atomicfile.remove_stale_temps(tmp_path) == 1 and _temps(tmp_path) == []
