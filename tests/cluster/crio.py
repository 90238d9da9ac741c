"""A node's CRI-O (the crio lane), started and stopped as the containerd of the other lanes is.

Everything CRI-O would keep at a system path lives in the node's folder: its config, socket,
image store (containers-storage with the overlay driver), run state, conmon exit files, pinned
namespaces, runc state and version files; only /etc/cdi and /var/run/cdi are the standard
folders, which the node's mount namespace binds to the node's own (``namespace.py``). CRI-O
runs inside that namespace, so the overlay mounts of its store and the namespaces ``pinns``
pins stay there and go with it. Images reach the store through Debian's ``podman load`` run in
the same namespace against the same store: CRI-O has no import of its own.

Like containerd, CRI-O writes outside its folder only cgroups (under the kubelet's cgroupRoot,
which is this node's parent: removed at stop) and processes (conmon, runc's containers: ended
by the CRI, else by PID, found by their command line naming this node's folder).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from containerd.config import DEBIAN_RUNC, to_toml
from containerd.cri import CRIClient, stop_runtime
from podman_store import PodmanStore

CGROUP_ROOT = Path("/sys/fs/cgroup")
START_TIMEOUT = 30.0
#: Debian 12's monitor (crun refuses the machine's hybrid cgroup layout, so the runtime is a
#: runc: the lane's, ``Crio.runc``).
CONMON = Path("/usr/bin/conmon")
#: What CRI-O runs as runc: the lane's runc, after two edits of the bundle's config.json that make
#: CRI-O's container specs fit this VM, as containerd's config does for its own:
#: - oom_score_adj: CRI-O gives every infra container -998 (and the kubelet a Guaranteed
#:   pod's containers -997); lowering it needs CAP_SYS_RESOURCE, which this VM withholds even
#:   from root, so runc would fail. containerd here has ``restrict_oom_score_adj``; CRI-O has
#:   no such option, so a negative value becomes 0, what CRI-O itself runs with.
#: - hugepage limits: CRI-O sets them whenever /proc/cgroups lists hugetlb, but on this hybrid
#:   host hugetlb is bound to the unified hierarchy, which runc (in cgroup v1 mode) cannot
#:   use: every container would fail with "cannot set hugetlb limit". containerd drops them
#:   by default (``disable_hugetlb_controller``); so do we.
#: Nothing the tests check depends on either.
_RUNC_WRAPPER = """#!/bin/sh
bundle=""
previous=""
for arg in "$@"; do
    case "$previous" in --bundle | -b) bundle="$arg" ;; esac
    case "$arg" in --bundle=*) bundle="${{arg#--bundle=}}" ;; esac
    previous="$arg"
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
    /usr/bin/python3 -c '
import json, sys
path = sys.argv[1]
with open(path) as f:
    spec = json.load(f)
process = spec.get("process") or {{}}
if process.get("oomScoreAdj", 0) < 0:
    process["oomScoreAdj"] = 0
((spec.get("linux") or {{}}).get("resources") or {{}}).pop("hugepageLimits", None)
with open(path, "w") as f:
    json.dump(spec, f)
' "$bundle/config.json" || exit 1
fi
exec {runc} "$@"
"""


def runc_wrapper(runc: Path) -> str:
    """The wrapper script around ``runc`` (the lane's)."""
    return _RUNC_WRAPPER.format(runc=runc)


class CrioError(RuntimeError):
    """CRI-O did not start, or an image did not load; the message carries the log's end."""


def _pids_naming(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (this node's folder)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in argv:
            pids.append(int(proc.name))
    return pids


@dataclass
class Crio:
    """One running CRI-O: its folder, socket, CRI client and the way back to nothing."""

    #: A root with ``usr/bin/crio`` and ``usr/bin/pinns`` (``Lane.runtime_root``).
    dist: Path
    #: The node's folder; CRI-O's files go to ``<work>/crio``.
    work: Path
    #: The sandbox ("pause") image; the store must hold it (``import_image``) before pods run.
    sandbox_image: str
    #: Put before every command line: enters the node's mount namespace.
    command_prefix: list[str] = field(default_factory=list)
    #: The runc that the wrapper runs (``Lane.runc``).
    runc: Path = DEBIAN_RUNC
    process: subprocess.Popen[bytes] | None = None
    cri: CRIClient | None = None
    cgroup_parent: str = ""
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.work / "crio"

    @property
    def socket(self) -> Path:
        return self.home / "crio.sock"

    @property
    def log_path(self) -> Path:
        return self.home / "crio.log"

    @property
    def config_path(self) -> Path:
        return self.home / "crio.conf"

    @property
    def store(self) -> PodmanStore:
        """podman on CRI-O's own image store (root, run root and driver as in the config)."""
        return PodmanStore(self.home / "store")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def make_config(self) -> dict[str, Any]:
        home, store = self.home, self.store.home
        return {
            "crio": {
                "root": str(store / "storage"),
                "runroot": str(store / "runroot"),
                "storage_driver": "overlay",
                "storage_option": [],
                "log_dir": str(home / "pod-logs"),
                "version_file": str(home / "version"),
                "version_file_persist": str(home / "version-persist"),
                "clean_shutdown_file": str(home / "clean.shutdown"),
                "api": {"listen": str(self.socket), "stream_address": "127.0.0.1",
                        "stream_port": "0"},
                "runtime": {
                    "default_runtime": "runc",
                    "cgroup_manager": "cgroupfs",
                    "selinux": False,
                    # The host's AppArmor (if any) has no crio-default profile loaded.
                    "apparmor_profile": "unconfined",
                    # CRI-O's defaults, said here so that the tests read what the node uses.
                    "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi"],
                    # No host hooks, no host mounts file: only what the pod asks for.
                    "hooks_dir": [],
                    "default_mounts_file": str(home / "mounts.conf"),
                    "log_to_journald": False,
                    "namespaces_dir": str(home / "ns"),
                    "pinns_path": str(self.dist / "usr/bin/pinns"),
                    "container_exits_dir": str(home / "exits"),
                    "container_attach_socket_dir": str(home / "attach"),
                    # /etc/sysconfig is no place for a test node to write.
                    "irqbalance_config_file": str(home / "irqbalance"),
                    "irqbalance_config_restore_file": "disable",
                    "runtimes": {
                        "runc": {
                            "runtime_path": str(home / "runc-wrapper"),
                            "runtime_type": "oci",
                            "runtime_root": str(home / "runc"),
                            "monitor_path": str(CONMON),
                            # conmon in the pod's cgroup: the cgroupfs way (there is no
                            # systemd slice), removed with the pod.
                            "monitor_cgroup": "pod",
                        }
                    },
                },
                "image": {
                    "pause_image": self.sandbox_image,
                    # "": the image's own command (the busybox image sleeps forever).
                    "pause_command": "",
                    "signature_policy": str(home / "policy.json"),
                },
                "network": {
                    "network_dir": str(self.work / "cni/conf"),
                    "plugin_dirs": [str(self.work / "cni/bin")],
                },
                # NRI's socket would be /var/run/nri/nri.sock on the host, shared by all.
                "nri": {"enable_nri": False},
                "metrics": {"enable_metrics": False},
            }
        }  # fmt: skip

    def start(self) -> None:
        self.cgroup_parent = f"/cdi-gen-test-{self.work.name}"
        for d in ("store", "pod-logs", "ns", "exits", "attach", "runc", "conf.d"):
            (self.home / d).mkdir(parents=True, exist_ok=True)
        self.store.write_conf()
        (self.home / "mounts.conf").write_text("")
        wrapper = self.home / "runc-wrapper"
        wrapper.write_text(runc_wrapper(self.runc))
        wrapper.chmod(0o755)
        # Images come only from the store (imagePullPolicy: Never); nothing is pulled.
        (self.home / "policy.json").write_text('{"default": [{"type": "insecureAcceptAnything"}]}')
        self.config = self.make_config()
        self.config_path.write_text(to_toml(self.config))
        argv = [
            str(self.dist / "usr/bin/crio"),
            "--config", str(self.config_path),
            # An empty drop-in folder: nothing from the host's /etc/crio/crio.conf.d.
            "--config-dir", str(self.home / "conf.d"),
            "--log-level", "info",
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [*self.command_prefix, *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"},
                start_new_session=True,
            )
        self.cri = CRIClient(self.socket)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise CrioError(f"crio exited {code} at start:\n{self.log_tail()}")
            if self.socket.exists():
                try:
                    self.cri.version(timeout=1.0)
                    return
                except grpc.RpcError:
                    pass
            if time.monotonic() > deadline:
                raise CrioError(
                    f"crio not answering on {self.socket} after {START_TIMEOUT:g} s:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.02)

    def import_image(self, archive: Path) -> None:
        """``podman load`` a docker or OCI archive into CRI-O's store, in the node's namespace
        (the store's overlay mounts stay there); CRI-O sees the image at its next lookup."""
        store = self.store
        proc = subprocess.run(
            [*self.command_prefix, *store.argv(["load", "--quiet", "-i", archive])],
            env=store.env(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0:
            raise CrioError(f"podman load -i {archive} exited {proc.returncode}: {proc.stderr}")

    def stop(self) -> list[str]:
        """Undo everything, whatever state CRI-O is in; returns what could not be undone."""
        problems = stop_runtime(self.cri, self.process)
        # What survived the CRI removal: containers in our runc root, then their monitors.
        runc_root = self.home / "runc"
        for state in runc_root.glob("*/state.json"):
            subprocess.run(
                [str(self.runc), "--root", str(runc_root), "delete", "-f", state.parent.name],
                capture_output=True,
                check=False,
            )
        for pid in _pids_naming(str(self.home) + "/"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._remove_cgroups(problems)
        return problems

    def _remove_cgroups(self, problems: list[str]) -> None:
        if not self.cgroup_parent:
            return
        for top in (p for p in CGROUP_ROOT.glob("*" + self.cgroup_parent) if p.is_dir()):
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
