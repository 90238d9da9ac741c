"""Prepare everything the cluster tests need, idempotently; print versions and build times.

    python3 tests/cluster/setup.py [LANE...]      (default: every lane, current first)

For each lane of tests/cluster/lane.py: builds kubelet, kube-apiserver, kube-scheduler,
kube-controller-manager and kubectl from the release pinned in
tests/cluster/lanes/<lane>/kubernetes/go.mod, containerd 2.3 (current lane) from
tests/cluster/lanes/current/containerd/go.mod and CRI-O 1.36 with its pinns (crio lane) from
tests/cluster/lanes/crio/crio/go.mod, into /var/cache/cdi-gen-test/<lane>/ (nothing when
already built), and runc 1.5 (current and crio lanes) from tests/cluster/tools/runc/go.mod
into /var/cache/cdi-gen-test/runc/; unpacks Debian 13's etcd (every lane) and containerd 1.7
(oldest lane); checks the host tools the nodes need. Helm 3 and Helm 4, for the chart's tests,
are built from tests/cluster/tools/helm{,4}/go.mod into /var/cache/cdi-gen-test/helm/
(tests/cluster/helm.py).
Exits 1 naming the lane and what is missing or failed (after trying the other lanes); a second
run does nothing but check.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.build import Binaries, BuildError
from cluster.cluster import CNI_BIN, CNI_PLUGINS
from cluster.dist import FetchError, etcd_version, fetch_etcd
from cluster.helm import PROGRAMS, helm_build
from cluster.lane import LANES, Lane, LaneError

HOST_TOOLS = {
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "mount": "mount",
    "runc": "runc",
    "busybox": "busybox-static",
    # The crio lane: CRI-O's container monitor, and podman to load images into its store.
    "conmon": "conmon",
    "podman": "podman",
    "cc": "gcc",
}


def _version(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    return (out.stdout or out.stderr).strip().splitlines()[0]


def _state(binaries: Binaries) -> str:
    if binaries.build_seconds:
        return f"go build took {binaries.build_seconds:.0f} s"
    return f"cached; its cold go build took {binaries.cold_seconds:.0f} s"


def prepare(lane: Lane) -> None:
    """Build or fetch the lane's parts and print what they are (raises LaneError)."""
    print(f"lane {lane.name}: {lane.proves}", flush=True)
    built = lane.runtime_build()
    root = lane.runtime_root()
    where = f"built, {_state(built)}" if built is not None else "Debian 13's package"
    daemon = "crio" if lane.runtime == "cri-o" else "containerd"
    print(f"  {_version([str(root / 'usr/bin' / daemon), '--version'])} ({where})")
    runc = lane.runc_build()
    shown = f"built, {_state(runc)}" if runc is not None else "Debian 12's package"
    print(f"  {_version([str(lane.runc()), '--version'])} ({shown})", flush=True)
    print("  Kubernetes: from the build cache, or built (15 min cold, 2 busy cores)", flush=True)
    binaries = lane.binaries()
    print(f"  Kubernetes {binaries.version} in {binaries.bin} ({_state(binaries)})")
    for command in ("kubelet", "kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        print(f"    {command}: {_version([str(binaries.path(command)), '--version'])}")
    print(f"    kubectl: {_version([str(binaries.path('kubectl')), 'version', '--client'])}")
    gates = ", ".join(f"{k}={v}" for k, v in lane.feature_gates.items()) or "none"
    print(f"  feature gates: {gates}", flush=True)


def prepare_helm() -> bool:
    """Build Helm 3 and 4 unless built; print what they are (False, saying why, on failure)."""
    for major in PROGRAMS:
        try:
            # The chart's tests (unit and cluster) run them; built here, never by a test.
            helm = helm_build(major, allow_build=True)
        except BuildError as exc:
            print(f"cluster setup: {major}: {exc}", file=sys.stderr)
            return False
        helm_version = _version([str(helm.path("helm")), "version", "--short"])
        print(f"helm {helm_version} in {helm.bin} ({_state(helm)})", flush=True)
    return True


def main(argv: list[str]) -> int:
    unknown = [name for name in argv if name not in LANES]
    if unknown:
        print(f"cluster setup: unknown lanes {unknown}; known: {list(LANES)}", file=sys.stderr)
        return 2
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
    except FetchError as exc:
        print(f"cluster setup: etcd: {exc}", file=sys.stderr)
        return 1
    print(f"etcd {etcd_version(etcd)} ({etcd})")
    if not prepare_helm():
        return 1
    failed = []
    for name in argv or list(LANES):
        try:
            prepare(LANES[name])
        except LaneError as exc:
            print(f"cluster setup: {exc}", file=sys.stderr)
            failed.append(name)
    if failed:
        print(f"cluster setup: lanes not ready: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
