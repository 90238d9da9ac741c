"""``cdi-gen --version``: the package version, the git revision it was built from (the one an
image recorded, deploy/Containerfile, else the source checkout's HEAD, else "unknown") and the
id of the dependency lock its environment was installed from (recorded by scripts/setup.sh or
the Containerfile, else "unknown")."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from cdi_gen.cli import main
from tests import lockfile
from tests.conftest import REPO

REVISION = "0123456789abcdef0123456789abcdef01234567"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _version() -> str:
    result = CliRunner().invoke(main.cli, ["--version"])
    assert result.exit_code == 0, result.output
    return result.output


def test_a_checkout_shows_its_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An editable install in a git checkout names the checkout's HEAD. The checkout is made
    here: the suite may run from a copy without .git (CI copies the files alone)."""
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "HOME": str(tmp_path),
    }

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True, env=env
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    git("add", "pyproject.toml")
    git("commit", "-q", "-m", "one")
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "no-image"))
    monkeypatch.setattr(main, "__file__", str(tmp_path / "src" / "cdi_gen" / "cli" / "main.py"))
    head = git("rev-parse", "HEAD")
    assert _version() == f"cdi-gen, version {VERSION} (revision {head}, lock unknown)\n"


def test_an_image_shows_the_revision_it_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file the Containerfile writes under the environment's prefix wins over anything."""
    recorded = tmp_path / main.REVISION_FILE
    recorded.parent.mkdir(parents=True)
    recorded.write_text(f"{REVISION}\n")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert _version() == f"cdi-gen, version {VERSION} (revision {REVISION}, lock unknown)\n"


def test_no_record_and_no_checkout_says_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(main, "__file__", str(tmp_path / "a" / "b" / "c" / "main.py"))
    assert _version() == f"cdi-gen, version {VERSION} (revision unknown, lock unknown)\n"


def test_the_environment_names_the_lock_it_was_installed_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = tmp_path / main.LOCK_FILE
    recorded.parent.mkdir(parents=True)
    recorded.write_text("1bf321a5d98c\n")
    (tmp_path / main.REVISION_FILE).write_text(f"{REVISION}\n")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert _version() == f"cdi-gen, version {VERSION} (revision {REVISION}, lock 1bf321a5d98c)\n"


def test_setup_records_the_lock_this_checkout_installed() -> None:
    """make test's .venv was installed by scripts/setup.sh from this checkout's lock."""
    proc = subprocess.run(
        [sys.executable, "-m", "cdi_gen", "--version"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert proc.stdout.endswith(f", lock {lockfile.lock_id()})\n"), proc.stdout
