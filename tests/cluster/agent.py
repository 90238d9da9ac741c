"""``cdi-gen run`` on the cluster's node, as the DaemonSet would run it, from this checkout.

The agent runs in the host's namespaces (like a hostNetwork pod with host folders) and is
pointed at the node's folders as seen from outside its mount namespace: the kubelet's
device-plugin folder and containerd's CDI folders. Its config mirrors the seed lab's names
(``deploy/kubernetes/base/configmap.yaml``: vendor example.com, class fpga, devices ``fpga-N``, env
``FPGA_DEVICE``) with loop devices standing in for the FPGA ports.

In DRA mode (``dra_args``) the agent gets the kubelet's plugin folders as seen from the host
(the same paths inside the node), the cluster admin's kubeconfig for ResourceSlices and
ResourceClaims, the node's name for its pool, and a state folder of the test's own that
outlives one agent, so that a restarted agent finds the claims its predecessor prepared.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from containerd.agent import spawn_agent
from processes import terminate

from .cluster import Cluster

VENDOR = "example.com"
#: The DRA driver name the tests use: the vendor, which is also the agent's default.
DRIVER = VENDOR


def dra_args(cluster: Cluster, state_dir: Path, driver: str = DRIVER) -> tuple[str, ...]:
    """``cdi-gen run`` flags serving every class through DRA on the cluster's node."""
    return (
        "--api", "dra",
        "--dra-driver", driver,
        "--plugins-registry-dir", str(cluster.plugins_registry_dir),
        "--kubelet-plugins-dir", str(cluster.kubelet_plugins_dir),
        "--state-dir", str(state_dir),
        "--kubeconfig", str(cluster.admin_kubeconfig),
        "--node-name", cluster.node_name,
    )  # fmt: skip


def class_config(name: str, kernels: Sequence[str], replicas: int = 1, **extra: object) -> str:
    """One class of whole loop disks with exactly these kernel names; ``extra`` adds class
    fields as they are spelled in the config (``whenGone="taint"``).

    Exact names keep other suites' loop devices (created at the same time) out of the class.
    JSON is YAML.
    """
    cls: dict[str, object] = {
        "name": name,
        "match": [
            {"subsystem": "block", "kernel": k, "properties": {"DEVTYPE": "disk"}} for k in kernels
        ],
        "deviceName": f"{name}-{{number}}",
        "containerEdits": {"env": [f"{name.upper()}_DEVICE={{name}}"]},
    }
    if replicas > 1:
        cls["sharing"] = {"replicas": replicas}
    cls.update(extra)
    return json.dumps({"vendor": VENDOR, "classes": [cls]}, indent=2) + "\n"


@dataclass
class NodeAgent:
    cluster: Cluster
    config_path: Path
    log_path: Path
    #: More ``cdi-gen run`` flags, e.g. ``dra_args(...)``.
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = spawn_agent(
            self.config_path,
            [self.cluster.cdi_etc, self.cluster.cdi_run],
            self.cluster.device_plugin_dir,
            self.log_path,
            self.extra_args,
        )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM, as the kubelet ends a pod; the exit status (None if it had to be killed)."""
        return None if self.process is None else terminate(self.process)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(no agent log)"
