"""scripts/setup.sh installs from the lock or not at all: a locked distribution whose files no
longer match the lock's hashes (what a registry that moved on, or a tampered mirror, serves)
stops the install with one line naming the distribution and why, and no environment is
recorded as installed.

The setup runs for real (a virtual environment, uv, ``--require-hashes``) on a copy of the files
it reads, offline (``UV_OFFLINE``): the wheels come from uv's cache, filled when this suite's own
environment was set up, so the suite reaches no index."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.conftest import REPO

#: What setup.sh reads to make the agent's environment (`run`).
COPIED = ("scripts", "pyproject.toml", "README.md", "requirements", "src")


def _checkout(root: Path) -> Path:
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, root / name)
    return root


def _setup(root: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run(
        ["bash", "scripts/setup.sh", "run"],
        cwd=root, env={**env, "UV_OFFLINE": "1", "PYTHON": "python3"},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def test_a_distribution_that_no_longer_matches_its_hashes_stops_setup_naming_it(
    tmp_path: Path,
) -> None:
    root = _checkout(tmp_path)
    run = root / "requirements" / "run.txt"
    text = run.read_text()
    pin = re.search(r"^pyudev==(\S+) .*\n((?:    --hash=.*\n)+)", text, re.MULTILINE)
    assert pin, "pyudev is not in requirements/run.txt"
    forged = re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, pin[2])
    run.write_text(text.replace(pin[2], forged))

    proc = _setup(root)

    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"setup (run): the lock cannot be installed: pyudev=={pin[1]}: "), last
    assert "Hash mismatch" in last, last
    assert not (root / ".venv" / ".cdi-gen-set").exists(), "a half-installed set was recorded"
