"""Debian 13's containerd 1.7, fetched with apt under private folders and unpacked, once.

Debian 12 ships containerd 1.6, which has no CDI at all; 1.7 from Debian 13 depends only on runc
and a glibc that Debian 12 has. apt is pointed at a private sources list, lists folder and cache,
so the system's apt configuration never learns about trixie. The unpacked tree is kept under a
stable folder so that reruns cost nothing.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

CACHE = Path(os.environ.get("CDI_GEN_CONTAINERD_CACHE", "/var/cache/cdi-gen-test/containerd"))
SUITE = "deb http://deb.debian.org/debian trixie main"
WANTED_SERIES = "1.7."


class FetchError(RuntimeError):
    """containerd 1.7 could not be had; the message says which step failed and its output."""


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


def _step(args: list[str], cwd: Path, what: str) -> str:
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
    out = _step([str(root / "usr/bin/containerd"), "--version"], root, "containerd --version")
    # "containerd github.com/containerd/containerd 1.7.24~ds1 " + revision
    return out.split()[2]


def fetch(cache: Path = CACHE) -> Path:
    """The unpacked package root (``usr/bin/containerd`` inside), fetching it if needed."""
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / "root"
    # Several pytest sessions may start at once; one fetches, the others wait for it.
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "usr/bin/containerd").exists():
            version = containerd_version(root)
            if version.startswith(WANTED_SERIES):
                return root
        apt = cache / "apt"
        (apt / "lists/partial").mkdir(parents=True, exist_ok=True)
        (apt / "cache/archives/partial").mkdir(parents=True, exist_ok=True)
        (apt / "sources.list").write_text(SUITE + "\n")
        options = _apt_options(cache)
        _step(["apt-get", *options, "update"], cache, "apt-get update (private trixie lists)")
        for old in cache.glob("containerd_*.deb"):
            old.unlink()
        _step(["apt-get", *options, "download", "containerd"], cache, "apt-get download")
        debs = sorted(cache.glob("containerd_*.deb"))
        if not debs:
            raise FetchError(f"apt-get download containerd left no .deb in {cache}")
        staging = cache / "root.new"
        subprocess.run(["rm", "-rf", str(staging)], check=True)
        _step(["dpkg-deb", "-x", str(debs[-1]), str(staging)], cache, "dpkg-deb -x")
        version = containerd_version(staging)
        if not version.startswith(WANTED_SERIES):
            raise FetchError(f"trixie's containerd is {version}, the tests need {WANTED_SERIES}x")
        subprocess.run(["rm", "-rf", str(root)], check=True)
        staging.rename(root)
        return root
