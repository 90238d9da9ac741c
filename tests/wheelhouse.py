"""Wheels of the package's run-time dependencies, for installing the built wheel offline.

tests/integration/test_wheel.py installs the project's wheel into an empty virtual environment,
as a user's ``pip install`` would, but the suite reaches no package index while it runs: the
network is for setup only (``scripts/setup.sh test``). So setup downloads, once, the wheels of
every run-time dependency at exactly the versions the lock's run-time set pins
(``requirements/run.txt``, each file checked against its hash; tests/unit/test_lock.py holds it
to the closure of the package's ``Requires-Dist`` without extras, and the suite holds ``.venv``
to the lock) into ``/var/cache/cdi-gen-test/wheelhouse/<hash of that list>/``, and the test
installs with ``pip install --no-index --find-links`` from there: the
new environment gets the versions the rest of the suite tested, and nothing from ``.venv``
(no ``--system-site-packages``, no shared ``sys.path``).

    .venv/bin/python tests/wheelhouse.py      (idempotent; prints the folder)
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script (setup.sh): the repository root, for tests.lockfile, as pytest has it.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.lockfile import LOCK, read

CACHE = Path("/var/cache/cdi-gen-test/wheelhouse")
RUN_LOCK = LOCK / "run.txt"
SETUP_COMMAND = ".venv/bin/python tests/wheelhouse.py"


class WheelhouseError(RuntimeError):
    """The wheels are not there (or could not be downloaded); the message says what to run."""


def pins() -> list[str]:
    """``name==version`` of every distribution the package needs at run time, as the lock pins
    it for this platform."""
    return sorted(f"{n}=={pin.version}" for n, pin in read(RUN_LOCK).items() if pin.applies())


def folder(requirements: list[str]) -> Path:
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]
    return CACHE / key


def wheelhouse(*, allow_download: bool = False) -> Path:
    """The folder holding a wheel of every pin; downloaded only with ``allow_download``."""
    requirements = pins()
    dest = folder(requirements)
    if (dest / "complete").exists():
        return dest
    if not allow_download:
        raise WheelhouseError(
            f"no wheels of the run-time dependencies in {dest} (the lock changed, "
            f"or setup never ran): run `{SETUP_COMMAND}` first"
        )
    dest.mkdir(parents=True, exist_ok=True)
    # The lock's run-time set, so each file is checked against its hash; --no-deps: the list is
    # already the whole closure; --only-binary: the test must build nothing but our own wheel.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--only-binary=:all:", "--require-hashes", "--dest", str(dest),
         "-r", str(RUN_LOCK)],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise WheelhouseError(f"pip download into {dest} failed:\n{proc.stdout}{proc.stderr}")
    (dest / "complete").write_text("\n".join(requirements) + "\n")
    return dest


def main() -> int:
    try:
        dest = wheelhouse(allow_download=True)
    except WheelhouseError as exc:
        print(f"tests/wheelhouse.py: {exc}", file=sys.stderr)
        return 1
    print(f"wheels of {len(pins())} run-time dependencies in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
