"""The spec-folder cache learns the agent's own writes from the writer: no scan after them,
and a scan whenever someone else changed a file, even one the agent had just written.

Real folders, real inotify, the real writer and store. After each step the cache must answer
what a fresh scan (``load_registry``) answers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdi_gen.cdi import resolution
from cdi_gen.cdi.registry import SpecCache, load_registry
from cdi_gen.cdi.store import SpecStore
from cdi_gen.cdi.writer import remove_spec, write_bytes
from tests.conftest import examples

VENDOR, CLS = "example.com", "loop"
KIND = f"{VENDOR}/{CLS}"


def spec(*names: str, kind: str = KIND) -> bytes:
    return json.dumps(
        {
            "cdiVersion": "0.3.0",
            "kind": kind,
            "devices": [
                {"name": n, "containerEdits": {"deviceNodes": [{"path": f"/dev/{n}"}]}}
                for n in names
            ],
        }
    ).encode()


@pytest.fixture
def dirs(short_dir: Path) -> list[Path]:
    """A lower and a higher priority folder; the agent writes into the higher one, as it
    writes /var/run/cdi above /etc/cdi."""
    found = [short_dir / "etc", short_dir / "run"]
    for d in found:
        d.mkdir()
    return found


@pytest.fixture
def cache(dirs: list[Path]) -> Iterator[SpecCache]:
    c = SpecCache(dirs)
    yield c
    c.close()


@pytest.fixture
def store(cache: SpecCache, dirs: list[Path]) -> SpecStore:
    """The agent's store with the class's spec written, and the cache up to date."""
    s = SpecStore(cache)
    s.sync(dirs[1], VENDOR, CLS, spec("loop0", "loop1"), instance=None)
    cache.registry()
    return s


def claim_spec(spec_dir: Path, store: SpecStore, uid: str, *names: str) -> None:
    """A DRA claim's transient spec, as ClaimFiles writes it."""
    write_bytes(spec_dir, VENDOR, CLS, spec(*names), transient=uid, notes=store.own_writes)


def same_as_a_scan(cache: SpecCache) -> None:
    fresh, cached = load_registry(cache.spec_dirs), cache.registry()
    assert cached.devices == fresh.devices
    assert cached.conflicts == fresh.conflicts
    assert cached.shadowed == fresh.shadowed
    assert cached.errors == fresh.errors
    assert [(f.path, f.kind, f.names) for f in cached.files] == [
        (f.path, f.kind, f.names) for f in fresh.files
    ]


def test_the_agents_own_writes_are_checked_without_a_scan(
    cache: SpecCache, store: SpecStore, dirs: list[Path]
) -> None:
    scans = cache.scans
    # A claim's own spec, then its names checked: as every NodePrepareResources does.
    claim_spec(dirs[1], store, "uid-1", "claim-uid-1-0")
    names = [f"{KIND}=claim-uid-1-0", f"{KIND}=loop1"]
    # The fast path answers, so resolution.unresolved submits nothing to the scan worker.
    assert cache.unresolved_if_fresh(names) == []
    assert resolution.unresolved(cache, names) == []
    # A class's spec rewritten by its runner: the next Allocate or prepare scans nothing.
    store.sync(dirs[1], VENDOR, CLS, spec("loop1", "loop2"), instance=None)
    assert cache.unresolved_if_fresh([f"{KIND}=loop2"]) == []
    assert cache.unresolved_if_fresh([f"{KIND}=loop0"]) == [
        f"CDI device {KIND + '=loop0'!r} is not defined in any valid spec in {dirs[0]}, {dirs[1]}"
    ]
    # Many claims in a row, each checked at once.
    for n in range(20):
        claim_spec(dirs[1], store, f"uid-n{n}", f"claim-uid-n{n}-0")
        assert resolution.unresolved(cache, [f"{KIND}=claim-uid-n{n}-0"]) == []
    assert cache.own_taken == 22
    same_as_a_scan(cache)
    assert cache.scans == scans


def test_a_removal_by_the_agent_is_known_without_a_scan(
    cache: SpecCache, store: SpecStore, dirs: list[Path]
) -> None:
    claim_spec(dirs[1], store, "uid-1", "claim-uid-1-0")
    assert cache.unresolved_if_fresh([f"{KIND}=claim-uid-1-0"]) == []
    scans = cache.scans
    assert remove_spec(dirs[1], VENDOR, CLS, transient="uid-1", notes=store.own_writes)
    [why] = cache.unresolved_if_fresh([f"{KIND}=claim-uid-1-0"]) or ["scan needed"]
    assert "is not defined in any valid spec" in why
    # A class's spec removed by its runner (the class left the config).
    store.sync(dirs[1], VENDOR, CLS, None, instance=None)
    assert cache.unresolved_if_fresh([f"{KIND}=loop1"]) == [
        f"CDI device {KIND + '=loop1'!r} is not defined in any valid spec in {dirs[0]}, {dirs[1]}"
    ]
    assert cache.scans == scans
    same_as_a_scan(cache)


def _touch(path: Path) -> None:
    os.utime(path)


def _edit_in_place(path: Path) -> None:
    # Same length, at once: within one tick of the file system's clock the identity may
    # not move, the event does.
    data = path.read_bytes()
    path.write_bytes(data.replace(b"claim-uid-1-0", b"claim-uid-1-X"))


def _replace(path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(spec("foreign"))
    os.rename(tmp, path)


def _remove_and_make_again(path: Path) -> None:
    path.unlink()
    path.write_bytes(spec("foreign"))


def _chmod(path: Path) -> None:
    os.chmod(path, 0o600)


def _another_file(path: Path) -> None:
    (path.parent / "other.json").write_bytes(spec("other", kind="example.com/other"))


@pytest.mark.parametrize(
    "change",
    [_touch, _edit_in_place, _replace, _remove_and_make_again, _chmod, _another_file],
)
def test_a_change_by_someone_else_after_our_write_is_scanned_and_seen(
    cache: SpecCache, store: SpecStore, dirs: list[Path], change: Callable[[Path], None]
) -> None:
    claim_spec(dirs[1], store, "uid-1", "claim-uid-1-0")
    path = next(dirs[1].glob("*@uid-1.json"))
    change(path)  # before any check took up our write: it must not hide this change
    scans = cache.scans
    assert cache.unresolved_if_fresh([f"{KIND}=claim-uid-1-0"]) is None
    same_as_a_scan(cache)
    assert cache.scans == scans + 1
    # And after our write was taken up: the same change is someone else's too.
    claim_spec(dirs[1], store, "uid-2", "claim-uid-2-0")
    assert cache.unresolved_if_fresh([f"{KIND}=claim-uid-2-0"]) == []
    change(next(dirs[1].glob("*@uid-2.json")))
    assert cache.unresolved_if_fresh([f"{KIND}=claim-uid-2-0"]) is None
    same_as_a_scan(cache)


def test_a_removal_by_someone_else_before_ours_is_seen(
    cache: SpecCache, store: SpecStore, dirs: list[Path]
) -> None:
    claim_spec(dirs[1], store, "uid-1", "claim-uid-1-0")
    path = next(dirs[1].glob("*@uid-1.json"))
    path.unlink()
    assert cache.unresolved_if_fresh([f"{KIND}=claim-uid-1-0"]) is None
    [why] = cache.unresolved([f"{KIND}=claim-uid-1-0"])
    assert "is not defined in any valid spec" in why


def test_a_foreign_spec_written_after_ours_still_shadows_or_conflicts(
    cache: SpecCache, store: SpecStore, dirs: list[Path]
) -> None:
    # Ours in the lower folder, then a foreign spec above it defining the same device.
    claim_spec(dirs[0], store, "uid-1", "claim-uid-1-0")
    assert cache.unresolved_if_fresh([f"{KIND}=claim-uid-1-0"]) == []
    (dirs[1] / "vendor-loop.json").write_bytes(spec("claim-uid-1-0"))
    reg = cache.registry()
    assert reg.devices[f"{KIND}=claim-uid-1-0"].path == dirs[1] / "vendor-loop.json"
    assert reg.shadowed[f"{KIND}=claim-uid-1-0"] == [next(dirs[0].glob("*@uid-1.json"))]
    # Ours written beside a foreign spec of the same device: a conflict, dropped, as the
    # runtime drops it, although the agent knows what it wrote.
    scans = cache.scans
    claim_spec(dirs[1], store, "uid-1", "claim-uid-1-0")
    [why] = cache.unresolved_if_fresh([f"{KIND}=claim-uid-1-0"]) or ["scan needed"]
    assert "is defined in more than one spec file" in why
    assert cache.scans == scans
    same_as_a_scan(cache)
    # Our write into the lower folder stays shadowed by a foreign spec above it.
    (dirs[1] / "vendor-loop.json").unlink()
    claim_spec(dirs[0], store, "uid-3", "claim-uid-3-0")
    (dirs[1] / "vendor-loop3.json").write_bytes(spec("claim-uid-3-0"))
    reg = cache.registry()
    assert reg.devices[f"{KIND}=claim-uid-3-0"].path == dirs[1] / "vendor-loop3.json"
    same_as_a_scan(cache)


def test_a_write_the_cache_cannot_place_is_left_to_a_scan(
    cache: SpecCache, store: SpecStore, short_dir: Path
) -> None:
    """A folder the cache does not read: its notes are dropped, nothing breaks."""
    elsewhere = short_dir / "elsewhere"
    claim_spec(elsewhere, store, "uid-1", "claim-uid-1-0")
    assert cache.unresolved_if_fresh([f"{KIND}=loop1"]) == []
    same_as_a_scan(cache)


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["ours", "ours", "remove ours", "ours broken", "theirs", "remove theirs"]),
        st.integers(0, 1),  # folder
        st.sampled_from(["u1", "u2", "u3"]),  # the file: a claim's, or a foreign one's
        st.lists(st.sampled_from(["d1", "d2", "d3"]), min_size=1, max_size=2, unique=True),
    ),
    max_size=14,
)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=_OPS)
def test_the_cache_agrees_with_a_fresh_scan_whatever_we_and_others_write(
    short_dir: Path, ops: list[tuple[str, int, str, list[str]]]
) -> None:
    """Our writes and removals (taken up without a scan) mixed with foreign ones, in both
    folders, with devices that collide: priority, shadowing and conflicts stay a scan's."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(dir=short_dir))
    try:
        dirs = [root / "etc", root / "run"]
        cache = SpecCache(dirs)
        store = SpecStore(cache)
        for op, index, tag, devices in ops:
            folder = dirs[index]
            if op == "ours":
                claim_spec(folder, store, tag, *devices)
            elif op == "ours broken":
                write_bytes(folder, VENDOR, CLS, b'{"kind": 1}', transient=tag, notes=cache)
            elif op == "remove ours":
                remove_spec(folder, VENDOR, CLS, transient=tag, notes=cache)
            elif op == "theirs":
                folder.mkdir(exist_ok=True)
                (folder / f"vendor-{tag}.json").write_bytes(spec(*devices))
            elif op == "remove theirs":
                (folder / f"vendor-{tag}.json").unlink(missing_ok=True)
            same_as_a_scan(cache)
        cache.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
