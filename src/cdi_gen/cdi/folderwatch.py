"""Whether anything a runtime reads in the CDI spec folders may have changed, from inotify.

:class:`FolderWatch` lets :class:`~cdi_gen.cdi.registry.SpecCache` answer from its last scan
without touching the folders: one non-blocking ``read`` of the inotify queue tells whether a
spec file was created, written, renamed, removed or changed mode since the last call. The
kernel queues an event before the write or rename that caused it returns, so a change made
before an Allocate is always seen by it: the answer is exact, not eventually right.

What is watched: every spec folder (entries whose name a runtime would read), and, for each
spec file that is a symbolic link, the folder of every link on the way and of the final file
(runtimes follow links, so a rewritten target is a changed spec). Whatever cannot be watched
says "changed" on every call instead, so the cache falls back to scanning: a missing folder
(until it appears: each call tries to watch it again), a folder that cannot be watched, a
full event queue (``IN_Q_OVERFLOW``), or no inotify at all (instance or watch limits).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import struct
import termios
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

__all__ = ["FolderWatch", "link_chain"]

log = logging.getLogger(__name__)

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

#: Everything that changes what a folder entry holds or whether it exists. The same mask on
#: every watch: adding a watch on an inode already watched replaces that watch's mask.
_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
_SELF = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED
_EVENT = struct.Struct("iIII")
#: Links followed in one path before giving up, as the kernel's ELOOP limit.
MAX_LINKS = 40


class _Inotify:
    """The three inotify calls through libc (the standard library has none)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._init1: Callable[[int], int] = libc.inotify_init1
        self._add = libc.inotify_add_watch
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self._rm = libc.inotify_rm_watch
        self._rm.argtypes = (ctypes.c_int, ctypes.c_int)
        # Through PyDLL, which keeps the GIL: this runs on every Allocate, from a gRPC
        # thread, and releasing the GIL for a call that never blocks lets grpc's own threads
        # take it, which costs more than the call (os.read and select.poll release it).
        self.ioctl = ctypes.PyDLL(libc._name).ioctl
        self.ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)

    def init(self) -> int:
        fd = self._init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return fd

    def add(self, fd: int, path: str) -> int:
        wd = int(self._add(fd, os.fsencode(path), _MASK))
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), path)
        return wd

    def remove(self, fd: int, wd: int) -> None:
        self._rm(fd, wd)  # fails only for a watch the kernel already dropped


_libc: _Inotify | None = None


def _inotify() -> _Inotify:
    global _libc  # noqa: PLW0603 (loaded once, on first use)
    if _libc is None:
        _libc = _Inotify()
    return _libc


def link_chain(path: str, limit: int = MAX_LINKS) -> set[tuple[str, str]]:
    """(folder, name) of every symbolic link met while resolving ``path``, and of the file
    it finally names: the entries whose change changes what ``path`` reads.

    Links inside the path (a linked folder, as Kubernetes' ``..data``) count as well as the
    last component. Stops quietly at a missing entry or after ``limit`` links.
    """
    found: set[tuple[str, str]] = set()
    parts = [p for p in reversed(os.path.abspath(path).split("/")) if p]
    resolved = "/"
    links = 0
    while parts:
        part = parts.pop()
        if part == ".":
            continue
        if part == "..":
            resolved = os.path.dirname(resolved)
            continue
        candidate = os.path.join(resolved, part)
        try:
            target = os.readlink(candidate)
        except OSError:  # not a link, or missing: a plain component
            resolved = candidate
            continue
        found.add((resolved, part))
        links += 1
        if links >= limit:
            return found
        if target.startswith("/"):
            resolved = "/"
        parts.extend(p for p in reversed(target.split("/")) if p)
    if resolved != "/":
        found.add((os.path.dirname(resolved), os.path.basename(resolved)))
    return found


class FolderWatch:
    """inotify watches on spec folders and on the targets of linked spec files.

    ``relevant(name)`` says whether an entry name in a spec folder matters (runtimes read
    only ``*.json`` and ``*.yaml``). Not thread-safe: the owner serialises calls. The inotify
    descriptor is closed by :meth:`close` or when the object is collected.
    """

    def __init__(self, folders: Sequence[Path], relevant: Callable[[str], bool]) -> None:
        self.folders = tuple(str(f) for f in folders)
        self._relevant = relevant
        self._fd = -1
        #: wd -> the spec folder it watches.
        self._folder_wds: dict[int, str] = {}
        #: Spec folders not watched now (missing, or the watch failed).
        self._unwatched: set[str] = set(self.folders)
        #: wd -> entry names that matter in a folder holding a link or a link's target.
        self._link_wds: dict[int, set[str]] = {}
        #: Whether inotify could be used at all.
        self.available = True
        self._finalizer: weakref.finalize[..., FolderWatch] | None = None
        try:
            self._fd = _inotify().init()
        except (OSError, AttributeError) as exc:
            # AttributeError: a libc without inotify. Scanning every time is still right.
            log.warning("spec folders are scanned on every check: no inotify (%s)", exc)
            self.available = False
            return
        self._finalizer = weakref.finalize(self, os.close, self._fd)
        self._fionread = _inotify().ioctl
        self._queued = ctypes.c_int()
        self._queued_ref = ctypes.byref(self._queued)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._fd = -1
        self.available = False

    def changed(self) -> bool:
        """Whether the folders may differ from when this was last called (True at first).

        Constant time when nothing happened: one ``poll`` of the event queue, plus one
        attempt to watch each folder that is not watched yet.
        """
        if not self.available:
            return True
        dirty = bool(self._fionread(self._fd, termios.FIONREAD, self._queued_ref))
        if dirty or self._queued.value:
            dirty = self._drain()
        if self._unwatched:
            dirty = self._watch_missing() or dirty
        return dirty

    def _watch_missing(self) -> bool:
        dirty = False
        for folder in list(self._unwatched):
            try:
                wd = _inotify().add(self._fd, folder)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    # Present but unwatchable (permissions, watch limit): scan every time.
                    dirty = True
                continue
            self._folder_wds[wd] = folder
            self._unwatched.discard(folder)
            dirty = True  # it appeared: whatever it holds is new
        return dirty

    def follow_links(self, linked_files: Iterable[str]) -> bool:
        """Watch what the given spec files (symbolic links) resolve through; drop the rest.

        Called after each scan with the links it found, so that rewriting, replacing or
        removing a target (or a link on the way) shows up as a change. Returns whether the
        watched set changed: a new watch does not report what happened before it existed.
        """
        if not self.available:
            return False
        wanted: dict[str, set[str]] = {}
        for path in linked_files:
            for folder, name in link_chain(path):
                wanted.setdefault(folder, set()).add(name)
        fresh: dict[int, set[str]] = {}
        for folder, names in wanted.items():
            try:
                wd = _inotify().add(self._fd, folder)
            except OSError:
                continue  # gone already; the next scan sees the dangling link
            fresh.setdefault(wd, set()).update(names)
        for wd in self._link_wds.keys() - fresh.keys() - self._folder_wds.keys():
            _inotify().remove(self._fd, wd)
        changed = fresh != self._link_wds
        self._link_wds = fresh
        return changed

    def _drain(self) -> bool:
        dirty = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return dirty
            except OSError as exc:
                log.warning("reading inotify events failed, scanning instead: %s", exc)
                return True
            if not data:
                return dirty
            if self._apply(data):
                dirty = True

    def _apply(self, data: bytes) -> bool:
        dirty = False
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
            offset += _EVENT.size + length
            if mask & IN_Q_OVERFLOW:
                dirty = True  # events were lost: only a full scan is exact
                continue
            name = os.fsdecode(raw.rstrip(b"\0"))
            folder = self._folder_wds.get(wd)
            if mask & _SELF and not name:
                if folder is not None:
                    # The folder itself went away (or moved): watch its path again later.
                    del self._folder_wds[wd]
                    self._unwatched.add(folder)
                    with contextlib.suppress(OSError):
                        if not mask & IN_IGNORED:
                            _inotify().remove(self._fd, wd)
                self._link_wds.pop(wd, None)
                dirty = True
                continue
            # A spec file of a folder, or a link (or target) a linked spec file goes through.
            if (folder is not None and self._relevant(name)) or name in self._link_wds.get(wd, ()):
                dirty = True
        return dirty
