"""The suite's own rules, checked by running pytest the way a newcomer would: every test folder
runs alone from the repository root with a bare ``pytest``; a skip fails the run; an empty
parameter list is an error, not a skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

TESTS = REPO / "tests"


def _pytest(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # -P: like the `pytest` script, do not put the working folder on sys.path (`python -m`
    # would, and hide exactly the "No module named 'tests'" a newcomer runs into).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    return subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _one_file_per_folder() -> list[Path]:
    folders: dict[Path, list[Path]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        folders.setdefault(path.parent, []).append(path)
    # In each folder the file most likely to break alone: one importing through `tests.`.
    return [
        next((f for f in files if "from tests." in f.read_text()), files[0])
        for files in folders.values()
    ]


@pytest.mark.parametrize("path", _one_file_per_folder(), ids=lambda p: str(p.relative_to(REPO)))
def test_a_test_file_is_collected_alone_from_the_repository_root(path: Path) -> None:
    proc = _pytest(["--collect-only", "-q", str(path.relative_to(REPO))], REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _write(folder: Path, body: str) -> Path:
    path = folder / "test_probe.py"
    path.write_text("import pytest\n\n" + body)
    return path


def _run_with_project_config(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    probe = _write(tmp_path, body)
    return _pytest(
        ["-c", str(REPO / "pyproject.toml"), "-p", "tests.plugins.no_skips", str(probe)], REPO
    )


def test_a_skip_fails_the_run_and_says_why(tmp_path: Path) -> None:
    proc = _run_with_project_config(
        tmp_path, "def test_x() -> None:\n    pytest.skip('podman missing')\n"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "podman missing" in proc.stdout
    assert "1 test(s) skipped or xfailed; this suite allows none" in proc.stdout


def test_a_clean_run_still_passes(tmp_path: Path) -> None:
    proc = _run_with_project_config(tmp_path, "def test_x() -> None:\n    assert True\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_empty_parameter_list_is_an_error(tmp_path: Path) -> None:
    proc = _run_with_project_config(
        tmp_path,
        "@pytest.mark.parametrize('x', [])\ndef test_x(x: int) -> None:\n    assert x\n",
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Empty parameter set" in proc.stdout + proc.stderr
