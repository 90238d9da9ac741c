"""The lock as the suite reads it: ``requirements/<set>.txt``, made by ``make lock``
(scripts/lock.sh), one pinned and hashed line per distribution, installed by scripts/setup.sh.

Read by the environment check (tests/plugins/environment.py: the run's environment holds
exactly its set's pins) and by tests/unit/test_lock.py (the lock agrees with pyproject.toml and
the generated modules). Only the subset of the requirements-file format that ``uv export`` writes
is accepted; anything else is an error naming the line, so a hand edit cannot slip through.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements"
#: The lock's files, in the order whose bytes make its id (scripts/setup.sh's lock_id).
FILES = ("build", "dev", "run", "test")
#: Which files each of setup.sh's environment sets installs (``.venv/.cdi-gen-set``).
SET_FILES = {"base": ("run", "build"), "test": ("test",), "dev": ("dev",)}

_PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)\s*(?:;(?P<marker>[^\\]*))?\\?$"
)
_HASH = re.compile(r"^\s+--hash=sha256:(?P<digest>[0-9a-f]{64})\s*\\?$")


class LockError(ValueError):
    """A lock file line the format does not allow; the message names the file and line."""


@dataclass(frozen=True)
class Pin:
    """One locked distribution: its canonical name, exact version, marker and file hashes."""

    name: str
    version: Version
    marker: Marker | None
    hashes: frozenset[str]

    def applies(self) -> bool:
        """Whether this environment (the running interpreter and platform) installs it."""
        return self.marker is None or self.marker.evaluate()


def read(path: Path) -> dict[str, Pin]:
    """The pins of one lock file, by canonical name."""
    pins: dict[str, Pin] = {}
    current: tuple[str, Version, Marker | None] | None = None
    hashes: set[str] = set()

    def close() -> None:
        if current is not None:
            name, version, marker = current
            if not hashes:
                raise LockError(f"{path.name}: {name}=={version} has no --hash")
            if name in pins:
                raise LockError(f"{path.name}: {name} is pinned twice")
            pins[name] = Pin(name, version, marker, frozenset(hashes))

    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if match := _PIN.match(line):
            close()
            marker = match["marker"]
            current = (
                canonicalize_name(match["name"]),
                Version(match["version"]),
                Marker(marker.strip()) if marker and marker.strip() else None,
            )
            hashes = set()
        elif (match := _HASH.match(line)) and current is not None:
            hashes.add(match["digest"])
        else:
            raise LockError(f"{path.name}:{number}: not a pin or a --hash line: {line[:80]!r}")
    close()
    return pins


def read_set(name: str, folder: Path = LOCK) -> dict[str, Pin]:
    """The pins one of setup.sh's sets installs (its files together)."""
    pins: dict[str, Pin] = {}
    for file in SET_FILES[name]:
        pins.update(read(folder / f"{file}.txt"))
    return pins


def lock_id(folder: Path = LOCK) -> str:
    """The lock's id as setup.sh and deploy/Containerfile compute it."""
    data = b"".join((folder / f"{file}.txt").read_bytes() for file in FILES)
    return hashlib.sha256(data).hexdigest()[:12]
