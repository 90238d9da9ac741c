"""The Helm chart (deploy/helm/cdi-gen), rendered by the pinned Helm 3 and Helm 4
(helm.py, built with the lanes by tests/cluster/setup.py): every test of the chart runs with both.

One source of truth: for the same settings the chart renders the objects deploy/kubernetes
renders (kubectl kustomize of the lane's kubectl), modulo Helm's standard labels and the
config checksum annotation, and its DeviceClasses are what ``cdi-gen deviceclasses`` prints for
the same config. A change to either side without the other fails here with the difference.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import subprocess
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from cdi_gen.cli.main import cli
from tests.conftest import REPO
from tests.unit.test_deploy_dra import assert_slice_policy

from .helm import helm
from .lane import CURRENT

CHART = REPO / "deploy" / "helm" / "cdi-gen"
KUSTOMIZE = REPO / "deploy" / "kubernetes"
RELEASE = "cdi-gen"
NAMESPACE = "kube-system"
#: What Helm's conventions (`helm create`) put on every object and deploy/kubernetes does not:
#: the chart, the release, the version and the manager. app.kubernetes.io/name is kept where
#: it selects (selector, pod template); on object metadata kustomize's ConfigMap and the
#: DeviceClasses `cdi-gen deviceclasses` prints carry no labels, so it is set aside there and
#: checked on its own (test_every_object_carries_the_release_labels).
STANDARD_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
}
NAME_LABEL = "app.kubernetes.io/name"
CHECKSUM = "checksum/config"

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # Helm's cache, config and data folders default to $HOME's: kept out of the machine's.
    home = tmp_path_factory.mktemp("helm-home")
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def _helm(
    major: str, args: Sequence[str], env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm(major)), *args], capture_output=True, text=True, env=dict(env), timeout=60,
        check=False,
    )  # fmt: skip


def _docs(text: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(text) if d]


class Chart:
    def __init__(self, major: str, env: Mapping[str, str], tmp: Path) -> None:
        self.major = major
        self.env = env
        self.tmp = tmp

    def run(
        self, values: Mapping[str, Any], release: str = RELEASE, namespace: str = NAMESPACE
    ) -> subprocess.CompletedProcess[str]:
        path = self.tmp / f"values-{len(list(self.tmp.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        return _helm(
            self.major,
            ["template", release, str(CHART), "--namespace", namespace, "-f", str(path)],
            self.env,
        )

    def render(
        self, values: Mapping[str, Any] | None = None, release: str = RELEASE,
        namespace: str = NAMESPACE,
    ) -> list[Obj]:  # fmt: skip
        proc = self.run(values or {}, release, namespace)
        assert proc.returncode == 0, proc.stderr
        return _docs(proc.stdout)

    def refuses(self, values: Mapping[str, Any]) -> str:
        proc = self.run(values)
        assert proc.returncode != 0, f"rendered {values}:\n{proc.stdout}"
        return proc.stderr


@pytest.fixture(params=["helm3", "helm4"])
def chart(request: pytest.FixtureRequest, helm_env: dict[str, str], tmp_path: Path) -> Chart:
    return Chart(request.param, helm_env, tmp_path)


def kustomize(folder: Path) -> list[Obj]:
    kubectl = CURRENT.binaries(allow_build=False).path("kubectl")
    proc = subprocess.run(
        [str(kubectl), "kustomize", str(folder)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return _docs(proc.stdout)


def _of(objects: Sequence[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def _daemonset(objects: Sequence[Obj]) -> Obj:
    (ds,) = _of(objects, "DaemonSet")
    return ds


def _agent(objects: Sequence[Obj]) -> Obj:
    (container,) = _daemonset(objects)["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def _env(objects: Sequence[Obj]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _agent(objects)["env"]}


def _strip(labels: dict[str, str], drop: set[str]) -> None:
    for key in drop & labels.keys():
        del labels[key]


def _normal(obj: Obj) -> Obj:
    """``obj`` without what only Helm adds, its named lists in name order (their order means
    nothing to the API server)."""
    obj = yaml.safe_load(yaml.safe_dump(obj))  # a deep copy
    meta = obj["metadata"]
    _strip(meta.get("labels", {}), STANDARD_LABELS | {NAME_LABEL})
    if not meta.get("labels"):
        meta.pop("labels", None)
    if obj["kind"] == "DaemonSet":
        spec = obj["spec"]
        _strip(spec["selector"]["matchLabels"], STANDARD_LABELS)
        template = spec["template"]
        _strip(template["metadata"]["labels"], STANDARD_LABELS)
        template["metadata"].get("annotations", {}).pop(CHECKSUM, None)
        if not template["metadata"].get("annotations", True):
            del template["metadata"]["annotations"]
        pod = template["spec"]
        pod["volumes"].sort(key=lambda v: v["name"])
        for container in pod["containers"]:
            container["env"].sort(key=lambda e: e["name"])
            container["volumeMounts"].sort(key=lambda m: m["mountPath"])
    return obj


def _by_name(objects: Sequence[Obj]) -> dict[str, Obj]:
    return {f"{o['kind']}/{o['metadata']['name']}": _normal(o) for o in objects}


def assert_same_objects(chart: Sequence[Obj], other: Sequence[Obj], other_name: str) -> None:
    ours, theirs = _by_name(chart), _by_name(other)
    problems = [f"only in the chart: {k}" for k in sorted(ours.keys() - theirs.keys())]
    problems += [f"only in {other_name}: {k}" for k in sorted(theirs.keys() - ours.keys())]
    for key in sorted(ours.keys() & theirs.keys()):
        if ours[key] != theirs[key]:
            diff = difflib.unified_diff(
                yaml.safe_dump(theirs[key]).splitlines(),
                yaml.safe_dump(ours[key]).splitlines(),
                f"{other_name}: {key}", f"chart: {key}", lineterm="",
            )  # fmt: skip
            problems.append("\n".join(diff))
    assert not problems, "\n".join(problems)


def _overlay(tmp: Path, resources: str, component: str) -> Path:
    """A kustomization of a user's own, as deploy/kubernetes/runtime-pin tells to write it."""
    (tmp / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(KUSTOMIZE / resources, tmp)],
                "components": [os.path.relpath(KUSTOMIZE / component, tmp)],
            }
        )
    )
    return tmp


def test_helm_lint_strict_passes_for_both_apis(chart: Chart) -> None:
    for args in (
        [],
        ["--set", "api=dra"],
        ["--set", "metrics.serviceMonitor.enabled=true"],
        ["--set", "follow.enabled=true"],
        ["--set", "restart.enabled=true"],
    ):
        proc = _helm(chart.major, ["lint", "--strict", str(CHART), *args], chart.env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    ("values", "folder"),
    [
        ({}, "base"),
        ({"api": "dra"}, "dra"),
        ({"cdiVersion": "runtime"}, "base+runtime-pin"),
        ({"api": "dra", "cdiVersion": "runtime"}, "dra+runtime-pin"),
        ({"follow": {"enabled": True}}, "base+when-back"),
        ({"api": "dra", "follow": {"enabled": True}}, "dra+when-back"),
        ({"restart": {"enabled": True}}, "base+when-back-restart"),
        ({"api": "dra", "restart": {"enabled": True}}, "dra+when-back-restart"),
    ],
    ids=[
        "devicePlugin",
        "dra",
        "devicePlugin-runtime-pin",
        "dra-runtime-pin",
        "devicePlugin-when-back",
        "dra-when-back",
        "devicePlugin-when-back-restart",
        "dra-when-back-restart",
    ],
)
def test_the_chart_renders_what_kustomize_renders(
    chart: Chart, kustomized: Callable[[str], list[Obj]], values: dict[str, str], folder: str
) -> None:
    assert_same_objects(chart.render(values), kustomized(folder), f"deploy/kubernetes/{folder}")


@pytest.fixture(scope="module")
def kustomized(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[Obj]]:
    """``kubectl kustomize`` of a folder (``base``) or of a folder with a component
    (``base+runtime-pin``), once per module: both Helm majors compare against the same."""

    @functools.cache
    def render(folder: str) -> list[Obj]:
        if "+" not in folder:
            return kustomize(KUSTOMIZE / folder)
        resources, component = folder.split("+")
        overlay = tmp_path_factory.mktemp("overlay")
        return kustomize(_overlay(overlay, resources, component))

    return render


CONFIGS = {
    "shipped": None,
    "no vendor": "classes:\n  - {name: kvm, match: {subsystem: misc, kernel: kvm}}\n"
    "  - {name: loop-2, match: {subsystem: block, kernel: 'loop*'}}\n",
    "own vendor": "vendor: devices.example.org\nclasses:\n"
    "  - {name: tun, match: {subsystem: misc, kernel: tun}, api: devicePlugin}\n"
    "  - {name: a1-b2, match: {subsystem: misc, kernel: kvm}, api: dra}\n",
    "no classes": "vendor: example.com\nclasses: []\n",
}


@pytest.mark.parametrize("driver", ["", "dra.example.net"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_device_classes_are_what_cdi_gen_deviceclasses_prints(
    chart: Chart, tmp_path: Path, name: str, driver: str
) -> None:
    config = CONFIGS[name]
    values: dict[str, Any] = {"api": "dra", "dra": {"driver": driver}}
    if config is not None:
        values["config"] = config
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config if config is not None else _values()["config"])
    argv = ["deviceclasses", "--config", str(config_file)]
    result = CliRunner().invoke(cli, [*argv, *(["--driver", driver] if driver else [])])
    assert result.exit_code == 0, result.output
    printed = _docs(result.output)
    rendered = _of(chart.render(values), "DeviceClass")
    assert [_normal(o) for o in rendered] == printed
    assert len(printed) == yaml.safe_load(config_file.read_text())["classes"].__len__()


def _values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())  # type: ignore[no-any-return]


def test_every_object_carries_the_release_labels(chart: Chart) -> None:
    """What `helm uninstall` and a by-label listing find: name and instance on every object."""
    values = {"api": "dra", "metrics": {"port": 9400, "serviceMonitor": {"enabled": True}}}
    objects = chart.render(values)
    assert {o["kind"] for o in objects} == {
        "ConfigMap", "DaemonSet", "ServiceAccount", "Role", "RoleBinding", "ClusterRole",
        "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
        "DeviceClass", "Service", "ServiceMonitor",
    }  # fmt: skip
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels[NAME_LABEL] == "cdi-gen", obj["metadata"]
        assert labels["app.kubernetes.io/instance"] == RELEASE, obj["metadata"]


@pytest.mark.parametrize("api", ["devicePlugin", "dra"])
@pytest.mark.parametrize(
    ("release", "values", "name"),
    [
        ("devices", {}, "devices-cdi-gen"),
        ("lab", {"fullnameOverride": "node-agent"}, "node-agent"),
    ],
    ids=["release-derived", "fullnameOverride"],
)
def test_the_agent_may_read_exactly_the_daemonset_it_names(
    chart: Chart, api: str, release: str, values: dict[str, str], name: str
) -> None:
    """The uninstall check at exit: the DaemonSet the agent asks about (CDI_GEN_DAEMONSET) is
    the chart's, under whatever name the release gives it, and the Role bound to the pod's
    ServiceAccount lets it read that one, in the release's namespace (the agent's namespace
    comes from the downward API)."""
    objects = chart.render({"api": api, **values}, release, "devices-ns")
    ds = _daemonset(objects)
    pod = ds["spec"]["template"]["spec"]
    env = _env(objects)
    assert ds["metadata"]["name"] == name
    assert env["CDI_GEN_DAEMONSET"] == name
    assert env["CDI_GEN_DAEMONSET_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    (account,) = _of(objects, "ServiceAccount")
    assert (account["metadata"]["name"], account["metadata"]["namespace"]) == (name, "devices-ns")
    assert pod["serviceAccountName"] == name
    (role,) = _of(objects, "Role")
    assert role["metadata"]["namespace"] == "devices-ns"
    assert role["rules"] == [
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": [name],
         "verbs": ["get"]},
    ]  # fmt: skip
    (binding,) = _of(objects, "RoleBinding")
    assert binding["metadata"]["namespace"] == "devices-ns"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]
    }  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": name, "namespace": "devices-ns"}
    ]
    bindings = _of(objects, "ClusterRoleBinding")
    assert [b["subjects"] for b in bindings] == (
        [[{"kind": "ServiceAccount", "name": name, "namespace": "devices-ns"}]]
        if api == "dra"
        else []
    )


@pytest.mark.parametrize(
    ("release", "values", "name"),
    [
        ("devices", {}, "devices-cdi-gen"),
        ("lab", {"fullnameOverride": "node-agent"}, "node-agent"),
    ],
    ids=["release-derived", "fullnameOverride"],
)
def test_the_slice_policy_judges_the_releases_agent_only_in_dra_mode(
    chart: Chart, release: str, values: dict[str, str], name: str
) -> None:
    """The policy names the ServiceAccount the DaemonSet's pods run as, in the release's
    namespace (a policy naming another account would judge nobody); with device plugins
    the agent writes no slice, so there is none."""
    objects = chart.render({"api": "dra", **values}, release, "devices-ns")
    account = _daemonset(objects)["spec"]["template"]["spec"]["serviceAccountName"]
    assert account == name
    assert assert_slice_policy(objects, "devices-ns", account) == f"{name}-slices"
    plugins = chart.render({"api": "devicePlugin", **values}, release, "devices-ns")
    assert not {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} & {
        o["kind"] for o in plugins
    }


def test_a_changed_config_changes_the_pod_template(chart: Chart) -> None:
    """`helm upgrade` with another config rolls the DaemonSet: the checksum is the config's."""
    shipped = _values()["config"]
    added = shipped + "  - name: tun\n    match: {subsystem: misc, kernel: tun}\n"

    def checksum(config: str) -> str:
        ds = _daemonset(chart.render({"config": config}))
        return ds["spec"]["template"]["metadata"]["annotations"][CHECKSUM]  # type: ignore[no-any-return]

    assert checksum(shipped) == hashlib.sha256(shipped.encode()).hexdigest()
    assert checksum(added) == hashlib.sha256(added.encode()).hexdigest()
    (cm,) = _of(chart.render({"config": added}), "ConfigMap")
    assert cm["data"]["config.yaml"] == added


def test_an_existing_configmap_replaces_the_charts_own(chart: Chart) -> None:
    values = {"api": "dra", "existingConfigMap": {"name": "site-devices", "key": "agent.yaml"}}
    objects = chart.render(values)
    assert not _of(objects, "ConfigMap")
    # `helm template` reaches no API server: the ConfigMap cannot be read, so no DeviceClass.
    assert not _of(objects, "DeviceClass")
    pod = _daemonset(objects)["spec"]["template"]["spec"]
    assert {"name": "config", "configMap": {"name": "site-devices"}} in pod["volumes"]
    assert _env(objects)["CDI_GEN_CONFIG"] == "/etc/cdi-gen/agent.yaml"


def test_values_reach_the_daemonset(chart: Chart) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "fpga", "operator": "Exists"}]}]
            }
        }
    }
    resources = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
    values = {
        "image": {
            "repository": "registry.example.com/cdi-gen",
            "tag": "9.9",
            "pullPolicy": "Always",
        },
        "resources": resources,
        "nodeSelector": {"devices": "yes"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "fpga"}],
        "affinity": affinity,
        "priorityClassName": "site-critical",
        "metrics": {"port": 9500},
        "logFormat": "text",
        "logLevel": "debug",
        "cdiVersion": "runtime",
        "runtime": "containerd@2.3.7",
    }
    objects = chart.render(values)
    pod = _daemonset(objects)["spec"]["template"]["spec"]
    agent = _agent(objects)
    assert agent["image"] == "registry.example.com/cdi-gen:9.9"
    assert agent["imagePullPolicy"] == "Always"
    assert agent["resources"] == resources
    assert agent["ports"] == [{"name": "metrics", "containerPort": 9500, "protocol": "TCP"}]
    assert pod["nodeSelector"] == {"devices": "yes"}
    assert pod["tolerations"] == values["tolerations"]
    assert pod["affinity"] == affinity
    assert pod["priorityClassName"] == "site-critical"
    env = _env(objects)
    assert env["CDI_GEN_METRICS_ADDRESS"] == "0.0.0.0:9500"
    assert (env["CDI_GEN_LOG_FORMAT"], env["CDI_GEN_LOG_LEVEL"]) == ("text", "debug")
    assert (env["CDI_GEN_CDI_VERSION"], env["CDI_GEN_RUNTIME"]) == ("runtime", "containerd@2.3.7")
    # The runtime named: no CRI socket needs to be reachable from the pod.
    assert not {"containerd-run", "crio-run"} & {v["name"] for v in pod["volumes"]}


def test_the_service_monitor_is_off_by_default_and_scrapes_the_metrics_port(chart: Chart) -> None:
    assert not _of(chart.render(), "ServiceMonitor")
    objects = chart.render(
        {"metrics": {"port": 9500, "serviceMonitor": {"enabled": True, "labels": {"k": "v"}}}}
    )
    (service,) = _of(objects, "Service")
    (monitor,) = _of(objects, "ServiceMonitor")
    assert service["spec"]["ports"][0]["port"] == 9500
    assert service["spec"]["selector"] == _daemonset(objects)["spec"]["selector"]["matchLabels"]
    assert monitor["metadata"]["labels"]["k"] == "v"
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"api": "grpc"}, "at '/api': value must be one of 'devicePlugin', 'dra'"),
        ({"apii": "dra"}, "at '': additional properties 'apii' not allowed"),
        ({"logFormat": "xml"}, "at '/logFormat': value must be one of 'text', 'json'"),
        ({"metrics": {"port": 0}}, "at '/metrics/port': minimum: got 0, want 1"),
        ({"cdiVersion": "1.0"}, "at '/cdiVersion': '1.0' does not match pattern"),
        ({"dra": {"driver": "Example_Com"}}, "at '/dra/driver': 'Example_Com' does not match"),
        ({"image": {"repository": ""}}, "at '/image/repository': minLength: got 0, want 1"),
        ({"resources": {"request": {}}}, "at '/resources': additional properties 'request' not"),
    ],
    ids=["api", "unknown key", "logFormat", "port", "cdiVersion", "driver", "image", "resources"],
)
def test_the_schema_refuses_a_wrong_value_naming_it(
    chart: Chart, values: dict[str, Any], message: str
) -> None:
    error = chart.refuses(values)
    assert "values don't meet the specifications of the schema(s)" in error, error
    assert message in error, error


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"config": "vendor: example.com\nclasses:\n  - {name: kvm, match: {}, api: dra}\n"},
            'config: classes[0].api: class "kvm" says dra but the chart\'s api is devicePlugin',
        ),
        (
            {"api": "dra", "config": "classes:\n  - {name: Fpga_0, match: {}}\n"},
            "config: classes[0].name: class \"Fpga_0\" is not a DNS label without '--'",
        ),
        (
            {
                "api": "dra",
                "config": "vendor: a-very-long-vendor-name.with.many.labels."
                "example.com.example.org\nclasses: []\n",
            },
            'dra.driver: DRA driver name "a-very-long-vendor-name.with.many.labels.example',
        ),
        ({"config": "- just\n- a list\n"}, "config: not a YAML mapping:"),
    ],
    ids=["dra class under devicePlugin", "class not a label", "long driver", "not a mapping"],
)
def test_the_chart_refuses_a_config_it_cannot_serve_naming_it(
    chart: Chart, values: dict[str, Any], message: str
) -> None:
    error = chart.refuses(values)
    assert message in error, error


def _versions() -> Iterator[tuple[str, str]]:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    yield "deploy/helm/cdi-gen/Chart.yaml appVersion", chart["appVersion"]
    base = yaml.safe_load((KUSTOMIZE / "base" / "kustomization.yaml").read_text())
    yield "deploy/kubernetes/base images newTag", base["images"][0]["newTag"]
    for line in (REPO / "deploy" / "Containerfile").read_text().splitlines():
        if line.startswith("ARG VERSION="):
            yield "deploy/Containerfile ARG VERSION", line.split("=", 1)[1]


def test_the_chart_image_and_manifests_name_the_package_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    found = dict(_versions())
    assert len(found) == 3, found
    assert found == dict.fromkeys(found, version)
