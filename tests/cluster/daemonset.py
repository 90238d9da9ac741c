"""The kustomize overlay scenario 6 applies: deploy/kubernetes as shipped, changed only where a
test on this machine must differ from a user's node.

The overlay lists ``deploy/kubernetes`` as its only resource, exactly the folder the README
tells users to ``kubectl apply -k``, and changes three things:

- the image: the agent image built from deploy/Containerfile and imported into the node's
  containerd (no registry here), with ``imagePullPolicy: Never`` so a missing import fails at
  once instead of trying a registry;
- the config: the shipped ConfigMap's ``fpga`` class matches loop devices instead of DFL ports
  (this machine has no FPGA), and shows each in the container at a DFL-port path so that the
  example consumer's ``ls -l /dev/dfl-port.*`` lists it; its other classes stay as shipped;
- the metrics port: a free one instead of 9400, because the machine is shared and the pod uses
  the host's network.

The host folders stay as shipped: the cluster's node namespace (``namespace.py``) puts the
kubelet's device-plugin folder and containerd's CDI folders at the standard paths.

``write_fleet_overlay`` is the device-plugin overlay for the three-node cluster
(``Cluster(node_count=3)``), whose nodes share this machine's one network namespace: the
shipped DaemonSet's hostNetwork metrics port could be bound by one agent only, so there metrics
are off (an empty ``CDI_GEN_METRICS_ADDRESS``) and with them the probes that ask that port; on
separate machines each agent has its own. Its agents are pointed at the API server's own
address, as the DRA overlays' are (below): at exit they ask it about their DaemonSet.
``write_fleet_dra_overlay`` does the same over the DRA variant.

``write_dra_overlay`` does the same over the DRA variant, ``deploy/kubernetes/dra``, and changes
one more thing: the API server's address. A pod's in-cluster config dials the ``kubernetes``
Service (``KUBERNETES_SERVICE_HOST``), and this cluster runs no kube-proxy that would route
the Service address; the agent pod uses the host's network, so it is pointed at the API
server's own address (127.0.0.1 is in its serving certificate). Its ServiceAccount, token,
RBAC and DeviceClasses stay as shipped.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .image import REPO

DEPLOY = REPO / "deploy" / "kubernetes"
DEPLOY_DRA = DEPLOY / "dra"
NAMESPACE = "kube-system"
NAME = "cdi-gen"
CONFIGMAP = "cdi-gen-config"
SELECTOR = "app.kubernetes.io/name=cdi-gen"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def shipped_config() -> dict[str, Any]:
    """The config of deploy/kubernetes/base/configmap.yaml."""
    (cm,) = _documents(DEPLOY / "base" / "configmap.yaml")
    config: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return config


def loop_fpga_config(kernel_names: Sequence[str], dfl_path: bool = True) -> dict[str, Any]:
    """The shipped config with its ``fpga`` class matching exactly these loop devices.

    Exact names: other suites create loop devices at the same time. With ``dfl_path`` each
    device appears in the container as ``/dev/dfl-port.<number>``, where a real DFL port would
    be (for the shipped example consumer); without, at its own path (for ``pods.consumer``).
    """
    config = copy.deepcopy(shipped_config())
    (fpga,) = [c for c in config["classes"] if c["name"] == "fpga"]
    fpga["match"] = [
        {"subsystem": "block", "kernel": k, "properties": {"DEVTYPE": "disk"}} for k in kernel_names
    ]
    if dfl_path:
        fpga["node"] = {"path": "/dev/dfl-port.{number}"}
    return config


def _configmap_patch(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP, "namespace": NAMESPACE},
        "data": {"config.yaml": yaml.safe_dump(config, sort_keys=False)},
    }


def _write_overlay(
    dest: Path,
    base: Path,
    image_name: str,
    config: dict[str, Any],
    patches: list[tuple[str, Any, dict[str, Any] | None]],
) -> Path:
    """A kustomization folder at ``dest`` over ``base``: the image, the config and
    ``patches`` (file name, content, target or None); returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    repository, tag = image_name.rsplit(":", 1)
    entries: list[dict[str, Any]] = []
    for file, content, target in [("configmap-patch.yaml", _configmap_patch(config), None),
                                  *patches]:  # fmt: skip
        (dest / file).write_text(yaml.safe_dump(content, sort_keys=False))
        entries.append({"path": file} if target is None else {"path": file, "target": target})
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        # kustomize refuses absolute paths; a relative one may leave the overlay's folder.
        "resources": [os.path.relpath(base, dest)],
        "images": [{"name": NAME, "newName": repository, "newTag": tag}],
        "patches": entries,
    }
    (dest / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return dest


def write_overlay(dest: Path, image_name: str, config: dict[str, Any], metrics_port: int) -> Path:
    """A kustomization folder at ``dest`` over deploy/kubernetes; returns ``dest``."""
    container = "/spec/template/spec/containers/0"
    daemonset_patch = [
        # "test" ops make the patch fail loudly if the shipped DaemonSet's layout moves.
        {"op": "test", "path": f"{container}/name", "value": "agent"},
        {"op": "add", "path": f"{container}/imagePullPolicy", "value": "Never"},
        {"op": "test", "path": f"{container}/ports/0/name", "value": "metrics"},
        {"op": "replace", "path": f"{container}/ports/0/containerPort", "value": metrics_port},
        {"op": "test", "path": f"{container}/env/3/name", "value": "CDI_GEN_METRICS_ADDRESS"},
        {"op": "replace", "path": f"{container}/env/3/value", "value": f"0.0.0.0:{metrics_port}"},
    ]
    target = {"kind": "DaemonSet", "name": NAME}
    return _write_overlay(
        dest, DEPLOY, image_name, config, [("daemonset-patch.yaml", daemonset_patch, target)]
    )


def _api_address(api_port: int) -> list[tuple[str, str]]:
    """The in-cluster address variables pointing at the API server itself (no kube-proxy
    here routes the Service address; see the module docstring)."""
    return [("KUBERNETES_SERVICE_HOST", "127.0.0.1"), ("KUBERNETES_SERVICE_PORT", str(api_port))]


def write_fleet_overlay(dest: Path, image_name: str, config: dict[str, Any], api_port: int) -> Path:
    """A kustomization folder at ``dest`` over deploy/kubernetes for several nodes on one
    machine (see the module docstring), the agents pointed at the API server as in
    ``write_dra_overlay`` (they ask it about their DaemonSet at exit); returns ``dest``."""
    container = "/spec/template/spec/containers/0"
    daemonset_patch = [
        {"op": "test", "path": f"{container}/name", "value": "agent"},
        {"op": "add", "path": f"{container}/imagePullPolicy", "value": "Never"},
        {"op": "test", "path": f"{container}/env/3/name", "value": "CDI_GEN_METRICS_ADDRESS"},
        {"op": "replace", "path": f"{container}/env/3/value", "value": ""},
        *(
            {"op": "add", "path": f"{container}/env/-", "value": {"name": k, "value": v}}
            for k, v in _api_address(api_port)
        ),
        {"op": "remove", "path": f"{container}/livenessProbe"},
        {"op": "remove", "path": f"{container}/readinessProbe"},
        # hostNetwork makes the container port a host port: nothing listens there now.
        {"op": "remove", "path": f"{container}/ports"},
    ]
    target = {"kind": "DaemonSet", "name": NAME}
    return _write_overlay(
        dest, DEPLOY, image_name, config, [("daemonset-patch.yaml", daemonset_patch, target)]
    )


def write_dra_overlay(
    dest: Path, image_name: str, config: dict[str, Any], metrics_port: int, api_port: int
) -> Path:
    """A kustomization folder at ``dest`` over deploy/kubernetes/dra; returns ``dest``."""
    # Env entries merge by name (the DRA patch put its own first, so no index is stable).
    env_patch = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {"template": {"spec": {"containers": [{
            "name": "agent",
            "imagePullPolicy": "Never",
            "env": [
                {"name": "CDI_GEN_METRICS_ADDRESS", "value": f"0.0.0.0:{metrics_port}"},
                {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)},
            ],
        }]}}},
    }  # fmt: skip
    container = "/spec/template/spec/containers/0"
    # No container port in the DRA variant (a host port would keep a rolling update's pod off
    # the node): the liveness probe names the port, checked first; readiness is the shipped
    # `cdi-gen probe` on the pod's own socket, checked as it is.
    port_patch = [
        {"op": "test", "path": f"{container}/livenessProbe/httpGet/port", "value": 9400},
        {"op": "replace", "path": f"{container}/livenessProbe/httpGet/port", "value": metrics_port},
        {
            "op": "test",
            "path": f"{container}/readinessProbe/exec/command",
            "value": ["cdi-gen", "probe"],
        },
    ]
    return _write_overlay(
        dest,
        DEPLOY_DRA,
        image_name,
        config,
        [
            ("env-patch.yaml", env_patch, None),
            ("port-patch.yaml", port_patch, {"kind": "DaemonSet", "name": NAME}),
        ],
    )


def write_fleet_dra_overlay(
    dest: Path, image_name: str, config: dict[str, Any], api_port: int
) -> Path:
    """``write_dra_overlay`` for several nodes on one machine: metrics and the probes on
    them off, as in ``write_fleet_overlay``; returns ``dest``."""
    env_patch = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {"template": {"spec": {"containers": [{
            "name": "agent",
            "imagePullPolicy": "Never",
            "env": [
                {"name": "CDI_GEN_METRICS_ADDRESS", "value": ""},
                {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)},
            ],
        }]}}},
    }  # fmt: skip
    container = "/spec/template/spec/containers/0"
    probes_patch = [
        {"op": "test", "path": f"{container}/name", "value": "agent"},
        {"op": "remove", "path": f"{container}/livenessProbe"},
        {"op": "remove", "path": f"{container}/readinessProbe"},
    ]
    return _write_overlay(
        dest,
        DEPLOY_DRA,
        image_name,
        config,
        [
            ("env-patch.yaml", env_patch, None),
            ("probes-patch.yaml", probes_patch, {"kind": "DaemonSet", "name": NAME}),
        ],
    )
