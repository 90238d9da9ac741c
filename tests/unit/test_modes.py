"""Folders cdi-gen creates get their mode whatever the umask; existing ones are left alone."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cdi_gen.modes import make_folder, umask


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("mask", [0o000, 0o077, 0o777])
def test_created_folders_get_the_mode_whatever_the_umask(tmp_path: Path, mask: int) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    os.chmod(existing, 0o711)
    target = existing / "a" / "b"
    with umask(mask):
        make_folder(target)
    assert _mode(existing / "a") == 0o755
    assert _mode(target) == 0o755
    assert _mode(existing) == 0o711  # not ours: untouched
    make_folder(target)  # exists: nothing to do


def test_a_file_in_the_way_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(OSError):
        make_folder(tmp_path / "f")
    with pytest.raises(OSError):
        make_folder(tmp_path / "f" / "sub")


def test_umask_is_restored(tmp_path: Path) -> None:
    before = os.umask(0o022)
    try:
        with umask(0o177):
            (tmp_path / "x").touch()
        (tmp_path / "y").touch()
        assert _mode(tmp_path / "x") == 0o600
        assert _mode(tmp_path / "y") == 0o644
    finally:
        os.umask(before)
