"""Debian 13's etcd and containerd 1.7, unpacked privately beside the containerd e2e's copy."""

from __future__ import annotations

import os
from pathlib import Path

from containerd.fetch import CACHE_ROOT, FetchError, fetch, fetch_package, run_step

ETCD_CACHE = Path(os.environ.get("CDI_GEN_ETCD_CACHE", CACHE_ROOT / "etcd"))
#: Kubernetes 1.35 supports etcd 3.5 and 3.6; Debian 13 ships 3.5.
ETCD_SERIES = "3.5."

__all__ = ["FetchError", "etcd_version", "fetch_containerd", "fetch_etcd"]


def etcd_version(root: Path) -> str:
    """The version the unpacked etcd reports, e.g. ``3.5.16``."""
    out = run_step([str(root / "usr/bin/etcd"), "--version"], root, "etcd --version")
    # "etcd Version: 3.5.16" on the first line
    return out.splitlines()[0].split(":", 1)[1].strip()


def fetch_etcd(cache: Path = ETCD_CACHE) -> Path:
    """The unpacked etcd-server root (``usr/bin/etcd`` inside)."""
    return fetch_package("etcd-server", cache, etcd_version, ETCD_SERIES)


def fetch_containerd() -> Path:
    return fetch()
