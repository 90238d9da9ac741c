"""The suite's rule that it sees only what ``make test`` installed: it runs in the project's own
virtual environment (``.venv``, made by ``scripts/setup.sh`` from pyproject.toml), and that
environment holds the package's declared requirements and nothing else.

A test that passes only because the machine happens to have a package (left by an earlier
``make lint``, installed by hand) fails on a fresh clone on a fresh machine, and CI, which runs on
the submitting machine, would not show it. So the run refuses to start, naming what is wrong,
when:

- the interpreter is not ``.venv``'s (the machine's python3, another project's environment);
- a folder outside the repository and the interpreter's standard library is on ``sys.path``
  (``PYTHONPATH``, a user or system site-packages);
- pyproject.toml changed since ``.venv`` was made (``scripts/setup.sh`` would make it anew);
- ``.venv`` holds a distribution that the package's requirements (with the extras of the set
  setup installed, ``.venv/.cdi-gen-set``: ``test`` and ``lint`` for ``make test``, ``test``
  alone for ``make test-fast``; followed through every dependency) do not ask for, or lacks
  one they ask for.

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
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv"
PROJECT = "cdi-gen"
#: The extras of each set setup.sh installs the package with for the suite (``make test``'s
#: and ``make lint``'s ``dev``, ``make test-fast``'s ``test``).
SET_EXTRAS = {"dev": frozenset({"test", "lint"}), "test": frozenset({"test"})}
_SET = VENV / ".cdi-gen-set"
#: The extras this environment holds: its set's, or dev's when setup made no test set.
EXTRAS = SET_EXTRAS.get(_SET.read_text().strip() if _SET.is_file() else "dev", SET_EXTRAS["dev"])
#: What ``python -m venv`` puts in every environment before anything is asked for.
BOOTSTRAP = frozenset({"pip", "setuptools", "wheel"})
HINT = (
    "make test (scripts/setup.sh test) or make test-fast (scripts/setup.sh fast) makes it; "
    "by hand: .venv/bin/pytest tests/unit/test_x.py"
)


def wanted_distributions(dists: dict[str, metadata.Distribution]) -> tuple[set[str], set[str]]:
    """The closure of the project's requirements over ``dists`` (canonical names): what is
    asked for and present, and what is asked for but missing."""
    seen: set[tuple[str, frozenset[str]]] = set()
    present: set[str] = set()
    missing: set[str] = set()
    todo = [(PROJECT, EXTRAS)]
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), extras)
        if key in seen:
            continue
        seen.add(key)
        dist = dists.get(key[0])
        if dist is None:
            missing.add(key[0])
            continue
        present.add(key[0])
        for text in dist.requires or ():
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is None or any(
                req.marker.evaluate({"extra": extra}) for extra in (extras or {""})
            ):
                todo.append((req.name, frozenset(req.extras)))
    return present, missing


def distribution_problems(found: Iterable[metadata.Distribution]) -> list[str]:
    """What is wrong with an environment holding ``found``, one line each (empty: nothing)."""
    dists: dict[str, metadata.Distribution] = {}
    for dist in found:
        name = dist.metadata["Name"]
        if name:
            dists.setdefault(canonicalize_name(name), dist)
    present, missing = wanted_distributions(dists)
    extra = sorted(set(dists) - present - BOOTSTRAP)
    problems = []
    if extra:
        problems.append(
            f"installed but not required by {PROJECT}[{','.join(sorted(EXTRAS))}]: "
            f"{', '.join(extra)} (installed by hand? add it to pyproject.toml, or rm -rf .venv)"
        )
    if missing:
        problems.append(f"required but not installed: {', '.join(sorted(missing))}")
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
    if not key or key[-1] != pyproject:
        problems.append(
            "pyproject.toml changed since .venv was made (or .venv was not made by setup)"
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
