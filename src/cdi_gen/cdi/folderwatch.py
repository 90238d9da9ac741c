"""Whether anything a runtime reads in the CDI spec folders may have changed, from inotify.

:class:`FolderWatch` lets :class:`~cdi_gen.cdi.registry.SpecCache` answer from its last scan
without touching the folders: one non-blocking ``read`` of the inotify queue tells whether a
spec file was created, written, renamed, removed or changed mode since the last call. The
kernel queues an event before the write or rename that caused it returns, so a change made
before an Allocate is always seen by it: the answer is exact, not eventually right.

What is watched: every spec folder (entries whose name a runtime would read), and, for each
spec file that is a symbolic link, every folder its path goes through on the way to the final
file, with the names taken there (runtimes follow links, so a rewritten target, a swapped link
or a renamed folder on the way is a changed spec). A watch follows a folder, not its path, and
a runtime opens the folder by its path: so each call also stats every spec folder's path
(following links) and compares the device and inode with the folder watched. When they differ
(a link on the path swapped, a parent renamed and made again, something mounted over it) the
watch moves to the folder the path leads to now, and the call says "changed".

:meth:`FolderWatch.changes` names the spec files that changed when every event since the last
call is one the agent's own writer makes: a file renamed onto a spec file's name, renamed
away, or removed. The cache then asks whether each is a change the agent made itself and
knows already (a rename by someone else leaves another file there). Anything else names no
file, so only a scan is exact: an edit in place, a new file, a change of mode (the writer
never does these to a spec file, so however close in time to its write, they are someone
else's), a folder moved or made again, a change on a linked file's way, lost events.

Whatever cannot be watched says "changed" on every call instead, so the cache falls back to
scanning: a missing folder (until it appears: each call tries to watch it again), a folder
that cannot be watched, a full event queue (``IN_Q_OVERFLOW``), or no inotify at all
(instance or watch limits).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import termios
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from cdi_gen.inotify import (
    IN_ATTRIB,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    SELF_EVENTS,
    events,
    inotify,
)

__all__ = ["IN_Q_OVERFLOW", "FolderWatch", "path_entries"]

log = logging.getLogger(__name__)

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
#: The events the one spec writer makes on a spec file's name: its temporary file renamed
#: over it, or its removal (what happens to the replaced inode is reported on that inode
#: alone, which is not watched).
_RENAMES_AND_REMOVALS = IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE
#: Links followed in one path before giving up, as the kernel's ELOOP limit.
MAX_LINKS = 40
#: Where a descriptor can be named by path (absent without a mounted /proc).
_PROC_FDS = "/proc/self/fd"


def path_entries(path: str, limit: int = MAX_LINKS) -> set[tuple[str, str]]:
    """(folder, name) of every entry met while resolving ``path``: each component, each
    symbolic link and each component of its target, down to the file it finally names. These
    are the entries whose change (a link swapped, a folder renamed or made again) changes
    what ``path`` reads.

    Links inside the path (a linked folder, as Kubernetes' ``..data``) count as well as the
    last component. A missing component is named too (its creation matters); what would lie
    below it is not. Stops after ``limit`` links.
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
        found.add((resolved, part))
        try:
            target = os.readlink(candidate)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                return found  # missing (or unreadable): nothing below it can be watched
            resolved = candidate  # not a link: a plain component
            continue
        links += 1
        if links >= limit:
            return found
        if target.startswith("/"):
            resolved = "/"
        parts.extend(p for p in reversed(target.split("/")) if p)
    return found


def _leads_to(path: str, dev: int, ino: int) -> bool:
    """Whether ``path`` (links followed) leads to the folder ``(dev, ino)``."""
    try:
        st = os.stat(path)
    except OSError:
        return False  # leads to nothing now
    return st.st_ino == ino and st.st_dev == dev


class FolderWatch:
    """inotify watches on spec folders and on what linked spec files resolve through.

    ``relevant(name)`` says whether an entry name in a spec folder matters (runtimes read
    only ``*.json`` and ``*.yaml``). Not thread-safe: the owner serialises calls. The inotify
    descriptor is closed by :meth:`close` or when the object is collected.
    """

    def __init__(self, folders: Sequence[Path], relevant: Callable[[str], bool]) -> None:
        self.folders = tuple(str(f) for f in folders)
        self._relevant = relevant
        self._fd = -1
        #: Spec folder -> (wd, st_dev, st_ino) of the folder watched for it.
        self._armed: dict[str, tuple[int, int, int]] = {}
        #: wd -> the spec folders it watches (two paths may lead to one folder).
        self._folder_wds: dict[int, set[str]] = {}
        #: Spec folders not watched now (missing, or the watch failed).
        self._unwatched: set[str] = set(self.folders)
        #: wd -> entry names that matter in a folder a linked spec file resolves through.
        self._link_wds: dict[int, set[str]] = {}
        #: Whether inotify could be used at all.
        self.available = True
        self._finalizer: weakref.finalize[..., FolderWatch] | None = None
        try:
            self._fd = inotify().init()
        except (OSError, AttributeError) as exc:
            # AttributeError: a libc without inotify. Scanning every time is still right.
            log.warning("spec folders are scanned on every check: no inotify (%s)", exc)
            self.available = False
            return
        self._finalizer = weakref.finalize(self, os.close, self._fd)
        self._fionread = inotify().ioctl
        self._queued = ctypes.c_int()
        self._queued_ref = ctypes.byref(self._queued)
        # Through /proc the watch is set on the very folder whose inode is recorded.
        self._via_proc = os.path.isdir(_PROC_FDS)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._fd = -1
        self.available = False

    def changed(self) -> bool:
        """Whether the folders may differ from when this was last called (True at first).

        Constant time when nothing happened: one ``poll`` of the event queue, one ``stat``
        of each folder's path, and one attempt to watch each folder not watched yet.
        """
        return self.changes() != set()

    def changes(self) -> set[str] | None:
        """What changed since the last call: an empty set for nothing, the paths (spec
        folder joined with the name) of the spec files the events named when they name
        every change, or None when anything may have changed (at first, too). Costs what
        :meth:`changed` costs."""
        if not self.available:
            return None
        named: set[str] | None = set()
        if self._fionread(self._fd, termios.FIONREAD, self._queued_ref) or self._queued.value:
            named = self._drain()
        # After the drain: a folder the kernel dropped (removed, moved) is no longer armed.
        moved = [f for f, (_wd, dev, ino) in self._armed.items() if not _leads_to(f, dev, ino)]
        if moved:
            # Watch each again where its path leads now (or later, once it leads somewhere).
            for folder in moved:
                self._disarm(folder)
            self._watch_missing()
            return None
        if self._unwatched and self._watch_missing():
            return None
        return named

    def _watch_missing(self) -> bool:
        dirty = False
        for folder in list(self._unwatched):
            try:
                wd, dev, ino = self._watch_folder(folder)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    # Present but unwatchable (permissions, watch limit): scan every time.
                    dirty = True
                continue
            self._armed[folder] = (wd, dev, ino)
            self._folder_wds.setdefault(wd, set()).add(folder)
            self._unwatched.discard(folder)
            dirty = True  # it appeared, or the path leads elsewhere: whatever it holds is new
        return dirty

    def _watch_folder(self, folder: str) -> tuple[int, int, int]:
        """Watch the folder ``folder`` leads to now: (wd, st_dev, st_ino) of that folder."""
        if not self._via_proc:
            # Without /proc: the path must lead to one folder before and after the watch.
            before = os.stat(folder)
            wd = inotify().add(self._fd, folder, _MASK)
            after = os.stat(folder)
            if (before.st_dev, before.st_ino) != (after.st_dev, after.st_ino):
                self._release(wd)
                raise OSError(errno.EAGAIN, "the folder changed while watched", folder)
            return wd, after.st_dev, after.st_ino
        # The descriptor pins the folder: the watch and the recorded inode are the same one,
        # whatever happens to the path meanwhile. O_PATH needs no read permission.
        fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            return inotify().add(self._fd, f"{_PROC_FDS}/{fd}", _MASK), st.st_dev, st.st_ino
        finally:
            os.close(fd)

    def _disarm(self, folder: str) -> None:
        """Stop watching for ``folder`` the folder its path led to; watch it again later."""
        armed = self._armed.pop(folder, None)
        self._unwatched.add(folder)
        if armed is None:
            return
        wd = armed[0]
        users = self._folder_wds.get(wd)
        if users is not None:
            users.discard(folder)
            if users:
                return  # another spec folder's path still leads there
            del self._folder_wds[wd]
        self._release(wd)

    def _release(self, wd: int) -> None:
        """Remove ``wd`` unless still used. One watch serves an inode for every purpose."""
        if wd not in self._folder_wds and wd not in self._link_wds:
            inotify().remove(self._fd, wd)

    def follow_links(self, linked_files: Iterable[str]) -> bool:
        """Watch what the given spec files (symbolic links) resolve through; drop the rest.

        Called after each scan with the links it found, so that rewriting, replacing or
        removing a target, a link on the way or a folder on the way shows up as a change.
        Returns whether the watched set changed: a new watch does not report what happened
        before it existed.
        """
        if not self.available:
            return False
        wanted: dict[str, set[str]] = {}
        for path in linked_files:
            for folder, name in path_entries(path):
                wanted.setdefault(folder, set()).add(name)
        fresh: dict[int, set[str]] = {}
        for folder, names in wanted.items():
            try:
                wd = inotify().add(self._fd, folder, _MASK)
            except OSError:
                continue  # gone already; the next scan sees the dangling link
            fresh.setdefault(wd, set()).update(names)
        dropped = self._link_wds.keys() - fresh.keys()
        changed = fresh != self._link_wds
        self._link_wds = fresh
        for wd in dropped:
            self._release(wd)
        return changed

    def _drain(self) -> set[str] | None:
        """Read every queued event: the spec files they name, None when they do not name
        every change."""
        named: set[str] | None = set()
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return named
            except OSError as exc:
                log.warning("reading inotify events failed, scanning instead: %s", exc)
                return None
            if not data:
                return named
            more = self._apply(data)
            named = None if more is None or named is None else named | more

    def _apply(self, data: bytes) -> set[str] | None:
        """The spec files ``data``'s events name; None when one names no file."""
        named: set[str] = set()
        unnamed = False
        for wd, mask, raw in events(data):
            if mask & IN_Q_OVERFLOW:
                unnamed = True  # events were lost: only a full scan is exact
                continue
            folders = self._folder_wds.get(wd)
            links = self._link_wds.get(wd)
            if folders is None and links is None:
                # A watch dropped already (its IN_IGNORED, or events queued before): its
                # folder is on no path we follow, and dropping it was a change already seen.
                continue
            name = os.fsdecode(raw)
            if mask & SELF_EVENTS and not name:
                self._gone(wd, mask, folders)
                unnamed = True
            elif links and name in links:
                unnamed = True  # on a linked spec file's way: which files it changes is not known
            elif folders is not None and self._relevant(name):
                if mask & _RENAMES_AND_REMOVALS:
                    named.update(os.path.join(folder, name) for folder in folders)
                else:
                    unnamed = True
        return None if unnamed else named

    def _gone(self, wd: int, mask: int, folders: set[str] | None) -> None:
        """The watched folder ``wd`` itself went away (or moved)."""
        if folders is not None:
            # Watch its path again later.
            del self._folder_wds[wd]
            for folder in folders:
                self._armed.pop(folder, None)
            self._unwatched.update(folders)
        self._link_wds.pop(wd, None)
        if not mask & IN_IGNORED:
            inotify().remove(self._fd, wd)
