"""Imports and starts what the suite imports and starts, and says what is missing: run by
``make check-setup`` (scripts/check_setup.sh) inside a root file system made from nothing but
the Debian packages ``scripts/setup.sh test`` installs, with the project's virtual environment.

Each check prints one line, ``ok`` or ``MISSING`` with the reason; exit 1 when any is missing.
The Kubernetes build and the agent image are not made here (they take the Go toolchain and
minutes): their own scripts check their inputs first (tests/cluster/setup.py, image.py).
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "e2e"))

#: Programs the suite starts (the runtimes, the node's mount and network tools, udev, Go, the
#: image build), each with arguments that make it do a little real work.
PROGRAMS: tuple[tuple[str, ...], ...] = (
    ("podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"),
    ("runc", "--version"),
    ("conmon", "--version"),
    ("catatonit", "--version"),
    ("udevadm", "info", "--export-db"),
    ("busybox", "true"),
    ("unshare", "--mount", "--pid", "--fork", "true"),
    ("nsenter", "--version"),
    ("mount", "--version"),
    ("iptables", "--version"),
    ("go", "version"),
    ("mmdebstrap", "--version"),
    ("git", "--version"),
    ("make", "--version"),
)


def _imports() -> str:
    import cdi_gen

    # __main__ would run the CLI.
    modules = pkgutil.walk_packages(cdi_gen.__path__, "cdi_gen.")
    names = [m.name for m in modules if not m.name.endswith(".__main__")]
    for name in names:
        importlib.import_module(name)
    import pyudev

    # libudev1 is loaded here, not at import.
    devices = sum(1 for _ in pyudev.Context().list_devices(subsystem="mem"))
    return f"{len(names)} modules of cdi_gen; libudev sees {devices} mem devices"


def _programs() -> str:
    for argv in PROGRAMS:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-300:]}")
    return f"{len(PROGRAMS)} programs started"


def _cni() -> str:
    from tests.cluster.cluster import CNI_BIN, CNI_PLUGINS

    missing = [p for p in CNI_PLUGINS if not (CNI_BIN / p).is_file()]
    if missing:
        raise RuntimeError(f"CNI plugins missing from {CNI_BIN}: {', '.join(missing)}")
    return f"CNI plugins {', '.join(CNI_PLUGINS)}"


def _cdicheck() -> str:
    from cdicheck.build import CDICHECK_SRC, build_command

    with tempfile.TemporaryDirectory() as work:
        argv, env, binary = build_command("go", Path(work))
        proc = subprocess.run(
            argv,
            cwd=CDICHECK_SRC,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0 or not binary.exists():
            raise RuntimeError(f"go build of cdicheck failed: {proc.stderr[-500:]}")
    return "cdicheck built offline against Debian's Go CDI library"


def _containerd() -> str:
    from containerd.fetch import fetch

    root = fetch()
    proc = subprocess.run(
        [str(root / "usr/bin/containerd"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.stdout.strip()


CHECKS: tuple[tuple[str, Callable[[], str]], ...] = (
    ("imports", _imports),
    ("programs", _programs),
    ("cni", _cni),
    ("go cdi library", _cdicheck),
    ("containerd 1.7", _containerd),
)


def main() -> int:
    failed = 0
    for name, check in CHECKS:
        try:
            print(f"probe {name}: ok: {check()}", flush=True)
        except Exception as exc:  # every failure is reported, then the next check
            failed += 1
            print(f"probe {name}: MISSING: {type(exc).__name__}: {exc}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
