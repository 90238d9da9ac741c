"""Prepare everything the cluster tests need, idempotently; print versions and build time.

    python3 tests/cluster/setup.py

Builds kubelet, kube-apiserver, kube-scheduler, kube-controller-manager and kubectl from the
release pinned in tests/cluster/k8s/go.mod into /var/cache/cdi-gen-test/kubernetes (nothing
when already built), unpacks Debian 13's etcd and containerd 1.7, and checks the host tools the
node needs. Exits 1 naming what is missing or what failed; a second run does nothing but check.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.build import BuildError, build
from cluster.cluster import CNI_BIN, CNI_PLUGINS
from cluster.dist import FetchError, etcd_version, fetch_containerd, fetch_etcd

HOST_TOOLS = {
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "mount": "mount",
    "runc": "runc",
    "busybox": "busybox-static",
}


def _version(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    return (out.stdout or out.stderr).strip().splitlines()[0]


def main() -> int:
    missing = [f"{tool} (apt-get install {pkg})" for tool, pkg in HOST_TOOLS.items()
               if shutil.which(tool) is None]  # fmt: skip
    for plugin in CNI_PLUGINS:
        if not (CNI_BIN / plugin).exists():
            missing.append(f"{CNI_BIN}/{plugin} (apt-get install containernetworking-plugins)")
    # The node's mount namespace binds its own folders over these (tests/cluster/namespace.py).
    missing += [f"{d} (mkdir -p {d})" for d in ("/etc/cdi", "/var/run/cdi") if not Path(d).is_dir()]
    if missing:
        print("cluster setup: missing: " + ", ".join(missing), file=sys.stderr)
        return 1
    try:
        etcd = fetch_etcd()
        containerd = fetch_containerd()
        print(f"etcd {etcd_version(etcd)} ({etcd})")
        print(_version([str(containerd / "usr/bin/containerd"), "--version"]))
        print("Kubernetes: from the build cache, or built (~10 min cold, 2 cores)", flush=True)
        binaries = build()
    except (FetchError, BuildError) as exc:
        print(f"cluster setup: {exc}", file=sys.stderr)
        return 1
    state = (
        f"go build took {binaries.build_seconds:.0f} s"
        if binaries.build_seconds
        else f"cached; its go build took {binaries.cold_seconds:.0f} s"
    )
    print(f"Kubernetes {binaries.version} in {binaries.bin} ({state})")
    for command in ("kubelet", "kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        print(f"  {command}: {_version([str(binaries.path(command)), '--version'])}")
    print(f"  kubectl: {_version([str(binaries.path('kubectl')), 'version', '--client'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
