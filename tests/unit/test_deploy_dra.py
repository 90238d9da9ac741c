"""The DRA variant under deploy/kubernetes/dra: the DaemonSet patch gives the agent what DRA
needs, the RBAC grants what the issue lists and no more, the slice policy narrows its slice
writes to its own node's, and deviceclasses.yaml is exactly what ``cdi-gen deviceclasses``
prints for the shipped config.

Regenerate the DeviceClasses after changing the shipped config or the generator:

    python3 -m tests.unit.test_deploy_dra --write
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from cdi_gen.cli.main import main
from cdi_gen.config.loader import parse_config
from cdi_gen.dra.plugin import server as draplugin
from tests.conftest import REPO

K8S = REPO / "deploy" / "kubernetes"
DRA = K8S / "dra"
DEVICE_CLASSES = DRA / "deviceclasses.yaml"
#: For an agent run on the embedded catalogue (no --config): every catalogue class.
CATALOGUE_CLASSES = DRA / "catalogue" / "deviceclasses.yaml"
REGENERATE = ".venv/bin/python -m tests.unit.test_deploy_dra --write"


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _shipped_config_text() -> str:
    (cm,) = _load(K8S / "base" / "configmap.yaml")
    text: str = cm["data"]["config.yaml"]
    return text


def generate(catalogue: bool = False) -> str:
    """What ``cdi-gen deviceclasses --config <the shipped config>`` prints, or with
    ``catalogue`` what it prints for the embedded catalogue (no ``--config``)."""
    with tempfile.TemporaryDirectory() as work:
        config = Path(work) / "config.yaml"
        config.write_text(_shipped_config_text())
        args = [] if catalogue else ["--config", str(config)]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(["deviceclasses", *args])
            except SystemExit as exc:
                code = exc.code
            else:
                code = 0
    if code != 0:
        raise AssertionError(f"cdi-gen deviceclasses exited {code}: {err.getvalue()}")
    return out.getvalue()


def test_deviceclasses_file_is_what_the_cli_generates() -> None:
    assert DEVICE_CLASSES.read_text() == generate(), f"stale: run `{REGENERATE}`"


def test_catalogue_deviceclasses_cover_every_catalogue_class() -> None:
    assert CATALOGUE_CLASSES.read_text() == generate(catalogue=True), f"stale: run `{REGENERATE}`"
    from cdi_gen.config.loader import load_config

    catalogue = load_config(None)
    names = {c["spec"]["extendedResourceName"] for c in _load(CATALOGUE_CLASSES)}
    assert names == {f"{catalogue.vendor}/{c.name}" for c in catalogue.classes}


def test_every_shipped_class_has_a_device_class_for_its_extended_resource() -> None:
    config = parse_config(yaml.safe_load(_shipped_config_text()), "configmap.yaml")
    classes = _load(DEVICE_CLASSES)
    assert all(c["apiVersion"] == "resource.k8s.io/v1" for c in classes), classes
    assert all(c["kind"] == "DeviceClass" for c in classes), classes
    by_resource = {c["spec"].get("extendedResourceName"): c for c in classes}
    assert len(by_resource) == len(classes), "two DeviceClasses serve one extended resource"
    for cls in config.classes:
        found = by_resource.get(f"{config.vendor}/{cls.name}")
        assert found is not None, (cls.name, sorted(map(str, by_resource)))
        expressions = " ".join(s["cel"]["expression"] for s in found["spec"]["selectors"])
        # The agent's default driver name is the vendor; the class attribute selects.
        assert f'"{config.vendor}"' in expressions, expressions
        assert f'"{cls.name}"' in expressions, expressions


def _patched_container() -> tuple[dict[str, Any], dict[str, Any]]:
    (patch,) = _load(DRA / "daemonset-patch.yaml")
    spec = patch["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["name"] == "agent"  # strategic merge by name: the base's container
    return spec, container


def test_daemonset_patch_serves_through_dra() -> None:
    spec, container = _patched_container()
    deleted = {
        (what, str(item.get("name") or item.get("mountPath")))
        for what, items in (
            ("env", container["env"]),
            ("mount", container["volumeMounts"]),
            ("volume", spec["volumes"]),
        )
        for item in items
        if item.get("$patch") == "delete"
    }
    # No device plugin is served: the kubelet's device plugin folder is not given to it.
    assert deleted == {
        ("env", "CDI_GEN_DEVICE_PLUGIN_DIR"),
        ("mount", "/var/lib/kubelet/device-plugins"),
        ("volume", "device-plugins"),
    }
    env = {e["name"]: e for e in container["env"] if "$patch" not in e}
    assert env["CDI_GEN_API"]["value"] == "dra"
    assert env["CDI_GEN_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["CDI_GEN_STATE_DIR"]["value"] == "/var/lib/cdi-gen"
    # Sockets per pod: the two pods of a rolling update register side by side.
    assert env["CDI_GEN_POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"] if "$patch" not in m}
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    for path in ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins",
                 "/var/lib/cdi-gen"):  # fmt: skip
        # Writable (sockets, checkpoint), and the same path on the host as in the container:
        # the registration hands the kubelet the DRA socket's path as the agent sees it.
        assert not mounts[path].get("readOnly", False), path
        assert volumes[mounts[path]["name"]] == path
    assert env["CDI_GEN_PLUGINS_REGISTRY_DIR"]["value"] == "/var/lib/kubelet/plugins_registry"
    assert env["CDI_GEN_KUBELET_PLUGINS_DIR"]["value"] == "/var/lib/kubelet/plugins"
    # The ServiceAccount is the base's: the device-plugin variant asks about its DaemonSet too.
    assert "serviceAccountName" not in spec


def test_rbac_grants_what_the_agent_needs_and_no_more() -> None:
    docs = {d["kind"]: d for d in _load(DRA / "rbac.yaml")}
    assert set(docs) == {"ClusterRole", "ClusterRoleBinding"}
    (base,) = _load(K8S / "base" / "daemonset.yaml")
    account = base["spec"]["template"]["spec"]["serviceAccountName"]
    assert account == "cdi-gen"
    grants = {
        (group, resource): set(rule["verbs"])
        for rule in docs["ClusterRole"]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert grants == {
        ("resource.k8s.io", "resourceslices"): {
            "get", "list", "watch", "create", "update", "patch", "delete",
        },
        ("resource.k8s.io", "resourceclaims"): {"get"},
        ("resource.k8s.io", "resourceclaims/status"): {"patch"},
        ("resource.k8s.io", "resourceclaims/driver"): {
            "associated-node:patch", "associated-node:update",
        },
        ("events.k8s.io", "events"): {"create", "patch"},
        ("", "nodes"): {"get"},
    }  # fmt: skip
    (driver_rule,) = [
        r for r in docs["ClusterRole"]["rules"] if r["resources"] == ["resourceclaims/driver"]
    ]
    assert driver_rule["resourceNames"] == ["example.com"]  # the vendor: the driver's name
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "cdi-gen", "namespace": "kube-system"}
    ]


#: What the slice policy's variables and validations say, in the order they run (the first
#: validation that fails is the one the API server answers with).
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
CALLER_NODE = f'request.userInfo.extra[?"{NODE_NAME_KEY}"][?0].orValue("")'
SLICE_NODE = '(request.operation == "DELETE" ? oldObject : object).spec.?nodeName.orValue("")'
NOT_BOUND = (
    "cdi-gen may write ResourceSlices only with a ServiceAccount token bound to its pod, which "
    "names the pod's node (ServiceAccountTokenPodNodeInfo, GA since Kubernetes 1.32)"
)
#: A CEL string expression: literal pieces in double quotes, joined with the variables.
OTHER_NODE = " + ".join([
    "\"cdi-gen on node '\"",
    "variables.callerNode",
    "\"' may write only that node's ResourceSlices, not one with spec.nodeName '\"",
    "variables.sliceNode",
    "\"'\"",
])  # fmt: skip


def assert_slice_policy(objects: list[dict[str, Any]], namespace: str, account: str) -> str:
    """``objects`` hold exactly one ValidatingAdmissionPolicy and its binding, which let the
    ServiceAccount ``namespace/account`` write only the ResourceSlices of the node its token
    is bound to, and nobody else's requests are judged; returns the policy's name."""
    (policy,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    for obj in (policy, binding):
        assert obj["apiVersion"] == "admissionregistration.k8s.io/v1", obj  # GA since 1.30
    spec = policy["spec"]
    assert set(spec) == {
        "failurePolicy", "matchConstraints", "matchConditions", "variables", "validations",
    }, spec  # fmt: skip
    assert spec["failurePolicy"] == "Fail"
    # Every version a client may write slices at, and every writing verb (a PATCH is an
    # UPDATE to admission; RBAC grants no deletecollection).
    assert spec["matchConstraints"] == {
        "resourceRules": [{
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1", "v1beta1", "v1beta2"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["resourceslices"],
        }]
    }  # fmt: skip
    (condition,) = spec["matchConditions"]
    user = f"system:serviceaccount:{namespace}:{account}"
    assert condition["expression"] == f'request.userInfo.username == "{user}"', condition
    assert [(v["name"], v["expression"]) for v in spec["variables"]] == [
        ("callerNode", CALLER_NODE),
        ("sliceNode", SLICE_NODE),
    ]
    assert spec["validations"] == [
        {"expression": 'variables.callerNode != ""', "message": NOT_BOUND},
        {
            "expression": "variables.callerNode == variables.sliceNode",
            "messageExpression": OTHER_NODE,
        },
    ]
    name: str = policy["metadata"]["name"]
    # Every slice, no parameters: the binding only switches the policy on, refusing.
    assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}, binding
    assert binding["metadata"]["name"] == name
    return name


def test_slice_policy_lets_the_agent_write_only_its_nodes_slices() -> None:
    (base,) = _load(K8S / "base" / "daemonset.yaml")
    namespace = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())["namespace"]
    account = base["spec"]["template"]["spec"]["serviceAccountName"]
    assert (namespace, account) == ("kube-system", "cdi-gen")
    objects = _load(DRA / "slice-policy.yaml")
    assert len(objects) == 2, [o["kind"] for o in objects]
    assert assert_slice_policy(objects, namespace, account) == "cdi-gen-slices"
    # Cluster-scoped: a namespace here would be refused by the API server.
    assert all("namespace" not in o["metadata"] for o in objects)


def test_overlay_builds_on_the_base_and_ships_its_parts() -> None:
    kustomization = yaml.safe_load((DRA / "kustomization.yaml").read_text())
    assert kustomization["resources"] == [
        "../base", "rbac.yaml", "slice-policy.yaml", "deviceclasses.yaml",
    ]  # fmt: skip
    assert kustomization["patches"] == [{"path": "daemonset-patch.yaml"}]
    # The device-plugin variant is the same base: one agent, two ways to serve it.
    top = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert top["resources"] == ["base"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {REGENERATE}")
    DEVICE_CLASSES.write_text(generate())
    CATALOGUE_CLASSES.parent.mkdir(exist_ok=True)
    CATALOGUE_CLASSES.write_text(generate(catalogue=True))
    print(f"wrote {DEVICE_CLASSES.relative_to(REPO)}, {CATALOGUE_CLASSES.relative_to(REPO)}")


def test_the_dra_daemonset_surges_and_the_device_plugin_one_replaces() -> None:
    # DRA: the new pod serves before the old one stops (kubelet >= 1.33, sockets per pod).
    (patch,) = _load(DRA / "daemonset-patch.yaml")
    strategy = patch["spec"]["updateStrategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    # A device plugin registers one per resource name: one instance at a time.
    (base,) = _load(K8S / "base" / "daemonset.yaml")
    assert base["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    # With the host's network a container port is a host port: the surge pod would never be
    # scheduled beside the old one. The liveness probe names the port instead.
    spec, container = _patched_container()
    assert "ports" in container and container["ports"] is None  # deleted from the base's
    assert container["livenessProbe"]["httpGet"]["port"] == 9400
    # Until the old pod has gone, the port is its agent's: readiness asks this pod's own over
    # a socket in a folder of the pod (the base's HTTP probe deleted), within a timeout a
    # Python start fits in.
    readiness = container["readinessProbe"]
    assert readiness["httpGet"] is None
    assert readiness["exec"] == {"command": ["cdi-gen", "probe"]}
    assert readiness["timeoutSeconds"] >= 3
    env = {e["name"]: e.get("value") for e in container["env"]}
    socket = Path(env["CDI_GEN_PROBE_SOCKET"])
    mounts = {m["mountPath"]: m.get("name") for m in container["volumeMounts"]}
    volumes = {v.get("name"): v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts[str(socket.parent)]]
    # Room for the handover (HANDOVER_SECONDS) and the stop after it.
    assert spec["terminationGracePeriodSeconds"] > draplugin.HANDOVER_SECONDS + 5
