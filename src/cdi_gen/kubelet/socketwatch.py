"""inotify on the folders of the kubelet's socket files: who follows a file is woken when it is
created, removed, renamed or changed, or when its folder goes; who follows a folder, when any
entry of it does (a DRA driver watching for its successor's registration socket).

A kubelet restart removes our socket files and creates ``kubelet.sock`` anew; the
:class:`~cdi_gen.kubelet.supervisor.Supervisor` must notice within a fraction of a second, and
looking at the files a few times a second kept an idle agent awake for nothing. With this the
supervisor sleeps until the kernel says one of its files changed.

One inotify descriptor per event loop serves every follower (:meth:`SocketWatch.of`): a node
has few inotify instances (128 per user by default) and every plugin of the agent follows
files in the same folders. A watch is on a folder, and an event wakes only the followers of
the entry named. What inotify cannot see is left to the follower's own slower look, and
:meth:`SocketWatch.arm` says when that look must be frequent: a folder that is missing or
cannot be watched (until it can), no inotify at all. A folder removed or moved away is watched
again through its path at the next :meth:`~SocketWatch.arm`; a parent of it renamed sends no
event (the watch follows the folder, not its path).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ClassVar

from cdi_gen.inotify import (
    IN_ATTRIB,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    SELF_EVENTS,
    events,
    inotify,
)

__all__ = ["SocketWatch"]

log = logging.getLogger(__name__)

#: An entry created, removed, renamed or changed (a file's identity includes its ctime), and
#: the folder itself going.
_MASK = (
    IN_ATTRIB
    | IN_CREATE
    | IN_DELETE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)

_Entry = tuple[str, str | None]  # (folder, name); None: every entry of the folder


class SocketWatch:
    """The files followed on one event loop, and one inotify descriptor watching their
    folders. Followers come and go (:meth:`follow`, :meth:`unfollow`); the descriptor is
    closed when the last one goes."""

    _shared: ClassVar[dict[asyncio.AbstractEventLoop, SocketWatch]] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._fd = -1
        self.available = True
        self._ids = itertools.count()
        #: Follower -> (the entries it follows, how to wake it).
        self._followers: dict[int, tuple[frozenset[_Entry], Callable[[], None]]] = {}
        #: Folder -> its watch; watch -> the folders it serves (two paths, one folder).
        self._armed: dict[str, int] = {}
        self._folders: dict[int, set[str]] = {}

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> SocketWatch:
        """The watch of ``loop`` (made on first use)."""
        watch = cls._shared.get(loop)
        if watch is None:
            watch = cls._shared[loop] = cls(loop)
        return watch

    def follow(
        self, files: Iterable[Path], wake: Callable[[], None], folders: Iterable[Path] = ()
    ) -> int:
        """Call ``wake()`` on the loop whenever one of ``files``, or any entry of one of
        ``folders``, may have changed; a handle for :meth:`unfollow`."""
        entries: frozenset[_Entry] = frozenset(
            [os.path.split(os.path.abspath(f)) for f in files]
            + [(os.path.abspath(f), None) for f in folders]
        )
        handle = next(self._ids)
        self._followers[handle] = (entries, wake)
        if self._fd < 0 and self.available:
            self._open()
        self.arm()
        return handle

    def unfollow(self, handle: int) -> None:
        """Stop waking the follower ``handle``; unwatch the folders nobody follows."""
        self._followers.pop(handle, None)
        wanted = self._wanted()
        for folder in [f for f in self._armed if f not in wanted]:
            self._disarm(folder)
        if not self._followers:
            self._close()

    def arm(self) -> bool:
        """Watch every followed folder not watched yet; whether all are (if not, changes in
        the others are seen only by looking)."""
        if self._fd < 0:
            return False
        complete = True
        for folder in self._wanted() - self._armed.keys():
            try:
                wd = inotify().add(self._fd, folder, _MASK)
            except OSError:
                complete = False  # missing, not a folder, or the watch limit: look instead
                continue
            self._armed[folder] = wd
            self._folders.setdefault(wd, set()).add(folder)
        return complete

    def _wanted(self) -> set[str]:
        return {folder for entries, _ in self._followers.values() for folder, _name in entries}

    def _open(self) -> None:
        try:
            self._fd = inotify().init()
        except (OSError, AttributeError) as exc:
            # AttributeError: a libc without inotify. The followers look often instead.
            log.warning("kubelet sockets are looked at often: no inotify (%s)", exc)
            self.available = False
            return
        self._loop.add_reader(self._fd, self._read)

    def _close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
        self._fd = -1
        self._armed.clear()
        self._folders.clear()
        if SocketWatch._shared.get(self._loop) is self:
            del SocketWatch._shared[self._loop]

    def _disarm(self, folder: str) -> None:
        wd = self._armed.pop(folder)
        users = self._folders.get(wd, set())
        users.discard(folder)
        if not users:
            self._folders.pop(wd, None)
            inotify().remove(self._fd, wd)

    def _read(self) -> None:
        woken: set[int] = set()
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                log.warning("reading inotify events of kubelet sockets failed: %s", exc)
                woken.update(self._followers)
                break
            if not data:
                break
            woken.update(self._apply(data))
        for handle in woken:
            follower = self._followers.get(handle)
            if follower is not None:
                follower[1]()

    def _apply(self, data: bytes) -> set[int]:
        """The followers to wake for these events."""
        touched: set[_Entry] = set()
        lost: set[str] = set()
        for wd, mask, raw in events(data):
            if mask & IN_Q_OVERFLOW:
                return set(self._followers)  # events were lost: everyone looks
            folders = self._folders.get(wd)
            if folders is None:
                continue  # a watch dropped already
            if mask & SELF_EVENTS and not raw:
                # The folder went (or moved): watch its path again at the next arm().
                del self._folders[wd]
                for folder in folders:
                    self._armed.pop(folder, None)
                if not mask & IN_IGNORED:
                    inotify().remove(self._fd, wd)
                lost |= folders
                continue
            name = os.fsdecode(raw)
            touched.update((folder, name) for folder in folders)
            touched.update((folder, None) for folder in folders)
        return {
            handle
            for handle, (entries, _) in self._followers.items()
            if entries & touched or any(folder in lost for folder, _name in entries)
        }
