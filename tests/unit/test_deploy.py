"""The manifests under deploy/ say what the issue promises, and their config is valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cdi_gen.config.loader import parse_config
from tests.conftest import REPO

K8S = REPO / "deploy" / "kubernetes"
BASE = K8S / "base"


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_daemonset_shape() -> None:
    (ds,) = _load(BASE / "daemonset.yaml")
    spec = ds["spec"]["template"]["spec"]
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
    assert spec["hostNetwork"] is True
    assert spec["priorityClassName"] == "system-node-critical"
    (container,) = spec["containers"]
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    assert mounts["/var/lib/kubelet/device-plugins"] is False
    assert mounts["/var/run/cdi"] is False
    for ro in ("/dev", "/sys", "/run/udev"):
        assert mounts[ro] is True, ro
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    sc = container["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert container["resources"]["requests"]
    env = {e["name"] for e in container["env"]}
    assert {"CDI_GEN_SPEC_DIR", "CDI_GEN_DEVICE_PLUGIN_DIR", "CDI_GEN_CONFIG"} <= env
    # The runtime creates the termination-log file before the process starts; under a host
    # folder mounted read-only (/dev) that fails and the container never starts (seen on a real
    # kubelet: "read-only file system"), and under a writable one it would land on the host.
    termination = container.get("terminationMessagePath", "/dev/termination-log")
    for mount in mounts:
        assert not (termination + "/").startswith(mount.rstrip("/") + "/"), (termination, mount)


def test_the_agent_may_read_its_own_daemonset_and_nothing_else() -> None:
    """At exit the agent asks about the DaemonSet the manifest names (an uninstall removes its
    specs): the env names this DaemonSet, and the base's RBAC grants get on it alone."""
    (ds,) = _load(BASE / "daemonset.yaml")
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["CDI_GEN_DAEMONSET"]["value"] == ds["metadata"]["name"]
    assert env["CDI_GEN_DAEMONSET_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    docs = {d["kind"]: d for d in _load(BASE / "rbac.yaml")}
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding"}
    assert docs["ServiceAccount"]["metadata"]["name"] == spec["serviceAccountName"]
    assert docs["Role"]["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["daemonsets"],
            "resourceNames": [ds["metadata"]["name"]],
            "verbs": ["get"],
        }
    ]
    binding = docs["RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": docs["Role"]["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": "kube-system"}
    ]
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert "rbac.yaml" in kustomization["resources"]


def test_configmap_config_is_valid_and_examples_use_its_resource() -> None:
    (cm,) = _load(BASE / "configmap.yaml")
    config = parse_config(yaml.safe_load(cm["data"]["config.yaml"]), "configmap.yaml")
    resources = {f"{config.vendor}/{c.name}" for c in config.classes}
    for example in (K8S / "examples").glob("*.yaml"):
        for pod in _load(example):
            for c in pod["spec"]["containers"]:
                assert set(c["resources"]["limits"]) <= resources, example.name
    for folder in (K8S, BASE, K8S / "dra"):
        kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
        for resource in kustomization["resources"]:
            assert (folder / resource).exists(), (folder, resource)


def test_the_configuration_overview_example_is_a_valid_config() -> None:
    text = (REPO / "docs" / "configuration.md").read_text()
    start = text.index("```yaml\nvendor: example.com              # CDI vendor")
    block = text[start + len("```yaml\n") : text.index("```", start + 8)]
    config = parse_config(yaml.safe_load(block), "docs/configuration.md")
    assert config.classes[0].group is not None


def test_containerfile_base_is_a_build_argument_defaulting_to_public_python() -> None:
    """Registry-less builds pass --build-arg BASE; users without it get the public image, whose
    Python must satisfy requires-python."""
    lines = [
        line.strip()
        for line in (REPO / "deploy" / "Containerfile").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert lines[0].startswith("ARG BASE=")
    default = lines[0].removeprefix("ARG BASE=")
    assert default.startswith("docker.io/library/python:3.11-slim")
    # Both stages, the wheel's build and the agent's, stand on the one base.
    assert [line for line in lines if line.startswith("FROM ")] == [
        "FROM ${BASE} AS wheel",
        "FROM ${BASE}",
    ]
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.11"' in pyproject
    readme = (REPO / "README.md").read_text()
    assert "podman build -f deploy/Containerfile -t registry.example.com/cdi-gen:0.1.0" in readme


def test_runtime_pin_component_mounts_the_cri_sockets_the_agent_asks_read_only() -> None:
    """In the pod no runtime binary is visible: the 'runtime' pin asks the CRI sockets, so the
    component that sets it mounts their folders (read-only, following the host's unmounts), at
    the paths the agent asks by default; the shipped variants give the pod no CRI access."""
    from cdi_gen.config.settings import load_settings

    folder = K8S / "runtime-pin"
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    (patch,) = _load(folder / kustomization["patches"][0]["path"])
    (ds,) = _load(BASE / "daemonset.yaml")
    assert patch["metadata"] == {k: ds["metadata"][k] for k in ("name", "namespace")}
    spec = patch["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["name"] == ds["spec"]["template"]["spec"]["containers"][0]["name"]
    assert {"name": "CDI_GEN_CDI_VERSION", "value": "runtime"} in container["env"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    hosts = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    for socket in load_settings({}).runtimes.cri_sockets:
        mount = mounts[str(socket.parent)]
        assert mount["readOnly"] is True and mount["mountPropagation"] == "HostToContainer"
        assert hosts[mount["name"]] == str(socket.parent)
    for variant in (BASE / "daemonset.yaml", K8S / "dra" / "daemonset-patch.yaml"):
        text = variant.read_text()
        assert "/run/containerd" not in text and "crio" not in text, variant


def test_when_back_component_grants_what_follow_checks_and_the_variants_do_not() -> None:
    """deploy/kubernetes/when-back gives the agent what a follow class checks at start
    (src/cdi_gen/agent/privileges.py): the host's PID namespace, every capability follow
    uses, /sys/fs/cgroup writable, the pod-resources socket's and the CRI sockets' folders at
    the paths the agent asks by default; the shipped variants give none of it."""
    from cdi_gen.agent.privileges import FOLLOW_CAPABILITIES
    from cdi_gen.config.settings import load_settings

    folder = K8S / "when-back"
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    (patch,) = _load(folder / kustomization["patches"][0]["path"])
    spec = patch["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    (container,) = spec["containers"]
    caps = container["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"]
    assert sorted(f"CAP_{c}" for c in caps["add"]) == sorted(FOLLOW_CAPABILITIES)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    hosts = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    assert not mounts["/sys/fs/cgroup"].get("readOnly", False)
    settings = load_settings({})
    for socket in (settings.kubelet.pod_resources_socket, *settings.runtimes.cri_sockets):
        mount = mounts[str(socket.parent)]
        assert mount["readOnly"] is True
        assert hosts[mount["name"]] == str(socket.parent)
    for variant in (BASE / "daemonset.yaml", K8S / "dra" / "daemonset-patch.yaml"):
        text = variant.read_text()
        assert "hostPID" not in text and "pod-resources" not in text, variant
        assert "add:" not in text and "/sys/fs/cgroup" not in text, variant


def test_when_back_restart_component_mounts_the_two_sockets_and_grants_nothing_else() -> None:
    """deploy/kubernetes/when-back-restart gives a restart class what it checks at start, the
    pod-resources socket's and the CRI sockets' folders read-only at the paths the agent asks
    by default, and nothing of what only follow needs (no host PID namespace, no capability,
    no cgroup)."""
    from cdi_gen.config.settings import load_settings

    folder = K8S / "when-back-restart"
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    (patch,) = _load(folder / kustomization["patches"][0]["path"])
    spec = patch["spec"]["template"]["spec"]
    assert "hostPID" not in spec
    (container,) = spec["containers"]
    assert "securityContext" not in container
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    hosts = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    settings = load_settings({})
    sockets = (settings.kubelet.pod_resources_socket, *settings.runtimes.cri_sockets)
    assert set(mounts) == {str(socket.parent) for socket in sockets}
    for socket in sockets:
        mount = mounts[str(socket.parent)]
        assert mount["readOnly"] is True
        assert hosts[mount["name"]] == str(socket.parent)
