"""Reading files that someone else may have put where cdi-gen looks.

Spec folders, configs, udev record files and runtime configs can hold anything: a FIFO (an
open for reading blocks until a writer comes), a link to ``/dev/zero`` (never ends), a device
whose mere open has side effects (a watchdog starts its timer, a tape rewinds) or a file of
gigabytes. :func:`read_regular` therefore checks the type with ``stat`` *before* opening,
opens without blocking, checks the type again on the open descriptor (the name may have been
swapped in between) and reads at most a cap, so a read costs bounded time and memory.

A symbolic link to a regular file is followed by default: the runtimes' CDI library follows
links in spec folders, and packages install specs that way (``/etc/cdi/x.json`` pointing into
``/opt``). Callers that own the folder (the writer) pass ``follow_symlinks=False``.
A caller that cannot do without the file (a certificate, a kubeconfig) reads it with
:func:`read_required`, for which a missing file is one more refusal.

:class:`FileId` is the one identity of a file at a name, by which cdi-gen tells whether the
file it wrote, read or created (a spec, a socket, the DRA checkpoint) is still the one there.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

#: Largest spec file read: room for ~16,000 devices as cdi-gen writes them (about 500 bytes a
#: device, 20,000 devices make 9.6 MiB), far more than a node has; parsing costs about 1 s per
#: 4 MiB, so this bounds what one planted file can cost a folder scan.
SPEC_MAX_BYTES = 8 << 20
#: Largest agent config: the embedded catalogue of every known class is under 6 KiB.
CONFIG_MAX_BYTES = 1 << 20
#: Largest ``--records`` file: ``udevadm info --export-db`` of a large server is a few MiB.
RECORDS_MAX_BYTES = 64 << 20
#: Largest runtime config (containerd's config.toml, a CRI-O drop-in) the doctor reads.
RUNTIME_CONFIG_MAX_BYTES = 1 << 20
#: Largest owner record: two hashes and a name take ~250 bytes.
OWNER_MAX_BYTES = 64 << 10


class FileId(NamedTuple):
    """Which file is at a name, and whether it changed since it was seen: two looks compare
    equal when they saw the same inode, unchanged in between (as far as the kernel records).

    ``dev`` and ``ino`` name the inode: a file replaced by a rename, or removed and made
    again, is another one. ``ctime_ns`` moves with everything done to the inode (a write, a
    truncation, a chmod, a rename of it, a new link) and is set by the kernel, never by a
    caller: it catches an edit in place and an inode number reused by a new file. ``mtime``
    is left out: whatever sets it (a write, ``utimes``) moves ctime too. ``size`` catches a
    write that changes the length within one tick of the clock the file system stamps
    ctime from, which ctime alone can miss. A write of the same length within one tick can
    go unseen: every user here accepts that (a reader that must be exact reads the bytes).

    Comparing an open descriptor with the name at one moment (is the file at the path still
    the one I hold?) asks only for the inode: :meth:`same_inode`, since a change made
    between the two looks is no answer to that question.
    """

    dev: int
    ino: int
    ctime_ns: int
    size: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileId:
        """The identity ``st`` (from ``stat``, ``lstat`` or ``fstat``) gives."""
        return cls(st.st_dev, st.st_ino, st.st_ctime_ns, st.st_size)

    def same_inode(self, other: FileId | None) -> bool:
        """Whether ``other`` is the same inode, changed or not."""
        return other is not None and (self.dev, self.ino) == (other.dev, other.ino)


def file_id(path: str | Path, *, follow: bool = False, dir_fd: int | None = None) -> FileId | None:
    """The identity of the file at ``path`` (the link itself unless ``follow``); None when
    nothing can be looked at there (missing, or the path cannot be followed): for "is it still
    the file I saw?" either is a no. A caller that must tell them apart stats itself and
    takes :meth:`FileId.of`."""
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    except OSError:
        return None
    return FileId.of(st)


class FileRefused(Exception):  # noqa: N818 - it is a refusal, not a programming error
    """A file is not read: not a regular file, too large, or unreadable (or, from
    :func:`read_required`, not there).

    ``str()`` is a one-line reason without the path (callers prefix it).
    """


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _human(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{size} bytes"


# Complexity exception (C901): the checks must run in this order on one descriptor (stat,
# open without blocking, fstat, bounded read); split up, the order would not be visible.
def read_regular(  # noqa: C901
    path: str | Path,
    limit: int,
    *,
    dir_fd: int | None = None,
    follow_symlinks: bool = True,
) -> bytes:
    """The content of the regular file at ``path`` (relative to ``dir_fd`` if given).

    Raises ``FileNotFoundError`` when nothing is there, and :class:`FileRefused` when the file
    is not a regular file (FIFO, device, folder, socket, or a link when ``follow_symlinks`` is
    False), is larger than ``limit`` bytes, or cannot be read. Never blocks on a special file
    and never opens a device.
    """
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise FileRefused(f"cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"not a regular file ({_kind(st.st_mode)})")
    if st.st_size > limit:
        raise FileRefused(f"too large ({_human(st.st_size)}; the limit is {_human(limit)})")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise FileRefused(f"cannot read: {exc.strerror or exc}") from None
    try:
        # Again on the descriptor: the name may now point at something else.
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise FileRefused(f"not a regular file ({_kind(mode)})")
        chunks: list[bytes] = []
        total = 0
        # One byte past the limit tells a file that grew since the stat.
        while total <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - total))):
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise FileRefused(f"too large (over {_human(limit)}, the limit)")
        return b"".join(chunks)
    except OSError as exc:
        raise FileRefused(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_required(path: str | Path, limit: int) -> bytes:
    """:func:`read_regular` of a file the caller cannot do without (a certificate, a
    kubeconfig): a missing file is one more :class:`FileRefused` (``no such file``), so the
    caller turns every reason into its own one-line error in one place."""
    try:
        return read_regular(path, limit)
    except FileNotFoundError:
        raise FileRefused("no such file") from None
