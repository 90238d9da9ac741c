"""Atomic file steps in a folder: a file replaced through a temporary name, so a reader sees
the old or the new complete file, never a partial one, even if we are killed at any point.

Runtimes rescan the spec folder on every change and may read a file while it is being
written, so :func:`atomic_replace` writes to a temporary name they ignore (hidden, ending in
``.cdi-gen-tmp``), created with ``O_EXCL|O_NOFOLLOW`` so nothing planted there is written
through, fsyncs it, renames it over the target and fsyncs the folder. What a killed writer
left at a temporary name is swept by :func:`remove_stale_temps`. Spec files and their owner
records (:mod:`cdi_gen.cdi.writer`), the DRA checkpoint and a claim's device metadata (these
two without the fsyncs), and ``render --output`` are all written this way.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from cdi_gen.errors import SpecWriteError
from cdi_gen.files import FileId, file_id
from cdi_gen.libc import optional_function
from cdi_gen.modes import make_folder

__all__ = [
    "DIR_MODE",
    "SPEC_MODE",
    "TEMP_SUFFIX",
    "StepHook",
    "atomic_replace",
    "folder",
    "remove_stale_temps",
    "remove_stale_temps_in",
    "replace_file",
    "write_file",
]

SPEC_MODE = 0o644
DIR_MODE = 0o755
TEMP_SUFFIX = ".cdi-gen-tmp"

#: Test seam: called with the name of each step; a test makes it kill the process.
StepHook = Callable[[str], None]


@contextlib.contextmanager
def folder(spec_dir: Path, create: bool = False) -> Iterator[int]:
    """A descriptor of the folder (a spec folder, or any folder a file is replaced in), created
    when missing with ``create``. The folder itself may be reached through links, as
    ``/var/run`` is; what is inside it never is."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        fd = os.open(spec_dir, flags)
    except FileNotFoundError:
        # Created only when missing (the common case, a write into a folder that exists,
        # costs one open): every prepared claim writes here.
        if not create:
            raise
        make_folder(spec_dir, DIR_MODE)  # explicit mode: not 0700 under umask 077
        fd = os.open(spec_dir, flags)
    try:
        yield fd
    finally:
        os.close(fd)


def atomic_replace(
    dir_fd: int,
    filename: str,
    data: bytes,
    mode: int = SPEC_MODE,
    *,
    durable: bool = True,
    hook: StepHook | None = None,
) -> FileId:
    """Write ``data`` to ``filename`` in the folder through an ignored temporary name; the
    file gets ``mode``. Without ``durable``, no fsync: readers still see the old or the new
    file, but a power loss may leave either (or an empty one), and an older file at the name
    is swapped out rather than renamed over (see :func:`_exchanged`).

    Returns the identity of the file put in place, as a look at the name finds it after
    the rename (which moves ctime); when the name no longer holds that file (replaced at
    once), an identity no look at the name will find.
    """
    tmp = f".{filename}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    # O_EXCL|O_NOFOLLOW: never write through a link or file planted at the temporary name.
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    try:
        try:
            if hook:
                hook("temp-created")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if hook:
                hook("temp-written")
            os.fchmod(fd, mode)  # explicit: the umask must not make specs unreadable
            if durable:
                os.fsync(fd)
            ours = FileId.of(os.fstat(fd))
        finally:
            # Closed before the rename: the close of a file written is an event of its name.
            os.close(fd)
        if hook:
            hook("temp-synced")
        # rename() replaces a link at the target instead of following it.
        if durable or not _exchanged(dir_fd, tmp, filename):
            os.rename(tmp, filename, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    found = file_id(filename, dir_fd=dir_fd)
    if hook:
        hook("renamed")
    if durable:
        os.fsync(dir_fd)
    # The name holds another file already: ours, kept, is found at it by no look.
    return found if found is not None and ours.same_inode(found) else ours


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    return optional_function(  # glibc 2.28 and later
        "renameat2", (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    )


#: renameat2's flag: swap the two names, atomically (Linux 3.15; ext4, xfs, btrfs, tmpfs).
_RENAME_EXCHANGE = 2


def _exchanged(dir_fd: int, tmp: str, filename: str) -> bool:
    """Put ``tmp`` in place of the regular file at ``filename`` by swapping the two names
    and removing the old file (now at ``tmp``); False, with nothing changed, when there is no
    regular file there to swap or the swap is not supported (the caller renames).

    Why not a rename: ext4 starts writing a file's blocks out when a rename replaces another
    file (its ``auto_da_alloc`` guard for programs that skip fsync), which costs a
    non-durable replace several times the write itself; a swap is as atomic for readers (the
    old file or the new one at the name, never none) and leaves that to the kernel's own
    writeback, which is what "not durable" asks for.
    """
    call = _renameat2()
    try:
        if call is None or not stat.S_ISREG(os.lstat(filename, dir_fd=dir_fd).st_mode):
            return False
    except OSError:
        return False  # nothing there: a rename is as cheap
    if call(dir_fd, tmp.encode(), dir_fd, filename.encode(), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOENT):
            return False  # not supported here, or the file went meanwhile
        raise OSError(err, os.strerror(err), filename)
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except IsADirectoryError:
        # Something else than the file checked was swapped out (replaced between the look
        # and the swap): put it back where it was; the rename then fails as it would have.
        call(dir_fd, tmp.encode(), dir_fd, filename.encode(), _RENAME_EXCHANGE)
        return False
    except OSError:
        # The new file is in place: the write is done. The old one, left at the temporary
        # name, is a stale temporary like a killed writer's (remove_stale_temps).
        pass
    return True


def remove_stale_temps_in(dir_fd: int) -> int:
    """Delete the temporary files a killed writer left in the folder ``dir_fd``; how many."""
    removed = 0
    for name in os.listdir(dir_fd):
        if name.startswith(".") and name.endswith(TEMP_SUFFIX):
            with contextlib.suppress(OSError):
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                    os.unlink(name, dir_fd=dir_fd)
                    removed += 1
    return removed


def remove_stale_temps(spec_dir: Path) -> int:
    """Delete temporary files a killed writer left behind; return how many."""
    try:
        with folder(spec_dir) as dir_fd:
            return remove_stale_temps_in(dir_fd)
    except OSError:
        return 0  # absent or unreadable: the write that follows reports why


def replace_file(path: Path, data: bytes, mode: int = SPEC_MODE, *, durable: bool = True) -> None:
    """Atomically and durably make ``path`` hold ``data`` with ``mode``: temporary name,
    fsync, rename, folder fsync, missing folders created; raises OSError. The one way every
    file cdi-gen owns outside its specs is written (``render --output``, the DRA checkpoint,
    a claim's device metadata). Without ``durable``, the fsyncs are left out: for a file
    that need not outlive a power loss (made again whenever it is found missing or
    unreadable, or the DRA checkpoint, which a reboot voids).
    """
    with folder(path.parent, create=True) as dir_fd:
        atomic_replace(dir_fd, path.name, data, mode, durable=durable)


def write_file(path: Path, data: bytes) -> None:
    """Atomically make ``path`` hold ``data`` (``render --output``): the same temporary name,
    fsync, rename and folder fsync as a spec, without an ownership record (the user named
    the file). Creates missing folders. A link or file planted at the temporary name is never
    written through. Raises :class:`SpecWriteError`.
    """
    if not path.name or path.name in (".", ".."):
        raise SpecWriteError(f"cannot write {str(path)!r}: not a file name")
    try:
        replace_file(path, data)
    except OSError as exc:
        raise SpecWriteError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from exc
