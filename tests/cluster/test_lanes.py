"""Each lane runs what it says: the pinned Kubernetes, runtime and runc on the Node, containerd's
config in the lane's format with CDI on as users get it (CRI-O's with CDI at its defaults), the
lane's feature gates only, and the doctor reading the runtime's release and CDI folders."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from containerd.image import IMAGE_NAME

from .build import SETUP_COMMAND, kubernetes
from .cluster import Cluster
from .crio import Crio
from .lane import CURRENT, Lane, LaneError

pytestmark = pytest.mark.lanes("current", "oldest", "crio")


def test_the_node_runs_the_lanes_releases(cluster: Cluster, lane: Lane) -> None:
    node = cluster.node() or {}
    info = node.get("status", {}).get("nodeInfo", {})
    assert info.get("kubeletVersion") == lane.kubernetes.release()
    runtime = info.get("containerRuntimeVersion", "")
    release = lane.runtime_release()
    if release is None:
        # Debian 13's package: "containerd://1.7.24~ds1"
        assert runtime.startswith("containerd://1.7."), runtime
    else:
        # The CRI answers the version without its "v", as for release binaries: e.g.
        # "containerd://2.3.7", "cri-o://1.36.3".
        assert runtime == f"{lane.runtime}://{release}", runtime


def test_the_runtime_runs_the_lanes_runc(cluster: Cluster, lane: Lane) -> None:
    """runc 1.5 built from its Go module under containerd 2.3 and CRI-O (it applies
    ``linux.netDevices``: test_net_devices.py), Debian 12's 1.1 under containerd 1.7."""
    runc = lane.runc(allow_build=False)
    if isinstance(cluster.runtime, Crio):
        assert f"exec {runc} " in (cluster.runtime.home / "runc-wrapper").read_text()
    else:
        assert cluster.containerd is not None
        cri = cluster.containerd.config["plugins"]
        cri = cri.get("io.containerd.cri.v1.runtime") or cri["io.containerd.grpc.v1.cri"]
        assert cri["containerd"]["runtimes"]["runc"]["options"]["BinaryName"] == str(runc)
    version = subprocess.run(
        [str(runc), "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.splitlines()[0]
    wanted = "runc version 1.1." if lane.runc_program is None else "runc version 1.5."
    assert version.startswith(wanted), version


@pytest.mark.lanes("current", "oldest")
def test_containerd_runs_the_lanes_config(cluster: Cluster, lane: Lane) -> None:
    assert cluster.containerd is not None
    config = cluster.containerd.config
    assert config["version"] == lane.containerd_config_version
    if lane.containerd_config_version == 4:
        cri = config["plugins"]["io.containerd.cri.v1.runtime"]
        # CDI on by default in 2.x: a node as users get it has no enable_cdi line.
        assert "enable_cdi" not in cri
    else:
        cri = config["plugins"]["io.containerd.grpc.v1.cri"]
        assert cri["enable_cdi"] is True
    assert cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]


@pytest.mark.lanes("crio")
def test_crio_runs_the_lanes_config(cluster: Cluster) -> None:
    """CRI-O as the issue asks: cgroupfs, conmon in the pod's cgroup, a runc, CDI reading the
    standard folders (its defaults; CDI has no switch in CRI-O)."""
    assert isinstance(cluster.runtime, Crio)
    crio = cluster.runtime.config["crio"]
    assert crio["runtime"]["cgroup_manager"] == "cgroupfs"
    assert crio["runtime"]["default_runtime"] == "runc"
    assert crio["runtime"]["runtimes"]["runc"]["monitor_cgroup"] == "pod"
    assert crio["runtime"]["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert crio["image"]["pause_image"] == IMAGE_NAME


def test_only_the_lanes_gates_are_set(cluster: Cluster, lane: Lane) -> None:
    kubelet = yaml.safe_load((cluster.work / "kubelet.yaml").read_text())
    assert kubelet.get("featureGates", {}) == dict(lane.feature_gates)
    argv = cluster.components["kube-apiserver"].argv
    assert ("--feature-gates" in argv) == bool(lane.feature_gates)


def test_a_lane_not_built_fails_naming_the_lane_and_the_setup(tmp_path: Path) -> None:
    # A pin nobody built: the tests never build for tens of minutes on their own.
    (tmp_path / "go.mod").write_text("module x\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes v1.99.0\n")
    (tmp_path / "go.sum").write_text("")
    lane = dataclasses.replace(CURRENT, name="unbuilt-test-lane", kubernetes=kubernetes(tmp_path))
    with pytest.raises(LaneError) as failure:
        lane.binaries(allow_build=False)
    message = str(failure.value)
    assert message.startswith("lane unbuilt-test-lane: Kubernetes: k8s.io/kubernetes v1.99.0")
    assert SETUP_COMMAND in message
    assert not lane.cache.exists(), "a lane that was never built left a cache folder"


def test_the_runtime_is_found_through_the_cri_socket(
    cluster: Cluster, lane: Lane, tmp_path: Path
) -> None:
    """In a pod no runtime binary is visible: doctor (and `--cdi-version runtime`) ask the
    lane's real runtime through its CRI socket, and read its release table row."""
    assert cluster.runtime is not None
    socket = cluster.runtime.socket
    # No runtime on PATH (podman is on this machine's): only the CRI can answer.
    env = {**os.environ, "PATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "cdi_gen", "doctor", "--cri-socket", str(socket),
         "--spec-dir", str(tmp_path / "cdi")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("OK   runtime: ")]
    release = lane.runtime_release()
    expected = (
        "OK   runtime: containerd 1.7.24~ds1 (reads cdiVersion <= 0.8.0;"
        if release is None
        # containerd 2.3.7 and CRI-O 1.36.3 both embed CDI library 1.1.0.
        else f"OK   runtime: {lane.runtime} {release} (reads cdiVersion <= 1.1.0;"
    )
    assert len(lines) == 1 and lines[0].startswith(expected), proc.stdout + proc.stderr
    assert lines[0].endswith(f"version from the CRI at {socket})"), lines[0]


@pytest.mark.lanes("crio")
def test_doctor_reads_crios_cdi_folders_on_the_node(
    cluster: Cluster, lane: Lane, tmp_path: Path
) -> None:
    """On the CRI-O node (its mount namespace, where /var/run/cdi is the node's), doctor reads
    the config as CRI-O itself prints it (``crio config``: what packages install as
    /etc/crio/crio.conf, defaults commented out) and finds our folder among CRI-O's."""
    assert isinstance(cluster.runtime, Crio) and cluster.namespace is not None
    crio = cluster.runtime
    printed = subprocess.run(
        cluster.namespace.enter(
            [str(crio.dist / "usr/bin/crio"), "--config", str(crio.config_path),
             "--config-dir", str(crio.home / "conf.d"), "config"]
        ),
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "[crio.runtime]" in printed, printed[:2000]
    (tmp_path / "crio.conf").write_text(printed)
    nsenter, *rest = cluster.namespace.enter(
        [sys.executable, "-m", "cdi_gen", "doctor", "--cri-socket", str(crio.socket),
         "--crio-config", str(tmp_path / "crio.conf"), "--spec-dir", "/var/run/cdi",
         "--containerd-config", str(tmp_path / "none.toml")]
    )  # fmt: skip
    proc = subprocess.run(
        [shutil.which(nsenter) or nsenter, *rest],
        # No runtime on PATH (podman is on this machine's): only the CRI can answer.
        env={**os.environ, "PATH": str(tmp_path)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    assert "OK   cri-o: cdi_spec_dirs ['/etc/cdi', '/var/run/cdi'] include /var/run/cdi" in lines, (
        proc.stdout + proc.stderr
    )
    runtime = [line for line in lines
               if line.startswith(f"OK   runtime: cri-o {lane.runtime_release()} ")]  # fmt: skip
    assert len(runtime) == 1, proc.stdout + proc.stderr
