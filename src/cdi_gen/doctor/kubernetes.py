"""The kubelet as the doctor finds it: its device-plugin socket and, for classes served
through DRA, its plugin watcher folder and an API server configuration the driver can load."""

from __future__ import annotations

from pathlib import Path

from cdi_gen.config.models import AgentConfig
from cdi_gen.config.settings import Settings
from cdi_gen.doctor.check import Check
from cdi_gen.errors import ConfigError
from cdi_gen.paths import KUBELET_SOCKET_NAME

__all__ = ["check_dra", "check_kubelet"]


def check_kubelet(plugin_dir: Path) -> list[Check]:
    sock = plugin_dir / KUBELET_SOCKET_NAME
    if sock.is_socket():
        return [Check("OK", "kubelet", f"{sock} is present")]
    return [
        Check(
            "WARN",
            "kubelet",
            f"{sock} is absent: no kubelet device manager here",
            "only host mode (cdi-gen write + podman/docker) will work on this machine",
        )
    ]


def check_dra(settings: Settings, config: AgentConfig) -> list[Check]:
    """For classes served through DRA: the kubelet's plugin watcher folder, and an API server
    configuration the driver can load (nothing is asked of the API server itself)."""
    classes = [c.name for c in config.classes if c.api == "dra"]
    if not classes:
        return []
    # Only a node with DRA classes loads the API client.
    from cdi_gen.apiserver.kubeconfig import load_kubeconfig

    topic = "dra"
    registry = settings.kubelet.plugins_registry_dir
    checks = [
        Check("OK", topic, f"{registry} is present (the kubelet's plugin watcher)")
        if registry.is_dir()
        else Check(
            "WARN",
            topic,
            f"{registry} is absent: no kubelet plugin watcher to register DRA driver "
            f"{settings.driver_name(config)} with",
            "run a kubelet >= 1.34 here, or point --plugins-registry-dir at its folder",
        )
    ]
    try:
        current = load_kubeconfig(settings.cluster.kubeconfig).get()
    except ConfigError as exc:
        checks.append(
            Check(
                "FAIL",
                topic,
                f"classes {', '.join(classes)} use DRA, which needs the API server: {exc}",
                "give --kubeconfig, or run in a pod with a service account (deploy/kubernetes/dra)",
            )
        )
        return checks
    checks.append(
        Check(
            "OK",
            topic,
            f"driver {settings.driver_name(config)} publishes node {settings.node()}'s "
            f"ResourceSlices at {current.cluster.server if current else '?'} "
            f"(classes {', '.join(classes)})",
        )
    )
    return checks
