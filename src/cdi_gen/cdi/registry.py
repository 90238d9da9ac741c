"""The CDI spec folders as a container runtime sees them.

Mirrors the runtimes' CDI cache: folders are scanned in order (later folder = higher priority,
so ``/var/run/cdi`` overrides ``/etc/cdi``), only ``*.json`` and ``*.yaml`` files directly in a
folder count, a file that fails to load is reported and skipped, a device defined at a higher
priority silently wins, and a device defined twice at the *same* priority is a conflict that
removes it altogether (even if a higher folder also defines it, as the library does).

:class:`SpecCache` keeps what each file defines (its kind and device names, not the parsed
spec: 1.8 MiB of models for 1,000 devices) between calls, learns from inotify (and a stat of
each folder's path) whether anything changed, and then re-reads only files whose stat changed,
so the device plugin can check every Allocate against the folders in constant time.

The agent's own writes need no scan: the writer tells the cache (:meth:`SpecCache.wrote`,
:meth:`SpecCache.removed`, through :class:`~cdi_gen.cdi.store.SpecStore`) what it put at a
name and the identity (:class:`~cdi_gen.files.FileId`) of the file it left there. When every
event since the last look is a rename or removal of such a file (see
:meth:`~cdi_gen.cdi.folderwatch.FolderWatch.changes`) and one ``lstat`` finds each still the
file the agent left (or still gone), the cache takes the bytes it was given instead of the
folder's, and :func:`patch_registry` applies them (the rules applied anew only when a device
of theirs is defined elsewhere): so a DRA claim's own spec, written just before its names are
checked, is checked without a scan. Anything else someone did (a file of ours touched,
edited, replaced or made again, another file, a link's way) fails that test, and the folders
are scanned as before.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cdi_gen.cdi.codec import Format, format_of, load_spec
from cdi_gen.cdi.folderwatch import FolderWatch
from cdi_gen.errors import SpecError
from cdi_gen.files import SPEC_MAX_BYTES, FileId, FileRefused, read_regular
from cdi_gen.paths import RUNTIME_SPEC_DIRS

if TYPE_CHECKING:
    # Imported by load_spec when the first file is read (the first Allocate or prepare),
    # so that the agent's start does not wait for models it has no spec to build with yet.
    from cdi_gen.cdi.spec import Spec

#: Longest :meth:`SpecCache.fresh_registry` waits for another check to release the cache:
#: a check between changes holds it for microseconds, a scan for as long as the folders take.
FAST_WAIT_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class SpecFile:
    """One candidate spec file: its kind and device names when it loaded, else the reasons
    it did not. ``spec`` holds the parsed spec only for a caller that asked to keep it."""

    path: Path
    priority: int
    #: None when the file did not load.
    kind: str | None
    names: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    spec: Spec | None = None

    @property
    def loaded(self) -> bool:
        return self.kind is not None


@dataclass(frozen=True, slots=True)
class Entry:
    """A device a runtime can resolve, and the file it comes from."""

    qualified: str
    path: Path
    priority: int


@dataclass(slots=True)
class Registry:
    """Result of scanning the folders: what resolves, what conflicts, what was overridden."""

    dirs: tuple[Path, ...]
    files: list[SpecFile] = field(default_factory=list)
    devices: dict[str, Entry] = field(default_factory=dict)
    #: qualified name → the files that define it at one priority (device dropped).
    conflicts: dict[str, list[Path]] = field(default_factory=dict)
    #: qualified name → lower-priority files whose definition is overridden.
    shadowed: dict[str, list[Path]] = field(default_factory=dict)
    #: path → messages (load failures and conflicts), as runtimes record them.
    errors: dict[Path, list[str]] = field(default_factory=dict)
    dir_errors: dict[Path, str] = field(default_factory=dict)

    def explain(self, qualified: str) -> str | None:
        """None if ``qualified`` resolves; else why not, naming files where it can."""
        if qualified in self.devices:
            return None
        if qualified in self.conflicts:
            files = ", ".join(repr(str(p)) for p in self.conflicts[qualified])
            return f"CDI device {qualified!r} is defined in more than one spec file ({files})"
        kind = qualified.partition("=")[0]
        broken = [f for f in self.files if not f.loaded and _may_define(f.path, kind)]
        hint = ""
        if broken:
            first = broken[0]
            hint = f"; spec file {str(first.path)!r} is invalid: {first.errors[0]}"
        dirs = ", ".join(str(d) for d in self.dirs)
        return f"CDI device {qualified!r} is not defined in any valid spec in {dirs}{hint}"


def _may_define(path: Path, kind: str) -> bool:
    # Producers name files <vendor>-<class>.*; a broken file of that name likely held it.
    return path.name.startswith(kind.replace("/", "-"))


def _scan_dir(directory: Path) -> tuple[list[os.DirEntry[str]], str | None]:
    """The candidate files of ``directory``, sorted, and an error."""
    try:
        with os.scandir(directory) as it:
            entries = [e for e in it if format_of(e.name) is not None]
    except FileNotFoundError:
        return [], None
    except OSError as exc:
        return [], f"cannot read spec folder {str(directory)!r}: {exc.strerror or exc}"
    entries.sort(key=lambda e: e.name)
    return entries, None


def load_file(path: Path, priority: int, *, keep_spec: bool = False) -> SpecFile:
    """Read and validate one spec file; failures are recorded, not raised. The parsed spec
    is kept only with ``keep_spec``."""
    fmt = format_of(path.name)
    assert fmt is not None
    try:
        # Anyone who can write a folder may plant a FIFO, a link to /dev/zero or a huge file
        # there; runtimes follow links, so a link to a regular file is read like one.
        data = read_regular(path, SPEC_MAX_BYTES)
    except FileNotFoundError:
        return SpecFile(path, priority, None, errors=("cannot read: removed while scanning",))
    except FileRefused as exc:
        return SpecFile(path, priority, None, errors=(str(exc),))
    return parse_file(path, priority, data, fmt, keep_spec=keep_spec)


def parse_file(
    path: Path, priority: int, data: bytes, fmt: Format, *, keep_spec: bool = False
) -> SpecFile:
    """What the spec file ``path`` holding ``data`` defines; failures are recorded."""
    try:
        spec = load_spec(data, fmt)
    except SpecError as exc:
        return SpecFile(path, priority, None, errors=tuple(str(p) for p in exc.problems))
    names = tuple(d.name for d in spec.devices)
    return SpecFile(path, priority, spec.kind, names, spec=spec if keep_spec else None)


def build_registry(
    dirs: Sequence[Path], files: Iterable[SpecFile], dir_errors: dict[Path, str]
) -> Registry:
    """Apply priority and conflict rules to loaded files given in scan order."""
    reg = Registry(dirs=tuple(dirs), dir_errors=dict(dir_errors))
    conflicted: set[str] = set()
    for sf in files:
        reg.files.append(sf)
        if not sf.loaded:
            reg.errors.setdefault(sf.path, []).extend(sf.errors)
            continue
        for name in sf.names:
            qualified = f"{sf.kind}={name}"
            old = reg.devices.get(qualified)
            if old is not None:
                if old.priority == sf.priority:
                    msg = (
                        f"conflicting device {qualified!r} "
                        f"(specs {str(sf.path)!r}, {str(old.path)!r})"
                    )
                    reg.errors.setdefault(sf.path, []).append(msg)
                    reg.errors.setdefault(old.path, []).append(msg)
                    conflicted.add(qualified)
                    paths = reg.conflicts.setdefault(qualified, [old.path])
                    paths.append(sf.path)
                    continue
                reg.shadowed.setdefault(qualified, []).append(old.path)
            reg.devices[qualified] = Entry(qualified, sf.path, sf.priority)
    for qualified in conflicted:
        entry = reg.devices.pop(qualified, None)
        # A higher folder's definition is dropped too; name it so the report is complete.
        if entry is not None and entry.path not in reg.conflicts[qualified]:
            reg.conflicts[qualified].append(entry.path)
    return reg


#: Where a file stands in the order a scan meets files: its folder's priority, its name.
_Place = tuple[int, str]


def _place(sf: SpecFile) -> _Place:
    return sf.priority, sf.path.name


def _qualified(sf: SpecFile) -> list[str]:
    return [f"{sf.kind}={n}" for n in sf.names] if sf.loaded else []


def patch_registry(
    reg: Registry, places: list[_Place], drop: Iterable[SpecFile], add: Iterable[SpecFile]
) -> tuple[Registry, list[_Place]] | None:
    """``reg`` (its files at ``places``) with the files ``drop`` taken out and ``add`` put
    in, and their places, as :func:`build_registry` would make it: when no device of theirs is
    defined by any other file, as a DRA claim's own spec's are not. None when the priority
    and conflict rules have more to decide."""
    files, places = list(reg.files), list(places)
    devices, errors = dict(reg.devices), dict(reg.errors)
    contested = reg.conflicts.keys() | reg.shadowed.keys()
    for sf in drop:
        for q in _qualified(sf):
            entry = devices.pop(q, None)
            if entry is None or entry.path != sf.path or q in contested:
                return None
        i = bisect.bisect_left(places, _place(sf))
        if i == len(files) or files[i].path != sf.path:
            return None
        del files[i], places[i]
        errors.pop(sf.path, None)
    for sf in add:
        names = _qualified(sf)
        if len(set(names)) != len(names) or any(q in devices or q in contested for q in names):
            return None
        devices.update((q, Entry(q, sf.path, sf.priority)) for q in names)
        if not sf.loaded:
            errors[sf.path] = list(sf.errors)
        i = bisect.bisect_left(places, _place(sf))
        files.insert(i, sf)
        places.insert(i, _place(sf))
    conflicts, shadowed = dict(reg.conflicts), dict(reg.shadowed)
    patched = Registry(reg.dirs, files, devices, conflicts, shadowed, errors, reg.dir_errors)
    return patched, places


def unique_dirs(dirs: Iterable[Path]) -> tuple[Path, ...]:
    """``dirs`` with each folder once, at its last (highest-priority) place.

    A folder given twice must not conflict with itself (same priority, every device dropped);
    the runtimes' library gives its files the later priority, so that place is kept.
    """
    normal = [Path(os.path.normpath(d)) for d in dirs]
    return tuple(d for i, d in enumerate(normal) if d not in normal[i + 1 :])


def load_registry(
    dirs: Sequence[Path] = RUNTIME_SPEC_DIRS, *, keep_specs: bool = False
) -> Registry:
    """Scan ``dirs`` now and return what a runtime would see (with every parsed spec when
    ``keep_specs``)."""
    dirs = unique_dirs(dirs)
    files: list[SpecFile] = []
    dir_errors: dict[Path, str] = {}
    for priority, directory in enumerate(dirs):
        entries, err = _scan_dir(directory)
        if err:
            dir_errors[directory] = err
        files.extend(load_file(Path(e.path), priority, keep_spec=keep_specs) for e in entries)
    return build_registry(dirs, files, dir_errors)


_Listing = tuple[tuple[Path, FileId], ...]


def _unresolved(reg: Registry, qualified_names: Iterable[str]) -> list[str]:
    devices = reg.devices
    # Names that resolve (all of them, nearly always) cost a set lookup, not a call.
    return [m for n in qualified_names if n not in devices and (m := reg.explain(n)) is not None]


def _relevant(name: str) -> bool:
    return format_of(name) is not None


def _changed_since(listing: dict[Path, FileId], paths: Iterable[str]) -> bool:
    """Whether any of ``paths`` (followed) no longer has the stat recorded in ``listing``."""
    for raw in paths:
        path = Path(raw)
        try:
            st = os.stat(path)
        except OSError:
            if path in listing:
                return True
            continue
        if listing.get(path) != FileId.of(st):
            return True
    return False


class SpecCache:
    """Registry of ``spec_dirs``, rescanned only when inotify says someone else changed
    something.

    Between changes a check costs one look at the inotify queue and one stat of each
    folder's path (see :class:`~cdi_gen.cdi.folderwatch.FolderWatch`: the folder a path
    leads to may change without an event), whatever the folders hold; after the agent's own
    writes and removals (:meth:`wrote`, :meth:`removed`), one ``lstat`` of each file it
    changed as well; a rescan stats every entry and re-reads only files whose stat changed.
    Without inotify every check rescans, slower but as exact. Thread-safe.
    """

    def __init__(self, spec_dirs: Sequence[Path]) -> None:
        self.spec_dirs = unique_dirs(spec_dirs)
        self._priorities = {d: i for i, d in enumerate(self.spec_dirs)}
        # Checks come from the device plugins' server threads and the scan worker.
        self._lock = threading.Lock()
        self._files: dict[Path, tuple[FileId, SpecFile]] = {}
        self._listing: _Listing | None = None
        self._registry = Registry(dirs=self.spec_dirs)
        #: Where each of the registry's files stands in scan order.
        self._places: list[_Place] = []
        self._watch: FolderWatch | None = None
        #: A scan must run before the registry is trusted again.
        self._stale = True
        #: The agent's own changes no check has taken up yet: path -> (the identity of the
        #: file its write left, its bytes), (None, b"") once removed. A lock of its own: a
        #: writer never waits for a scan.
        self._own: dict[Path, tuple[FileId | None, bytes]] = {}
        self._own_lock = threading.Lock()
        #: Scans so far (tests read it: nothing changed must mean no scan).
        self.scans = 0
        #: Checks that took up the agent's own changes instead of a scan (tests read it).
        self.own_taken = 0

    def close(self) -> None:
        """Release the inotify descriptor (also released when the cache is collected)."""
        with self._lock:
            if self._watch is not None:
                self._watch.close()
            self._stale = True
        with self._own_lock:
            self._own.clear()

    def wrote(self, path: Path, data: bytes, file_id: FileId) -> None:
        """The agent made the spec file ``path`` hold ``data``, in the file ``file_id`` (see
        :class:`~cdi_gen.cdi.writer.OwnWrites`). Never waits for a scan."""
        self._note(path, (file_id, data))

    def removed(self, path: Path) -> None:
        """The agent removed the spec file ``path``. Never waits for a scan."""
        self._note(path, (None, b""))

    def _note(self, path: Path, change: tuple[FileId | None, bytes]) -> None:
        path = Path(os.path.normpath(path))
        if path.parent in self._priorities and _relevant(path.name):
            with self._own_lock:
                self._own[path] = change

    def registry(self) -> Registry:
        """The current registry, rescanning first if anything in the folders changed.

        Thread-safe; every file read is bounded (see :mod:`cdi_gen.files`).
        """
        with self._lock:
            return self._current() or self._rescan()

    def fresh_registry(self) -> Registry | None:
        """The registry if no folder changed since it was built but by the agent's own
        writes, else None.

        Never reads a folder or a file and never waits out a scan in progress (at most
        :data:`FAST_WAIT_SECONDS` for the lock): one look at the inotify queue, one stat
        of each folder's path and one ``lstat`` of each spec file the agent changed since
        (whose bytes it was given), so it may run on any thread on every Allocate; whatever
        needs more goes through :meth:`registry` on a worker thread.
        """
        # A short wait, not none: the stat of a folder's path releases the GIL with the lock
        # held, so under concurrent Allocates another check often finds the lock taken for
        # those microseconds. Giving up at once sent about one call in five through the scan
        # worker (a thread hand-off each) at eight concurrent clients.
        if not self._lock.acquire(timeout=FAST_WAIT_SECONDS):
            return None
        try:
            return self._current()
        finally:
            self._lock.release()

    def unresolved(self, qualified_names: Iterable[str]) -> list[str]:
        """One message per name that a runtime could not resolve now; empty if all resolve."""
        return _unresolved(self.registry(), qualified_names)

    def unresolved_if_fresh(self, qualified_names: Iterable[str]) -> list[str] | None:
        """Like :meth:`unresolved` from :meth:`fresh_registry`; None when that has no answer."""
        reg = self.fresh_registry()
        return None if reg is None else _unresolved(reg, qualified_names)

    def _current(self) -> Registry | None:
        """The registry if nothing changed since it was built but the agent's own files
        (taken up now), else None (no folder read)."""
        watch = self._watch
        if watch is None:
            watch = self._watch = FolderWatch(self.spec_dirs, _relevant)
        changes = watch.changes()
        with self._own_lock:
            own, self._own = self._own, {}
        # Own changes that came with no event were seen by the scan the event caused.
        if changes is None or (changes and (self._stale or not self._take_up(changes, own))):
            self._stale = True
        return None if self._stale else self._registry

    def _take_up(
        self, changes: Iterable[str], own: dict[Path, tuple[FileId | None, bytes]]
    ) -> bool:
        """Whether every changed path is a change of the agent's own, its file still the one
        the write left (or still gone); then the registry is rebuilt from what the agent
        wrote, without reading the folder."""
        taken: list[tuple[Path, FileId | None, bytes]] = []
        for changed in changes:
            path = Path(changed)
            change = own.get(path)
            if change is None:
                return False  # someone else's
            try:
                now: FileId | None = FileId.of(os.lstat(path))
            except FileNotFoundError:
                now = None
            except OSError:
                return False
            # Touched, replaced, written or made again since: the folder's file is not ours.
            if now != change[0]:
                return False
            taken.append((path, *change))
        drop: list[SpecFile] = []
        add: list[SpecFile] = []
        for path, identity, data in taken:
            old = self._files.pop(path, None)
            if old is not None:
                drop.append(old[1])
            if identity is not None:
                fmt = format_of(path.name)
                assert fmt is not None  # _note keeps only spec file names
                sf = parse_file(path, self._priorities[path.parent], data, fmt)
                self._files[path] = (identity, sf)
                add.append(sf)
        # The next scan compares each file's identity: the listing is no longer one.
        self._listing = None
        patched = patch_registry(self._registry, self._places, drop, add)
        if patched is None:
            files = sorted((sf for _, sf in self._files.values()), key=_place)
            # Never stale here, so the last scan read every folder.
            patched = build_registry(self.spec_dirs, files, {}), [_place(f) for f in files]
        self._registry, self._places = patched
        self.own_taken += 1
        return True

    def _rescan(self) -> Registry:
        # Called with the lock held, after _current() drained the event queue: a change
        # made during the scan stays queued and makes the next check scan again.
        self.scans += 1
        listing: list[tuple[Path, FileId]] = []
        links: list[str] = []
        dir_errors: dict[Path, str] = {}
        for directory in self.spec_dirs:
            entries, err = _scan_dir(directory)
            if err:
                dir_errors[directory] = err
            for e in entries:
                if e.is_symlink():
                    links.append(e.path)  # dangling too: its target may appear
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                listing.append((Path(e.path), FileId.of(st)))
        watch = self._watch
        # A folder that could not be read is read again next time, whatever inotify says.
        self._stale = watch is None or not watch.available or bool(dir_errors)
        if watch is not None and watch.follow_links(links) and not self._stale:
            # New watches report only what happens from now on: a target rewritten between
            # this scan's stat and the watch would be missed, unless its stat still matches.
            self._stale = _changed_since(dict(listing), links)
        return self._refresh(tuple(listing), dir_errors)

    def _refresh(self, key: _Listing, dir_errors: dict[Path, str]) -> Registry:
        if key == self._listing and not dir_errors:
            return self._registry
        priorities = self._priorities
        files: list[SpecFile] = []
        fresh: dict[Path, tuple[FileId, SpecFile]] = {}
        for path, st_key in key:
            cached = self._files.get(path)
            if cached is not None and cached[0] == st_key:
                sf = cached[1]
            else:
                sf = load_file(path, priorities[path.parent])
            fresh[path] = (st_key, sf)
            files.append(sf)
        self._files = fresh
        self._listing = key
        self._registry = build_registry(self.spec_dirs, files, dir_errors)
        self._places = [_place(f) for f in files]
        return self._registry
