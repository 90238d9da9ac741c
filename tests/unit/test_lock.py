"""The lock (``requirements/*.txt``, made by ``make lock``) agrees with pyproject.toml and with
the generated modules: every requirement is locked inside its range, every set holds exactly the
closure of what pyproject.toml asks for it, the sets agree on each version, the committed
modules are what the locked grpcio-tools writes, and pyproject.toml's floors let them import.

A change to pyproject.toml's dependencies without ``make lock``, a hand edit of a lock file, or a
lock moved without generating the protos again fails here, naming what to run."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests import lockfile
from tests.conftest import REPO
from tests.plugins.environment import SET

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
PROTO = REPO / "src" / "cdi_gen" / "_proto"
HINT = "run make lock"


def _roots(name: str) -> list[Requirement]:
    """What pyproject.toml asks for in one lock file."""
    run = [Requirement(r) for r in PROJECT["dependencies"]]
    build = [Requirement(r) for r in PYPROJECT["dependency-groups"]["build"]]
    extras = PROJECT["optional-dependencies"]
    test = [Requirement(r) for r in extras["test"]]
    lint = [Requirement(r) for r in extras["lint"]]
    return {
        "run": run,
        "build": build,
        "test": run + test + build,
        "dev": run + test + lint + build,
    }[name]


def _closure(roots: list[Requirement]) -> set[str]:
    """The canonical names ``roots`` lead to through the installed distributions' metadata,
    each followed with the extras it is asked for (lightkube asks for httpx2[http2])."""
    seen: set[tuple[str, str]] = set()
    todo = [(r, "") for r in roots]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        for wanted in ("", *sorted(req.extras)):
            if (name, wanted) not in seen:
                seen.add((name, wanted))
                todo += [
                    (Requirement(t), wanted) for t in metadata.distribution(name).requires or ()
                ]
    return {name for name, _ in seen}


#: The lock files this environment can follow through installed metadata: its own set's and
#: those inside it (make test's dev environment holds every set; make test-fast's test set all
#: but dev).
FOLLOWED = [name for name in lockfile.FILES if SET == "dev" or name != "dev"]


@pytest.mark.parametrize("name", lockfile.FILES)
def test_every_requirement_is_locked_within_its_range(name: str) -> None:
    pins = lockfile.read(lockfile.LOCK / f"{name}.txt")
    wrong = []
    for req in _roots(name):
        pin = pins.get(canonicalize_name(req.name))
        if pin is None:
            wrong.append(f"{req} is not locked")
        elif not req.specifier.contains(pin.version, prereleases=True):
            wrong.append(f"{req} is locked at {pin.version}")
    assert wrong == [], f"requirements/{name}.txt disagrees with pyproject.toml ({HINT}): {wrong}"


@pytest.mark.parametrize("name", FOLLOWED)
def test_each_set_holds_exactly_the_closure_of_its_requirements(name: str) -> None:
    wanted = _closure(_roots(name))
    pinned = {n for n, pin in lockfile.read(lockfile.LOCK / f"{name}.txt").items() if pin.applies()}
    assert (sorted(wanted - pinned), sorted(pinned - wanted)) == ([], []), (
        f"requirements/{name}.txt: (required but not locked, locked but not required); {HINT}"
    )


def test_the_sets_agree_on_every_version_and_hash() -> None:
    seen: dict[str, tuple[str, lockfile.Pin]] = {}
    wrong = []
    for name in lockfile.FILES:
        for dist, pin in lockfile.read(lockfile.LOCK / f"{name}.txt").items():
            first = seen.setdefault(dist, (name, pin))
            if (first[1].version, first[1].hashes) != (pin.version, pin.hashes):
                wrong.append(f"{dist}: {first[0]}.txt {first[1].version}, {name}.txt {pin.version}")
    assert wrong == [], f"the lock files come from different resolutions ({HINT}): {wrong}"


def test_a_hand_edit_of_a_lock_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.txt"
    path.write_text("grpcio>=1.85 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(lockfile.LockError, match=r"run.txt:1: not a pin or a --hash line"):
        lockfile.read(path)
    path.write_text("grpcio==1.85.4\n")
    with pytest.raises(lockfile.LockError, match=r"grpcio==1.85.4 has no --hash"):
        lockfile.read(path)


def _generated(pattern: str, suffix: str) -> dict[str, str]:
    """A version each generated module states, by module."""
    found = {}
    for path in sorted(PROTO.rglob(f"*{suffix}")):
        match = re.search(pattern, path.read_text(), re.MULTILINE)
        assert match, f"{path}: no {pattern!r}"
        found[str(path.relative_to(PROTO))] = match[1]
    return found


def _floor(name: str) -> Version:
    for text in PROJECT["dependencies"]:
        req = Requirement(text)
        if canonicalize_name(req.name) == name:
            floors = [Version(s.version) for s in req.specifier if s.operator == ">="]
            assert floors, f"pyproject.toml: {text!r} has no >= floor"
            return max(floors)
    raise AssertionError(f"pyproject.toml does not ask for {name}")


def test_the_modules_were_generated_by_the_locked_grpcio_tools() -> None:
    """grpcio-tools stamps its version into every *_pb2_grpc.py; test_proto.py checks that
    regenerating with the installed (locked, tests/plugins/environment.py) one changes nothing."""
    locked = lockfile.read(lockfile.LOCK / "test.txt")["grpcio-tools"].version
    stamped = _generated(r"^GRPC_GENERATED_VERSION = '([^']+)'$", "_pb2_grpc.py")
    assert {m: v for m, v in stamped.items() if Version(v) != locked} == {}, (
        f"generated by another grpcio-tools than the locked {locked}: {HINT} (or make proto)"
    )


def test_the_floors_let_the_generated_modules_import() -> None:
    """A generated module refuses to import under a grpcio older than the grpcio-tools that
    made it, and under a protobuf runtime older than its gencode: the floors a user's own
    environment gets from the wheel must be at least those."""
    stamped = _generated(r"^GRPC_GENERATED_VERSION = '([^']+)'$", "_grpc.py").values()
    gencode = _generated(r"^# Protobuf Python Version: (\S+)$", "_pb2.py").values()
    grpc = max(Version(v) for v in stamped)
    protobuf = max(Version(v) for v in gencode)
    assert _floor("grpcio") >= grpc, f"pyproject.toml: grpcio's floor is below {grpc}; {HINT}"
    assert _floor("protobuf") >= protobuf, f"pyproject.toml: protobuf's floor is below {protobuf}"
