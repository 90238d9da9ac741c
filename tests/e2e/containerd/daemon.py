"""A private containerd for one test session (1.7; or 2.3 in the cluster tests' current lane),
and everything needed to leave no trace.

containerd writes outside its root and state folders in three places, which the teardown
undoes: shim sockets in /run/containerd/s, cgroup parents under /sys/fs/cgroup/<controller>/,
and mounts (container root file systems, sandbox /dev/shm) under its state folder. Processes are
stopped by their PID, never by name: other engineers run their own daemons on the same machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from .config import DEBIAN_RUNC, daemon_config, daemon_config_v4, to_toml
from .cri import CRIClient, stop_runtime

CGROUP_ROOT = Path("/sys/fs/cgroup")
RUN_CONTAINERD = Path("/run/containerd")
START_TIMEOUT = 20.0


class DaemonError(RuntimeError):
    """containerd did not start; the message carries the end of its log."""


def _snapshot_run_containerd() -> set[Path]:
    if not RUN_CONTAINERD.exists():
        return set()
    return {RUN_CONTAINERD, *RUN_CONTAINERD.rglob("*")}


def _mounts_under(prefix: Path) -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == str(prefix) or point.startswith(f"{prefix}/"):
                points.append(point)
    # Deepest first, so that nested mounts come off before their parents.
    return sorted(points, key=lambda p: p.count("/"), reverse=True)


def _bound_sockets() -> set[str]:
    """Paths of unix sockets that some process holds bound (from /proc/net/unix)."""
    with open("/proc/net/unix") as f:
        next(f)
        return {"/" + parts[7].lstrip("/") for line in f if len(parts := line.split()) >= 8}


def _shim_pids(address: Path) -> list[int]:
    """containerd-shim processes that serve this daemon (their -address is our socket)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"containerd-shim" in argv[0] and str(address).encode() in argv:
            pids.append(int(proc.name))
    return pids


@dataclass
class Containerd:
    """One running daemon: its work folder, socket, CRI client and the way back to nothing."""

    dist: Path
    work: Path
    spec_dirs: list[Path]
    sandbox_image: str
    enable_cdi: bool | None = None
    #: Put before the command line, e.g. to enter a mount namespace (the cluster tests' node).
    command_prefix: list[str] = field(default_factory=list)
    #: 2: containerd 1.7 from the deploy snippet; 4: containerd 2.3's native format.
    config_version: int = 2
    #: The runc the shim runs.
    runc: Path = DEBIAN_RUNC
    process: subprocess.Popen[bytes] | None = None
    cri: CRIClient | None = None
    cgroup_parent: str = ""
    _run_before: set[Path] = field(default_factory=set)
    _cgroups_before: set[Path] = field(default_factory=set)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.work / "containerd.sock"

    @property
    def log_path(self) -> Path:
        return self.work / "containerd.log"

    @property
    def config_path(self) -> Path:
        return self.work / "config.toml"

    @property
    def bin(self) -> Path:
        return self.dist / "usr/bin"

    def env(self) -> dict[str, str]:
        # Our binaries first: otherwise containerd finds Debian 12's 1.6 shim on PATH.
        path = f"{self.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        return {"PATH": path, "HOME": "/root", "LANG": "C.UTF-8"}

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def start(self) -> None:
        self._run_before = _snapshot_run_containerd()
        self._cgroups_before = set(CGROUP_ROOT.glob("*/k8s.io"))
        self.cgroup_parent = f"/cdi-gen-test-{self.work.name}"
        for d in ("root", "state", "runc", "opt", "cni/bin", "cni/conf", "logs"):
            (self.work / d).mkdir(parents=True, exist_ok=True)
        if self.config_version == 4:
            self.config = daemon_config_v4(self.work, self.spec_dirs, self.sandbox_image, self.runc)
        else:
            self.config = daemon_config(
                self.work,
                self.spec_dirs,
                self.sandbox_image,
                enable_cdi=self.enable_cdi,
                runc=self.runc,
            )
        self.config_path.write_text(to_toml(self.config))
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [
                    *self.command_prefix,
                    str(self.bin / "containerd"),
                    "--config",
                    str(self.config_path),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,
            )
        self.cri = CRIClient(self.socket)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise DaemonError(
                    f"containerd exited {self.process.returncode} at start:\n{self.log_tail()}"
                )
            if self.socket.exists():
                try:
                    self.cri.version(timeout=1.0)
                    return
                except grpc.RpcError:
                    pass
            if time.monotonic() > deadline:
                raise DaemonError(
                    f"containerd not answering on {self.socket} after {START_TIMEOUT}s:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.02)

    def ctr(self, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run(
            [str(self.bin / "ctr"), "-a", str(self.socket), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise DaemonError(f"ctr {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc.stdout

    def import_image(self, archive: Path) -> None:
        self.ctr("images", "import", str(archive))

    def stop(self) -> list[str]:
        """Undo everything, whatever state the daemon is in; returns what could not be undone."""
        problems = stop_runtime(self.cri, self.process)
        # Whatever survived the CRI removal: containers in our runc root, then their shims.
        runc_root = self.work / "runc"
        for ns_root in [runc_root, *runc_root.glob("*")]:
            if not ns_root.is_dir():
                continue
            for state in ns_root.glob("*/state.json"):
                subprocess.run(
                    ["/usr/sbin/runc", "--root", str(ns_root), "delete", "-f", state.parent.name],
                    capture_output=True,
                    check=False,
                )
        for pid in _shim_pids(self.socket):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for point in _mounts_under(self.work):
            if subprocess.run(["umount", point], capture_output=True, check=False).returncode:
                lazy = subprocess.run(["umount", "-l", point], capture_output=True, check=False)
                if lazy.returncode:
                    problems.append(f"could not unmount {point}")
        self._remove_cgroups(problems)
        self._remove_run_entries()
        return problems

    def _remove_cgroups(self, problems: list[str]) -> None:
        # Empty k8s.io parents that appeared while we ran: removed if nobody uses them (a
        # parallel daemon might), never reported.
        for top in CGROUP_ROOT.glob("*/k8s.io"):
            if top not in self._cgroups_before:
                with contextlib.suppress(OSError):
                    top.rmdir()
        ours = [p for p in CGROUP_ROOT.glob("*" + self.cgroup_parent) if p.is_dir()]
        for top in ours:
            # Children first; a cgroup directory can only be removed once it is empty.
            for d in sorted(
                (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                with contextlib.suppress(OSError):
                    d.rmdir()
            try:
                top.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                problems.append(f"cgroup {top}: {exc}")

    def _remove_run_entries(self) -> None:
        created = _snapshot_run_containerd() - self._run_before
        # Another daemon (a parallel session) may have created entries meanwhile: a socket
        # that something still listens on is not ours to remove.
        busy = _bound_sockets()
        for entry in sorted(created, key=lambda p: len(p.parts), reverse=True):
            if str(entry) in busy:
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir() and not entry.is_symlink():
                    entry.rmdir()
                else:
                    entry.unlink()


def work_folder() -> Path:
    """A short folder under /tmp: the gRPC socket path must stay within 107 bytes."""
    return Path(tempfile.mkdtemp(dir="/tmp", prefix="cgctd"))


def remove_work(work: Path) -> None:
    if _mounts_under(work):
        return  # never recurse into something still mounted; the report says so
    shutil.rmtree(work, ignore_errors=True)
