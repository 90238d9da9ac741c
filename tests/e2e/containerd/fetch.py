"""Debian 13 packages fetched with apt under private folders and unpacked, once each.

Debian 12 ships containerd 1.6, which has no CDI at all; 1.7 from Debian 13 depends only on runc
and a glibc that Debian 12 has. The cluster tests take etcd the same way. apt is pointed at a
private sources list, lists folder and cache, so the system's apt configuration never learns
about trixie. Each unpacked tree is kept under a stable folder so that reruns cost nothing.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

CACHE_ROOT = Path("/var/cache/cdi-gen-test")
CACHE = Path(os.environ.get("CDI_GEN_CONTAINERD_CACHE", CACHE_ROOT / "containerd"))
SUITE = "deb http://deb.debian.org/debian trixie main"
WANTED_SERIES = "1.7."


class FetchError(RuntimeError):
    """A package could not be had; the message says which step failed and its output."""


def _apt_options(cache: Path) -> list[str]:
    apt = cache / "apt"
    return [
        "-o",
        f"Dir::Etc::sourcelist={apt / 'sources.list'}",
        "-o",
        "Dir::Etc::sourceparts=-",
        "-o",
        f"Dir::State::Lists={apt / 'lists'}",
        "-o",
        f"Dir::Cache={apt / 'cache'}",
    ]


def run_step(args: list[str], cwd: Path, what: str) -> str:
    try:
        proc = subprocess.run(
            args, cwd=cwd, capture_output=True, text=True, timeout=300, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"{what}: {' '.join(args)}: {exc}") from exc
    if proc.returncode != 0:
        raise FetchError(
            f"{what}: {' '.join(args)} exited {proc.returncode}\n{proc.stdout}{proc.stderr}"
        )
    return proc.stdout


def containerd_version(root: Path) -> str:
    """The version the unpacked containerd reports, e.g. ``1.7.24~ds1``."""
    out = run_step([str(root / "usr/bin/containerd"), "--version"], root, "containerd --version")
    # "containerd github.com/containerd/containerd 1.7.24~ds1 " + revision
    return out.split()[2]


def fetch_package(
    package: str, cache: Path, version_of: Callable[[Path], str], wanted: str
) -> Path:
    """The unpacked root of Debian 13's ``package`` under ``cache``, fetching it if needed.

    ``version_of(root)`` asks the unpacked program for its version; a cached or fresh tree whose
    version does not start with ``wanted`` is refused, so a changed suite fails by name.
    """
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / "root"
    # Several pytest sessions may start at once; one fetches, the others wait for it.
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if root.exists():
            try:
                if version_of(root).startswith(wanted):
                    return root
            except FetchError:
                pass  # a broken tree is fetched again
        apt = cache / "apt"
        (apt / "lists/partial").mkdir(parents=True, exist_ok=True)
        (apt / "cache/archives/partial").mkdir(parents=True, exist_ok=True)
        (apt / "sources.list").write_text(SUITE + "\n")
        options = _apt_options(cache)
        run_step(["apt-get", *options, "update"], cache, "apt-get update (private trixie lists)")
        for old in cache.glob(f"{package}_*.deb"):
            old.unlink()
        run_step(["apt-get", *options, "download", package], cache, "apt-get download")
        debs = sorted(cache.glob(f"{package}_*.deb"))
        if not debs:
            raise FetchError(f"apt-get download {package} left no .deb in {cache}")
        staging = cache / "root.new"
        subprocess.run(["rm", "-rf", str(staging)], check=True)
        run_step(["dpkg-deb", "-x", str(debs[-1]), str(staging)], cache, "dpkg-deb -x")
        version = version_of(staging)
        if not version.startswith(wanted):
            raise FetchError(f"trixie's {package} is {version}, the tests need {wanted}x")
        subprocess.run(["rm", "-rf", str(root)], check=True)
        staging.rename(root)
        return root


def fetch(cache: Path = CACHE) -> Path:
    """containerd 1.7's unpacked package root (``usr/bin/containerd`` inside)."""
    return fetch_package("containerd", cache, containerd_version, WANTED_SERIES)
