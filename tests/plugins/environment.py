"""The suite's rule that it sees only what ``make test`` installed: it runs in the project's own
virtual environment (``.venv``, made by ``scripts/setup.sh`` from the lock, ``requirements/``),
and that environment holds exactly its set's locked distributions, at their locked versions, and
the package itself.

A test that passes only because the machine happens to have a package (left by an earlier
``make lint``, installed by hand) fails on a fresh clone on a fresh machine, and CI, which runs on
the submitting machine, would not show it. So the run refuses to start, naming what is wrong,
when:

- the interpreter is not ``.venv``'s (the machine's python3, another project's environment);
- a folder outside the repository and the interpreter's standard library is on ``sys.path``
  (``PYTHONPATH``, a user or system site-packages);
- pyproject.toml or the lock changed since ``.venv`` was made (``scripts/setup.sh`` would make
  it anew);
- ``.venv`` holds a distribution that its set's lock files (``.venv/.cdi-gen-set``: ``dev``
  for ``make test``, ``test`` for ``make test-fast``; tests/lockfile.py) do not pin, lacks one
  they pin, or holds one at another version.

Whether the lock itself is what pyproject.toml asks for is tests/unit/test_lock.py's question.

Loaded by ``tests/conftest.py``; the check runs once, before collection.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests import lockfile

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv"
PROJECT = "cdi-gen"
_SET = VENV / ".cdi-gen-set"
#: The set of setup.sh's this environment holds (``dev`` when setup recorded none).
SET = _SET.read_text().strip() if _SET.is_file() else "dev"
#: What ``python -m venv`` puts in every environment before anything is asked for.
BOOTSTRAP = frozenset({"pip", "setuptools", "wheel"})
HINT = (
    "make test (scripts/setup.sh test) or make test-fast (scripts/setup.sh fast) makes it; "
    "by hand: .venv/bin/pytest tests/unit/test_x.py"
)


def distribution_problems(found: Iterable[metadata.Distribution]) -> list[str]:
    """What is wrong with an environment holding ``found`` against its set's lock, one line
    each (empty: nothing)."""
    installed: dict[str, str] = {}
    for dist in found:
        name = dist.metadata["Name"]
        if name:
            installed.setdefault(canonicalize_name(name), dist.version)
    try:
        pins = {n: p for n, p in lockfile.read_set(SET).items() if p.applies()}
    except (OSError, lockfile.LockError) as err:
        return [f"the lock of set {SET!r} cannot be read: {err}"]
    files = "+".join(f"requirements/{f}.txt" for f in lockfile.SET_FILES[SET])
    problems = []
    extra = sorted(set(installed) - set(pins) - BOOTSTRAP - {PROJECT})
    if extra:
        problems.append(
            f"installed but not in the lock ({files}): {', '.join(extra)} "
            "(installed by hand? add it to pyproject.toml and run make lock, or rm -rf .venv)"
        )
    missing = sorted(set(pins) - set(installed)) + ([PROJECT] if PROJECT not in installed else [])
    if missing:
        problems.append(f"locked but not installed: {', '.join(missing)}")
    moved = sorted(
        f"{name} {installed[name]} (locked {pin.version})"
        for name, pin in pins.items()
        if name in installed and Version(installed[name]) != pin.version
    )
    if moved:
        problems.append(f"installed at another version than the lock's: {', '.join(moved)}")
    return problems


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def path_problems(entries: Iterable[str]) -> list[str]:
    """``sys.path`` entries that lead outside the repository and the standard library."""
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    platstdlib = Path(sysconfig.get_paths()["platstdlib"]).resolve()
    bad = []
    for entry in entries:
        path = Path(entry or ".").resolve()
        if _inside(path, REPO):
            continue
        in_stdlib = _inside(path, stdlib) or _inside(path, platstdlib) or path.suffix == ".zip"
        if in_stdlib and not {"site-packages", "dist-packages"} & set(path.parts):
            continue
        bad.append(entry)
    return [f"on sys.path but outside the project's environment: {e}" for e in bad]


def environment_problems() -> list[str]:
    """Everything that makes this run see something ``make test`` did not install."""
    if Path(sys.prefix).resolve() != VENV.resolve():
        return [f"the suite runs in the project's environment {VENV}, not {sys.executable}"]
    problems = path_problems(sys.path)
    key = (VENV / ".cdi-gen-key").read_text().split() if (VENV / ".cdi-gen-key").exists() else []
    pyproject = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
    # setup.sh's key: the lock's files in name order, then pyproject.toml (venv_key).
    lock = hashlib.sha256(
        b"".join(path.read_bytes() for path in sorted(lockfile.LOCK.glob("*.txt")))
    ).hexdigest()
    if key[-2:] != [lock, pyproject]:
        problems.append(
            "pyproject.toml or the lock changed since .venv was made (or .venv was not made by "
            "setup)"
        )
    return problems + distribution_problems(metadata.distributions())


def pytest_configure(config: pytest.Config) -> None:
    problems = environment_problems()
    if problems:
        raise pytest.UsageError(
            "this test run may see packages make test did not install:\n  "
            + "\n  ".join(problems)
            + f"\n{HINT}"
        )
