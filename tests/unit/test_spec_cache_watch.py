"""The spec-folder cache kept by inotify: exact after every change, and no scan without one.

Real folders, real inotify. After each change the cache must answer what a fresh scan
(``load_registry``) answers, at once: the kernel queues the event before the change returns.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdi_gen.cdi import folderwatch
from cdi_gen.cdi.folderwatch import IN_Q_OVERFLOW, FolderWatch, path_entries
from cdi_gen.cdi.registry import SpecCache, load_registry
from tests.conftest import examples

KIND = "example.com/loop"


def spec(*names: str, kind: str = KIND) -> str:
    return json.dumps(
        {
            "cdiVersion": "0.3.0",
            "kind": kind,
            "devices": [
                {"name": n, "containerEdits": {"deviceNodes": [{"path": f"/dev/{n}"}]}}
                for n in names
            ],
        }
    )


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def replace(path: Path, text: str) -> None:
    """Write as the agent and most producers do: a temporary file renamed over the name."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.rename(tmp, path)


def names(cache: SpecCache) -> set[str]:
    return set(cache.registry().devices)


@pytest.fixture
def dirs(short_dir: Path) -> list[Path]:
    return [short_dir / "etc", short_dir / "run"]


@pytest.fixture
def cache(dirs: list[Path]) -> Iterator[SpecCache]:
    for d in dirs:
        d.mkdir()
    c = SpecCache(dirs)
    yield c
    c.close()


def settle(cache: SpecCache) -> int:
    """Check until a check scans nothing; return the scan count then."""
    for _ in range(3):
        before = cache.scans
        cache.registry()
        if cache.scans == before:
            return before
    raise AssertionError("the cache scans on every check")


def test_nothing_changed_means_no_scan(cache: SpecCache, dirs: list[Path]) -> None:
    write(dirs[0] / "a.json", spec("loop1"))
    assert names(cache) == {f"{KIND}=loop1"}
    scans = settle(cache)
    for _ in range(100):
        assert cache.unresolved_if_fresh([f"{KIND}=loop1"]) == []
        assert cache.unresolved([f"{KIND}=loop1"]) == []
    assert cache.scans == scans


def test_every_kind_of_change_is_seen_by_the_next_check(cache: SpecCache, dirs: list[Path]) -> None:
    path = dirs[0] / "a.json"
    write(path, spec("loop1"))
    assert names(cache) == {f"{KIND}=loop1"}
    replace(path, spec("loop2"))
    assert names(cache) == {f"{KIND}=loop2"}
    # In place, same size: only the inotify event (and ctime) tells.
    with path.open("r+") as f:
        f.write(spec("loop3"))
    assert names(cache) == {f"{KIND}=loop3"}
    write(dirs[1] / "b.yaml", spec("loop4"))
    assert names(cache) == {f"{KIND}=loop3", f"{KIND}=loop4"}
    os.chmod(path, 0)
    if os.geteuid() != 0:  # root reads it anyway
        assert f"{KIND}=loop3" not in names(cache)
    os.chmod(path, 0o644)
    path.unlink()
    assert names(cache) == {f"{KIND}=loop4"}
    os.rename(dirs[1] / "b.yaml", dirs[1] / "b.json.off")
    assert names(cache) == set()


def test_files_runtimes_ignore_cause_no_scan(cache: SpecCache, dirs: list[Path]) -> None:
    write(dirs[0] / "a.json", spec("loop1"))
    scans = settle(cache)
    write(dirs[0] / ".a.json.tmp", "partial")
    write(dirs[0] / "notes.txt", "x")
    assert names(cache) == {f"{KIND}=loop1"}
    assert cache.scans == scans


def test_a_missing_folder_is_seen_when_it_appears(short_dir: Path) -> None:
    folder = short_dir / "late"
    cache = SpecCache([folder])
    assert names(cache) == set()
    write(folder / "a.json", spec("loop1"))
    assert names(cache) == {f"{KIND}=loop1"}
    settle(cache)


def test_a_folder_removed_and_made_again_is_followed(cache: SpecCache, dirs: list[Path]) -> None:
    write(dirs[1] / "a.json", spec("loop1"))
    assert names(cache) == {f"{KIND}=loop1"}
    (dirs[1] / "a.json").unlink()
    dirs[1].rmdir()
    assert names(cache) == set()
    write(dirs[1] / "a.json", spec("loop2"))
    assert names(cache) == {f"{KIND}=loop2"}
    scans = settle(cache)
    write(dirs[1] / "b.json", spec("loop3"))
    assert names(cache) == {f"{KIND}=loop2", f"{KIND}=loop3"}
    assert cache.scans == scans + 1


def test_a_linked_spec_file_is_followed_to_its_target(
    cache: SpecCache, dirs: list[Path], short_dir: Path
) -> None:
    target = short_dir / "elsewhere" / "real.json"
    write(target, spec("loop1"))
    (dirs[0] / "a.json").symlink_to(target)
    assert names(cache) == {f"{KIND}=loop1"}
    scans = settle(cache)
    with target.open("r+") as f:  # rewritten in place, same size
        f.write(spec("loop2"))
    assert names(cache) == {f"{KIND}=loop2"}
    replace(target, spec("loop3"))
    assert names(cache) == {f"{KIND}=loop3"}
    target.unlink()
    assert names(cache) == set()
    write(target, spec("loop4"))
    assert names(cache) == {f"{KIND}=loop4"}
    assert cache.scans > scans
    # Unrelated files next to the target cost nothing.
    scans = settle(cache)
    write(target.with_name("other.json"), spec("loop9"))
    assert names(cache) == {f"{KIND}=loop4"}
    assert cache.scans == scans


def test_a_dangling_link_is_seen_when_its_target_appears(
    cache: SpecCache, dirs: list[Path], short_dir: Path
) -> None:
    target = short_dir / "later" / "real.json"
    target.parent.mkdir()
    (dirs[0] / "a.json").symlink_to(target)
    assert names(cache) == set()
    settle(cache)
    write(target, spec("loop1"))
    assert names(cache) == {f"{KIND}=loop1"}


def test_a_swapped_linked_folder_is_followed(
    cache: SpecCache, dirs: list[Path], short_dir: Path
) -> None:
    # The layout Kubernetes gives a mounted ConfigMap: file -> ..data/file, ..data -> ..v1.
    store = short_dir / "store"
    write(store / "..v1" / "a.json", spec("loop1"))
    write(store / "..v2" / "a.json", spec("loop2"))
    (store / "..data").symlink_to("..v1")
    (dirs[0] / "a.json").symlink_to(store / "..data" / "a.json")
    assert names(cache) == {f"{KIND}=loop1"}
    settle(cache)
    tmp = store / "..data_tmp"
    tmp.symlink_to("..v2")
    os.rename(tmp, store / "..data")
    assert names(cache) == {f"{KIND}=loop2"}


def test_path_entries_names_every_component_link_and_the_file(short_dir: Path) -> None:
    write(short_dir / "d" / "f.json", "{}")
    (short_dir / "dl").symlink_to("d")
    (short_dir / "l1").symlink_to(short_dir / "dl" / "f.json")
    root = str(short_dir)
    # Every folder on the way, not only links: renaming one changes what the path reads.
    assert path_entries(str(short_dir / "l1")) == {
        ("/", "tmp"),
        ("/tmp", short_dir.name),
        (root, "l1"),
        (root, "dl"),
        (root, "d"),
        (str(short_dir / "d"), "f.json"),
    }
    # A missing component is named (its creation matters); nothing below it is.
    assert path_entries(str(short_dir / "gone" / "x" / "f.json")) == {
        ("/", "tmp"),
        ("/tmp", short_dir.name),
        (root, "gone"),
    }
    (short_dir / "loop").symlink_to("loop")
    assert (root, "loop") in path_entries(str(short_dir / "loop"))


def test_a_lost_event_queue_means_a_scan(short_dir: Path) -> None:
    watch = FolderWatch([short_dir], lambda name: True)
    assert watch.changed()  # the folder is new to it
    assert not watch.changed()
    overflow = struct.pack("iIII", -1, IN_Q_OVERFLOW, 0, 0)
    assert watch._apply(overflow) is None  # names no file: only a scan is exact
    watch.close()
    assert watch.changed(), "a closed watch knows nothing: every check scans"


def test_the_inotify_descriptor_is_released(short_dir: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    caches = [SpecCache([short_dir]) for _ in range(20)]
    for c in caches:
        c.registry()
    assert len(os.listdir("/proc/self/fd")) >= before + 20
    for c in caches[:10]:
        c.close()
    del caches
    import gc

    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before


_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["write", "replace", "remove", "rmdir", "link", "retarget", "drop-target", "dangle"]
        ),
        st.integers(0, 1),  # folder
        st.sampled_from(["a.json", "b.yaml", "c.json"]),
        st.sampled_from(["loop1", "loop2", "loop3"]),
    ),
    max_size=12,
)


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=_OPS)
def test_the_cache_always_agrees_with_a_fresh_scan(
    short_dir: Path, ops: list[tuple[str, int, str, str]]
) -> None:
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(dir=short_dir))
    try:
        dirs = [root / "etc", root / "run"]
        targets = root / "targets"
        targets.mkdir()
        cache = SpecCache(dirs)
        for op, index, name, device in ops:
            folder = dirs[index]
            path = folder / name
            if op == "write":
                write(path, spec(device))
            elif op == "replace" and folder.is_dir():
                replace(path, spec(device))
            elif op == "remove" and (path.exists() or path.is_symlink()):
                path.unlink()
            elif op == "rmdir" and folder.is_dir():
                shutil.rmtree(folder)
            elif op == "link" and not (path.exists() or path.is_symlink()):
                folder.mkdir(exist_ok=True)
                write(targets / f"{device}.json", spec(device))
                path.symlink_to(targets / f"{device}.json")
            elif op == "retarget":
                replace(targets / f"{device}.json", spec(device, "loop9"))
            elif op == "drop-target" and (targets / f"{device}.json").exists():
                (targets / f"{device}.json").unlink()
            elif op == "dangle" and not (path.exists() or path.is_symlink()):
                folder.mkdir(exist_ok=True)
                path.symlink_to(targets / f"{device}.json")  # its target may come later
            expected = load_registry(dirs)
            got = cache.registry()
            assert got.devices.keys() == expected.devices.keys(), (op, index, name, device)
            assert got.conflicts.keys() == expected.conflicts.keys()
        cache.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_fast_path_never_waits_out_a_scan(
    cache: SpecCache, dirs: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    write(dirs[0] / "a.json", spec("loop1"))
    settle(cache)
    entered, release = threading.Event(), threading.Event()
    real = cache._rescan

    def hung() -> object:
        entered.set()
        release.wait(10)
        return real()

    monkeypatch.setattr(cache, "_rescan", hung)
    write(dirs[0] / "b.json", spec("loop2"))  # the next check must scan, and hangs
    scan = threading.Thread(target=cache.registry)
    scan.start()
    try:
        assert entered.wait(5)
        # A scan in progress: no answer from the fast path, which waits for the lock only
        # as long as a check between changes holds it (FAST_WAIT_SECONDS), not for the scan.
        assert cache.fresh_registry() is None
        assert cache.unresolved_if_fresh([f"{KIND}=loop1"]) is None
    finally:
        release.set()
        scan.join()
    assert cache.unresolved_if_fresh([f"{KIND}=loop2"]) == []


def test_the_fast_path_waits_for_a_check_holding_the_lock(
    cache: SpecCache, dirs: list[Path]
) -> None:
    """Another check holding the lock (it does across a stat, which lets other threads run)
    delays an Allocate's check; it does not send it to the scan worker."""
    import threading

    write(dirs[0] / "a.json", spec("loop1"))
    settle(cache)
    real = cache._lock
    asked = threading.Event()

    class Spy:
        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            asked.set()
            return real.acquire(blocking, timeout)

        def release(self) -> None:
            real.release()

    answers: list[object] = []
    cache._lock = Spy()  # type: ignore[assignment]
    try:
        with real:
            check = threading.Thread(target=lambda: answers.append(cache.fresh_registry()))
            check.start()
            assert asked.wait(5)
        check.join()
    finally:
        # The fixture's close takes the lock with `with`, which the spy does not offer.
        cache._lock = real
    assert answers and answers[0] is not None


# The spec folder's own path (issue 26, item 18): a runtime opens the folder by its path on
# every container start, so when any component of that path (a link swapped atomically, a
# parent renamed and made again, a component removed) leads somewhere else, the cache must
# answer from the folder the path leads to now, at the next check.

LEVELS = ("a", "b", "cdi")  # the spec folder is <root>/a/b/cdi


def swap_link(entry: Path, target: Path | str) -> None:
    """``ln -s target tmp && mv -T tmp entry``: the entry changes in one rename."""
    tmp = entry.with_name(f".{entry.name}.swap")
    tmp.symlink_to(target)
    os.rename(tmp, entry)


def tree(top: Path, rest: tuple[str, ...], *devices: str) -> Path:
    """``top/rest.../a.json`` defining ``devices``; returns ``top``."""
    write(top.joinpath(*rest, "a.json"), spec(*devices))
    return top


@pytest.mark.parametrize("proc", [True, False], ids=["proc", "no-proc"])
@pytest.mark.parametrize("level", range(len(LEVELS)))
def test_a_spec_folder_reached_through_a_swapped_link_is_followed(
    short_dir: Path, level: int, proc: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not proc:  # watches set by path, checked by a stat before and after
        monkeypatch.setattr(folderwatch, "_PROC_FDS", str(short_dir / "no-proc"))
    folder = short_dir.joinpath(*LEVELS)
    entry = short_dir.joinpath(*LEVELS[: level + 1])
    rest = LEVELS[level + 1 :]
    store = short_dir / "store"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.symlink_to(tree(store / "v1", rest, "loop1"))
    tree(store / "v2", rest, "loop2")
    cache = SpecCache([folder])
    try:
        assert names(cache) == {f"{KIND}=loop1"}
        settle(cache)
        swap_link(entry, store / "v2")
        assert names(cache) == {f"{KIND}=loop2"}
        scans = settle(cache)
        # The old folder is no longer watched: what happens there costs nothing.
        write(store.joinpath("v1", *rest, "b.json"), spec("loop9"))
        assert names(cache) == {f"{KIND}=loop2"}
        assert cache.scans == scans
        # ... and the new one is: a spec added there is seen.
        write(store.joinpath("v2", *rest, "b.json"), spec("loop3"))
        assert names(cache) == {f"{KIND}=loop2", f"{KIND}=loop3"}
        swap_link(entry, store / "none")  # leads to nothing
        assert names(cache) == set()
        tree(store / "none", rest, "loop4")  # and then to a folder that appears
        assert names(cache) == {f"{KIND}=loop4"}
        swap_link(entry, "v1")  # relative: v1 is not beside the entry, so nothing again
        assert names(cache) == set()
    finally:
        cache.close()


@pytest.mark.parametrize("level", range(len(LEVELS)))
def test_a_parent_renamed_and_made_again_is_followed(short_dir: Path, level: int) -> None:
    folder = short_dir.joinpath(*LEVELS)
    entry = short_dir.joinpath(*LEVELS[: level + 1])
    write(folder / "a.json", spec("loop1"))
    cache = SpecCache([folder])
    try:
        assert names(cache) == {f"{KIND}=loop1"}
        settle(cache)
        # Renamed and made again between two checks: the watched folder itself never moved.
        os.rename(entry, short_dir / "old1")
        write(folder / "a.json", spec("loop2"))
        assert names(cache) == {f"{KIND}=loop2"}
        settle(cache)
        os.rename(entry, short_dir / "old2")  # renamed away: the path leads to nothing
        assert names(cache) == set()
        os.rename(short_dir / "old1", entry)  # the first one back
        assert names(cache) == {f"{KIND}=loop1"}
    finally:
        cache.close()


def test_two_folder_paths_leading_to_one_folder_part_ways(short_dir: Path) -> None:
    # One watch serves both paths; moving one of them must not drop the other's.
    write(short_dir / "v1" / "a.json", spec("loop1"))
    write(short_dir / "v2" / "b.json", spec("loop2"))
    first, second = short_dir / "etc", short_dir / "run"
    first.symlink_to("v1")
    second.symlink_to("v1")
    cache = SpecCache([first, second])
    try:
        assert names(cache) == {f"{KIND}=loop1"}  # the same file twice: shadowed, no conflict
        settle(cache)
        swap_link(first, short_dir / "v2")
        assert names(cache) == {f"{KIND}=loop1", f"{KIND}=loop2"}
        settle(cache)
        write(short_dir / "v1" / "c.json", spec("loop3"))  # still reached through the second
        assert names(cache) == {f"{KIND}=loop1", f"{KIND}=loop2", f"{KIND}=loop3"}
        swap_link(second, short_dir / "v2")  # both on v2: the same file twice again
        assert names(cache) == {f"{KIND}=loop2"}
        scans = settle(cache)
        write(short_dir / "v1" / "d.json", spec("loop4"))  # on no path any more: no scan
        assert names(cache) == {f"{KIND}=loop2"}
        assert cache.scans == scans
    finally:
        cache.close()


def test_a_linked_spec_files_target_folder_renamed_and_made_again_is_followed(
    cache: SpecCache, dirs: list[Path], short_dir: Path
) -> None:
    target = short_dir / "store" / "sub" / "real.json"
    write(target, spec("loop1"))
    (dirs[0] / "a.json").symlink_to(target)
    assert names(cache) == {f"{KIND}=loop1"}
    settle(cache)
    os.rename(short_dir / "store", short_dir / "old")
    write(target, spec("loop2"))
    assert names(cache) == {f"{KIND}=loop2"}
    os.rename(short_dir / "store", short_dir / "old2")
    assert names(cache) == set()


_PATH_OPS = st.lists(
    st.tuples(
        st.sampled_from(["link", "chain", "swap-inner", "dir", "remove", "write-old", "write"]),
        st.integers(0, len(LEVELS) - 1),
        st.sampled_from(["loop1", "loop2", "loop3"]),
    ),
    max_size=10,
)


class PathChanges:
    """Changes to the components of ``root/a/b/cdi``, each made as an operator would."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder = root.joinpath(*LEVELS)
        self.fresh = iter(range(1000))
        self.old: list[Path] = []  # folders (or links) moved off the path
        self.inner: list[tuple[Path, tuple[str, ...]]] = []  # links inside a chain

    def apply(self, op: str, level: int, device: str) -> None:
        entry = self.root.joinpath(*LEVELS[: level + 1])
        rest = LEVELS[level + 1 :]
        n = next(self.fresh)
        if not entry.parent.is_dir():
            return
        if op == "swap-inner" and self.inner:
            # A link in the middle of a chain (entry -> m -> s): the entry is untouched.
            link, below = self.inner[-1]
            swap_link(link, tree(self.root / f"s{n}", below, device))
        elif op in ("link", "chain", "dir"):
            self.replace(entry, self.made(op, n, rest, device))
        elif op == "remove" and (entry.exists() or entry.is_symlink()):
            self.move_away(entry, n)
        elif op == "write-old" and self.old and self.old[-1].is_dir():
            write(self.old[-1] / "z.json", spec(device))  # a folder no longer on the path
        elif op == "write" and self.folder.is_dir():
            write(self.folder / "w.json", spec(device, "loop9"))

    def made(self, op: str, n: int, rest: tuple[str, ...], device: str) -> Path:
        made = tree(self.root / f"s{n}", rest, device)
        if op == "dir":
            return made
        target = made
        if op == "chain":
            target = self.root / f"m{n}"
            target.symlink_to(f"s{n}")
            self.inner.append((target, rest))
        link = self.root / f"l{n}"
        link.symlink_to(target)
        return link

    def replace(self, entry: Path, made: Path) -> None:
        # A link over a link (or nothing) is one atomic step; rename(2) puts nothing else
        # over a link or a folder, so that one is moved away first.
        present = entry.exists() or entry.is_symlink()
        link_over_link = made.is_symlink() and entry.is_symlink()
        if present and not link_over_link:
            self.move_away(entry, next(self.fresh))
        os.rename(made, entry)

    def move_away(self, entry: Path, n: int) -> None:
        self.old.append(self.root / f"o{n}")
        os.rename(entry, self.old[-1])


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=_PATH_OPS)
def test_the_cache_agrees_with_a_fresh_scan_whatever_happens_to_the_path(
    short_dir: Path, ops: list[tuple[str, int, str]]
) -> None:
    """Any component of the folder's path replaced (by a link, a chain of links or a folder),
    removed, or a link inside a chain swapped: after each change the cache answers what a
    fresh scan of the path answers."""
    import shutil
    import tempfile

    changes = PathChanges(Path(tempfile.mkdtemp(dir=short_dir)))
    try:
        write(changes.folder / "a.json", spec("loop1"))
        cache = SpecCache([changes.folder])
        cache.registry()
        for op, level, device in ops:
            changes.apply(op, level, device)
            expected = load_registry([changes.folder])
            got = cache.registry()
            assert got.devices.keys() == expected.devices.keys(), (op, level, device)
        cache.close()
    finally:
        shutil.rmtree(changes.root, ignore_errors=True)


def test_the_cache_keeps_what_a_file_defines_not_its_parsed_spec(dirs: list[Path]) -> None:
    """Between Allocates the agent holds each file's kind and device names: the parsed models
    of 1,000 devices are 1.8 MiB. The doctor, which reads each spec, asks to keep them."""
    write(dirs[1] / "loop.json", spec("loop0", "loop1"))
    cache = SpecCache(dirs)
    try:
        (file,) = cache.registry().files
    finally:
        cache.close()
    assert file.loaded and file.spec is None
    assert (file.kind, file.names) == (KIND, ("loop0", "loop1"))
    (kept,) = load_registry(dirs, keep_specs=True).files
    assert kept.spec is not None and [d.name for d in kept.spec.devices] == ["loop0", "loop1"]
