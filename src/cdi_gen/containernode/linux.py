"""The Linux calls the standard library lacks, through libc: ``setns(2)`` and ``openat2(2)``
with its ``RESOLVE_*`` flags, and :func:`beneath`, a path opened below a folder's descriptor
with no link followed (``openat2``, or one ``O_NOFOLLOW`` open per component where the kernel
has no ``openat2``); a process's start time from ``/proc``. Light to import: the child process
of every replacement loads it."""

from __future__ import annotations

import ctypes
import errno
import os

from cdi_gen.libc import function

__all__ = [
    "CLONE_NEWNS",
    "RESOLVE_BENEATH",
    "RESOLVE_NO_MAGICLINKS",
    "RESOLVE_NO_SYMLINKS",
    "beneath",
    "pidfd_alive",
    "process_start",
    "setns",
]

#: ``setns`` namespace type of a mount namespace (<linux/sched.h>).
CLONE_NEWNS = 0x00020000
#: ``struct open_how.resolve`` flags (<linux/openat2.h>).
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
#: ``openat2`` and ``pidfd_send_signal``: one number on every architecture since the calls
#: numbered from 424 (Linux 5.1).
_SYS_OPENAT2 = 437
_SYS_PIDFD_SEND_SIGNAL = 424
#: No link of any kind, nothing above the starting folder.
_SAFE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS

_setns = function("setns", (ctypes.c_int, ctypes.c_int))
_syscall = function("syscall", restype=ctypes.c_long)


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


class _Kernel:
    """What the kernel was found to lack, learnt at the first call."""

    #: Whether it has ``openat2`` (Linux 5.6).
    openat2 = True


_kernel = _Kernel()


def _error(path: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code), path)


def setns(fd: int, nstype: int) -> None:
    """Move the calling thread into the namespace ``fd`` names (a pidfd or an ``ns`` file).
    A mount namespace takes only a single-threaded caller: the child process, never the
    agent."""
    if _setns(fd, nstype) != 0:
        raise _error(f"setns({nstype:#x})")


def pidfd_alive(pidfd: int) -> bool:
    """Whether the process of ``pidfd`` has not exited (signal 0 through the pidfd: what
    ``signal.pidfd_send_signal`` does, without the ``signal`` module's import, which the
    child would pay on every replacement)."""
    args = (ctypes.c_int(pidfd), ctypes.c_int(0), ctypes.c_void_p(None), ctypes.c_uint(0))
    if _syscall(ctypes.c_long(_SYS_PIDFD_SEND_SIGNAL), *args) == 0:
        return True
    code = ctypes.get_errno()
    if code == errno.ESRCH:
        return False
    raise OSError(code, os.strerror(code), "pidfd_send_signal")


def _openat2(dirfd: int, path: str, flags: int) -> int:
    how = _OpenHow(flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0, _SAFE)
    fd = _syscall(
        ctypes.c_long(_SYS_OPENAT2),
        ctypes.c_int(dirfd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        raise _error(path)
    return int(fd)


def _walk(dirfd: int, path: str, flags: int) -> int:
    """One ``O_NOFOLLOW`` open per component, each from its parent's descriptor: a link at
    any component fails (ELOOP for the last, ENOTDIR before it)."""
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise OSError(errno.EXDEV, "a component climbs or is empty", path)
    current = os.dup(dirfd)
    try:
        for part in parts[:-1]:
            folder = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            following = os.open(part, folder, dir_fd=current)
            os.close(current)
            current = following
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
    finally:
        os.close(current)


def beneath(dirfd: int, path: str, flags: int) -> int:
    """Open the relative ``path`` below ``dirfd`` with ``flags`` and ``O_NOFOLLOW``: no
    symbolic or magic link followed at any component, nothing above ``dirfd`` reached (a link
    fails with ELOOP or ENOTDIR, a climb with EXDEV; with ``O_PATH`` a link as the last
    component is opened as itself, so the caller checks what it got). Mounts below are
    crossed: a container's ``/dev`` is one."""
    if _kernel.openat2:
        try:
            return _openat2(dirfd, path, flags)
        except OSError as error:
            if error.errno != errno.ENOSYS:
                raise
            _kernel.openat2 = False
    return _walk(dirfd, path, flags)


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (``/proc/PID/stat`` field
    22); None when there is no such process. A PID given again to a later process has
    another start time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read(4096)
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: count after the last ")".
    fields = text.rpartition(b")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None
