"""Linux inotify through libc (the standard library has none): the constants, the calls and
the event records. :mod:`cdi_gen.cdi.folderwatch` watches spec folders with it,
:mod:`cdi_gen.kubelet.socketwatch` the kubelet's socket folders.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable, Iterator

from cdi_gen.libc import function, gil_holding_function

__all__ = [
    "IN_ATTRIB",
    "IN_CLOSE_WRITE",
    "IN_CREATE",
    "IN_DELETE",
    "IN_DELETE_SELF",
    "IN_IGNORED",
    "IN_MODIFY",
    "IN_MOVED_FROM",
    "IN_MOVED_TO",
    "IN_MOVE_SELF",
    "IN_ONLYDIR",
    "IN_Q_OVERFLOW",
    "IN_UNMOUNT",
    "SELF_EVENTS",
    "Inotify",
    "events",
    "inotify",
]

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

#: The events about the watched folder itself rather than an entry in it.
SELF_EVENTS = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED
_EVENT = struct.Struct("iIII")


class Inotify:
    """The three inotify calls through libc, and ``ioctl`` for FIONREAD."""

    def __init__(self) -> None:
        self._init1: Callable[[int], int] = function("inotify_init1", (ctypes.c_int,))
        self._add = function("inotify_add_watch", (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32))
        self._rm = function("inotify_rm_watch", (ctypes.c_int, ctypes.c_int))
        # Through PyDLL, which keeps the GIL: folderwatch calls it on every Allocate, from a
        # gRPC thread, and releasing the GIL for a call that never blocks lets grpc's own
        # threads take it, which costs more than the call (os.read and select.poll release it).
        self.ioctl = gil_holding_function("ioctl", (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p))

    def init(self) -> int:
        """A new non-blocking, close-on-exec inotify descriptor."""
        fd = self._init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return fd

    def add(self, fd: int, path: str, mask: int) -> int:
        """Watch ``path`` for ``mask``; the watch descriptor. Raises OSError naming the path."""
        wd = int(self._add(fd, os.fsencode(path), mask))
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), path)
        return wd

    def remove(self, fd: int, wd: int) -> None:
        self._rm(fd, wd)  # fails only for a watch the kernel already dropped


_libc: Inotify | None = None


def inotify() -> Inotify:
    """The calls, loaded from libc on first use. Raises OSError or AttributeError (a libc
    without inotify)."""
    global _libc  # noqa: PLW0603 (loaded once, on first use)
    if _libc is None:
        _libc = Inotify()
    return _libc


def events(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """The ``(wd, mask, name)`` records of one read of an inotify descriptor (``name`` is
    b"" for an event about the watched folder itself)."""
    offset = 0
    while offset + _EVENT.size <= len(data):
        wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
        raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
        offset += _EVENT.size + length
        yield wd, mask, raw.rstrip(b"\0")
