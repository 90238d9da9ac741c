"""The node's private mount namespace: the kubelet's fixed paths without touching the host's.

The kubelet serves device plugins at a path it does not let anyone change
(/var/lib/kubelet/device-plugins/kubelet.sock), writes pod logs under /var/log, and sets six
kernel sysctls at start (vm.overcommit_memory, kernel.panic, ...). kubelet and containerd
therefore run inside one private mount namespace where

- /var/lib is an empty tmpfs holding only ``kubelet``, bound to ``<work>/kubelet``;
- /var/log is bound to ``<work>/log``;
- /etc/cdi and /var/run/cdi are bound to ``<work>/cdi/etc`` and ``<work>/cdi/run``, so a
  DaemonSet applied as shipped writes where the runtime reads, and nowhere on the host;
- the six sysctl files are covered by files holding the values the kubelet wants, so it finds
  nothing to change and the host's settings stay as they are.

Everything outside (tests, ``cdi-gen run``, the control plane) reaches the same files through
``<work>``. The namespace lives as long as its holder process and anything entered into it.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .process import ComponentError

#: What the kubelet (pkg/kubelet/cm setupKernelTunables) insists on.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


@dataclass
class NodeNamespace:
    work: Path
    holder: subprocess.Popen[bytes] | None = None

    @property
    def kubelet_dir(self) -> Path:
        return self.work / "kubelet"

    @property
    def device_plugin_dir(self) -> Path:
        """/var/lib/kubelet/device-plugins as seen from outside the namespace."""
        return self.kubelet_dir / "device-plugins"

    @property
    def plugins_registry_dir(self) -> Path:
        """/var/lib/kubelet/plugins_registry (the kubelet's plugin watcher: DRA registration
        sockets) as seen from outside the namespace."""
        return self.kubelet_dir / "plugins_registry"

    @property
    def kubelet_plugins_dir(self) -> Path:
        """/var/lib/kubelet/plugins (DRA drivers' sockets) as seen from outside."""
        return self.kubelet_dir / "plugins"

    @property
    def cdi_etc(self) -> Path:
        return self.work / "cdi/etc"

    @property
    def cdi_run(self) -> Path:
        return self.work / "cdi/run"

    @property
    def log_dir(self) -> Path:
        return self.work / "log"

    def _script(self) -> str:
        sysctl_dir = self.work / "sysctl"
        lines = [
            "set -e",
            "mount -t tmpfs -o mode=0755 cdi-gen-node /var/lib",
            "mkdir /var/lib/kubelet",
            f"mount --bind {shlex.quote(str(self.kubelet_dir))} /var/lib/kubelet",
            f"mount --bind {shlex.quote(str(self.log_dir))} /var/log",
            f"mount --bind {shlex.quote(str(self.cdi_etc))} /etc/cdi",
            f"mount --bind {shlex.quote(str(self.cdi_run))} /var/run/cdi",
        ]
        for name in KUBELET_SYSCTLS:
            source = sysctl_dir / name.replace("/", ".")
            lines.append(f"mount --bind {shlex.quote(str(source))} /proc/sys/{name}")
        lines += ["echo namespace-ready", "exec sleep infinity"]
        return "\n".join(lines)

    def start(self, log_path: Path) -> None:
        # The kubelet creates its plugin folders too, but an agent may be started first.
        for d in (self.device_plugin_dir, self.plugins_registry_dir, self.kubelet_plugins_dir,
                  self.log_dir, self.cdi_etc, self.cdi_run):  # fmt: skip
            d.mkdir(parents=True, exist_ok=True)
        for d in (Path("/etc/cdi"), Path("/var/run/cdi")):
            if not d.is_dir():
                raise ComponentError(
                    f"node namespace: mount point {d} missing (.ci/run creates it: mkdir -p {d})"
                )
        sysctl_dir = self.work / "sysctl"
        sysctl_dir.mkdir(exist_ok=True)
        for name, value in KUBELET_SYSCTLS.items():
            (sysctl_dir / name.replace("/", ".")).write_text(value + "\n")
        with open(log_path, "ab") as log:
            # unshare execs the shell, which execs sleep: the holder's PID is the namespace's.
            self.holder = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", self._script()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 10
        while "namespace-ready" not in log_path.read_text(errors="replace"):
            if self.holder.poll() is not None or time.monotonic() > deadline:
                raise ComponentError(
                    "node namespace: setting up the private mounts failed:\n"
                    + log_path.read_text(errors="replace")
                )
            time.sleep(0.01)

    def enter(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace (nsenter execs it: the PID stays the program's)."""
        assert self.holder is not None
        return ["nsenter", "-t", str(self.holder.pid), "-m", "--", *argv]

    def hide(self, path: Path) -> None:
        """Cover ``path`` (a folder, e.g. a device's in sysfs) with an empty tmpfs inside the
        namespace: what the node's runtime and pods see there is nothing. Several nodes on one
        machine share its devices; hiding another node's keeps each node to its own, as
        separate machines would be."""
        self._run(["mount", "-t", "tmpfs", "-o", "size=4k,mode=0555", "cdi-gen-hidden", str(path)])

    def unhide(self, path: Path) -> None:
        self._run(["umount", str(path)])

    def _run(self, argv: list[str]) -> None:
        proc = subprocess.run(self.enter(argv), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ComponentError(f"node namespace: {' '.join(argv)}: {proc.stderr.strip()}")

    def stop(self) -> None:
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait(5)
