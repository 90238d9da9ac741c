"""``read_required``: a file the caller cannot do without is read by ``read_regular``'s rules,
and every reason it is not, its absence too, is one ``FileRefused`` the caller prefixes once."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from cdi_gen.files import FileRefused, read_required


def test_a_missing_file_is_one_more_refusal(tmp_path: Path) -> None:
    with pytest.raises(FileRefused) as info:
        read_required(tmp_path / "gone.pem", 1024)
    assert str(info.value) == "no such file"


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (os.mkfifo, "not a regular file (a FIFO)"),
        (lambda p: p.symlink_to("/dev/zero"), "not a regular file (a character device)"),
        (lambda p: p.write_bytes(b"x" * 1025), "too large (1.0 KiB; the limit is 1.0 KiB)"),
    ],
    ids=["fifo", "link-to-dev-zero", "too-large"],
)
def test_what_read_regular_refuses_is_refused_the_same(
    tmp_path: Path, make: Callable[[Path], object], why: str
) -> None:
    path = tmp_path / "file"
    make(path)
    with pytest.raises(FileRefused) as info:
        read_required(path, 1024)
    assert str(info.value) == why


def test_a_regular_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"pem")
    assert read_required(path, 1024) == b"pem"
