"""The Helm chart on the real node: ``helm install`` of deploy/helm/cdi-gen with the agent
image of this checkout serves pods (device plugin) and a claim (DRA); ``helm upgrade`` adding
a class rolls the agent by itself (the config checksum on the pod template); ``helm
uninstall`` leaves no object of the release in the API server, and on the node what README
("Install") says: no spec file or owner record of ours, nothing of the agent's sockets, and
(DRA) no ResourceSlice of the driver. With ``existingConfigMap`` the chart reads the site's
ConfigMap at install and upgrade (DeviceClasses, checksum).

``helm uninstall`` deletes the DaemonSet first, then its RBAC and, last, its ServiceAccount
(Helm's uninstall order by kind); each agent, at SIGTERM, asks about its DaemonSet and hears
404, or 401/403 once the account or its Role went, and removes its spec files before its pod
is gone. The slices are deleted by the DRA agent where the API server still lets it, else by
the kubelet 30 s after the plugin went (test_uninstall.py's docstring): the test waits (up to
120 s) until none is left, whoever deleted them.

Helm is the pinned build (tests/cluster/helm.py), talking to the cluster as its admin. The
values change only what a test on this machine must (as daemonset.py's overlays do): the
image (imported, ``pullPolicy: Never``), a config of loop devices, a free metrics port, and
the API server's address (no kube-proxy routes the ``kubernetes`` Service here; the agent
asks the API server about its DaemonSet at exit, and through DRA all along).
"""

from __future__ import annotations

import subprocess
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from loopdev import LoopDevices
from ports import free_port

from tests.waiting import until_sync

from .agent import DRIVER, VENDOR
from .claims import Claims, allocated_devices, device_attribute
from .cluster import NODE_NAME, Cluster
from .conftest import _TEST_LOGS, _wait_nothing_allocatable, wait_capacity
from .daemonset import NAMESPACE, loop_fpga_config
from .helm import helm
from .image import REPO, AgentImage
from .pods import Pods
from .test_daemonset import agent_pods, diagnostics, http_status, wait_agent_ready
from .test_uninstall import AgentLogs

# A cold agent image build takes minutes (see image.py); each scenario well under one.
pytestmark = pytest.mark.timeout(900)

CHART = REPO / "deploy" / "helm" / "cdi-gen"
RELEASE = "cdi-gen"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
#: What the release may create, as API collections: none may hold an object of it afterwards.
COLLECTIONS = (
    f"/api/v1/namespaces/{NAMESPACE}/configmaps",
    f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings",
    f"/api/v1/namespaces/{NAMESPACE}/services",
    f"/api/v1/namespaces/{NAMESPACE}/pods",
    f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets",
    f"/apis/apps/v1/namespaces/{NAMESPACE}/controllerrevisions",
    "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "/apis/resource.k8s.io/v1/deviceclasses",
)


class Helm:
    """The pinned helm against the test cluster; its folders under the test's tmp_path."""

    def __init__(self, cluster: Cluster, home: Path) -> None:
        self.cluster = cluster
        self.home = home

    def __call__(self, *args: str, timeout: float = 180) -> str:
        env = {
            "PATH": "/usr/bin:/bin",
            # The API discovery cache goes to $HOME/.kube/cache (to the working folder when
            # HOME is unset): kept with the test's files.
            "HOME": str(self.home),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        argv = [str(helm()), "--kubeconfig", str(self.cluster.admin_kubeconfig), *args]
        proc = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
        return proc.stdout

    def values(self, name: str, values: dict[str, Any]) -> str:
        path = self.home / f"{name}.yaml"
        path.write_text(yaml.safe_dump(values, sort_keys=False))
        return str(path)


def chart_values(
    cluster: Cluster, image: AgentImage, config: dict[str, Any], port: int
) -> dict[str, Any]:
    assert cluster.api is not None
    repository, tag = image.name.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "config": yaml.safe_dump(config, sort_keys=False),
        "metrics": {"port": port},
        "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(cluster.api.port)},
        ],
    }


def _release_objects(cluster: Cluster) -> list[str]:
    assert cluster.api is not None
    found = []
    for collection in COLLECTIONS:
        query = urllib.parse.urlencode({"labelSelector": INSTANCE})
        for item in cluster.api.get(f"{collection}?{query}")["items"]:
            found.append(f"{collection}/{item['metadata']['name']}")
    # Helm's own record of the release (a Secret per revision).
    query = urllib.parse.urlencode({"labelSelector": f"owner=helm,name={RELEASE}"})
    for item in cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets?{query}")["items"]:
        found.append(f"secret {item['metadata']['name']}")
    return found


def _agent_sockets(cluster: Cluster) -> list[str]:
    """Sockets of ours in the kubelet's folders: the device plugins' (<vendor>-<class>.sock),
    the DRA registration (<driver>-reg.sock) and the DRA service (<driver>/dra.sock)."""
    folders = (cluster.device_plugin_dir, cluster.plugins_registry_dir, cluster.kubelet_plugins_dir)
    return sorted(
        str(p)
        for folder in folders
        for p in folder.rglob("*.sock")
        if p.name.startswith(f"{DRIVER}-") or p.parent.name == DRIVER
    )


def _specs(cluster: Cluster) -> set[str]:
    return {p.name for p in cluster.cdi_run.glob("*.json")}


def _ours(cluster: Cluster) -> list[str]:
    """Our spec files and their owner records (``.<spec><OWNER_SUFFIX>``) in /var/run/cdi."""
    return sorted(
        p.name for p in cluster.cdi_run.iterdir() if p.name.lstrip(".").startswith(f"{VENDOR}-")
    )


def _uninstall(release: Helm, cluster: Cluster) -> None:
    """``helm uninstall --wait`` with the agent's last lines followed: it logged an uninstall
    (not "spec files kept"); once its pod is gone, nothing of the release is in the API server
    and none of our files on the node (bounded: the agent removes them within its grace
    period)."""
    names = [p["metadata"]["name"] for p in agent_pods(cluster)]
    logs = AgentLogs(cluster)
    try:
        logs.following(names)
        release("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        until_sync(lambda: not agent_pods(cluster), "the agent pod gone after uninstall", 60)
        said = [m for _, m in logs.messages()]
    finally:
        logs.stop()
    # For the report (pytest -rA): which answer the agent got.
    print("agent at uninstall:", [m for m in said if m.startswith(("uninstall", "spec files"))])
    assert [m for m in said if m.startswith("uninstall: ")], said[-20:]
    assert not [m for m in said if m.startswith("spec files kept")], said[-20:]
    assert not _release_objects(cluster)
    until_sync(
        lambda: not _ours(cluster),
        "no spec file or owner record of ours left after helm uninstall",
        30,
        observe=lambda: _ours(cluster),
    )
    assert not _agent_sockets(cluster)


@pytest.fixture
def release(cluster: Cluster, agent_image: AgentImage, tmp_path: Path) -> Iterator[Helm]:
    """Helm for one release, ``cdi-gen`` in kube-system; uninstalled at the end if a test
    left it installed, and whatever a failed test left in /var/run/cdi removed for the next."""
    cluster.import_image(agent_image.archive)
    runner = Helm(cluster, tmp_path / "helm")
    runner.home.mkdir()
    _TEST_LOGS.append(("Helm release (kubectl)", lambda: diagnostics(cluster)))
    try:
        yield runner
    finally:
        _TEST_LOGS.clear()
        runner("uninstall", RELEASE, "--namespace", NAMESPACE, "--ignore-not-found", "--wait")
        until_sync(lambda: not agent_pods(cluster), "the release's agent pod gone", 60)
        for spec in cluster.cdi_run.glob("*"):
            spec.unlink()


def _wait_no_slices(claims: Claims) -> None:
    """The node's slices are the Node's (owner reference), not the release's: deleted by the
    agent at its uninstall, or by the kubelet 30 s after the plugin went for good."""
    until_sync(
        lambda: not claims.slices(DRIVER),
        "no ResourceSlice of the uninstalled driver left",
        120,
        every=1,
        observe=lambda: [s["metadata"]["name"] for s in claims.slices(DRIVER)],
    )


def _rolled(cluster: Cluster, old_uid: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        pods = agent_pods(cluster)
        if len(pods) != 1 or pods[0]["metadata"]["uid"] == old_uid:
            return None
        try:
            return wait_agent_ready(cluster, timeout=0)
        except TimeoutError:
            return None

    return check


def test_helm_install_serves_pods_upgrade_adds_a_class_uninstall_leaves_nothing(
    cluster: Cluster, loops: LoopDevices, pods: Pods, release: Helm, agent_image: AgentImage
) -> None:
    devices = [loops.add(), loops.add()]
    port = free_port()
    config = loop_fpga_config([devices[0].name], dfl_path=False)
    values = chart_values(cluster, agent_image, config, port)
    out = release("install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                  "-f", release.values("install", values))  # fmt: skip
    assert "STATUS: deployed" in out, out

    pod = wait_agent_ready(cluster)
    assert pod["spec"]["containers"][0]["image"] == agent_image.name
    assert http_status(f"http://127.0.0.1:{port}/readyz") == 200
    wait_capacity(cluster, "example.com/fpga", 1, timeout=60)
    pods.create("fpga-consumer", {"example.com/fpga": 1})
    pods.wait_running("fpga-consumer")
    seen = pods.seen("fpga-consumer")
    assert list(seen.devices) == [str(devices[0].path)], seen
    assert seen.env == {"FPGA_DEVICE": f"fpga-{devices[0].number}"}

    # A class added to the config: `helm upgrade` alone brings it to the node.
    config["classes"].append(
        {"name": "scratch",
         "match": {"subsystem": "block", "kernel": devices[1].name,
                   "properties": {"DEVTYPE": "disk"}}}
    )  # fmt: skip
    values = chart_values(cluster, agent_image, config, port)
    out = release("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
                  "-f", release.values("upgrade", values))  # fmt: skip
    assert "REVISION: 2" in out, out
    until_sync(
        _rolled(cluster, pod["metadata"]["uid"]),
        "a new agent pod, Ready, after helm upgrade",
        120,
        every=0.5,
        observe=lambda: [p.get("status") for p in agent_pods(cluster)],
    )
    wait_capacity(cluster, "example.com/scratch", 1, timeout=60)
    wait_capacity(cluster, "example.com/fpga", 1, timeout=60)
    pods.create("scratch-consumer", {"example.com/scratch": 1}, env="SCRATCH")
    pods.wait_running("scratch-consumer")
    assert list(pods.seen("scratch-consumer").devices) == [str(devices[1].path)]

    assert {f"{VENDOR}-fpga.json", f"{VENDOR}-scratch.json"} <= _specs(cluster)
    pods.delete_all()
    # On the node, as README says: the agent saw its DaemonSet gone and took its spec files
    # with it, its sockets went with it, and no device stays allocatable.
    _uninstall(release, cluster)
    _wait_nothing_allocatable(cluster)


def test_helm_install_with_dra_serves_a_claim_and_uninstall_leaves_nothing(
    cluster: Cluster, loops: LoopDevices, claims: Claims, release: Helm, agent_image: AgentImage
) -> None:
    device = loops.add()
    port = free_port()
    values = {
        **chart_values(cluster, agent_image, loop_fpga_config([device.name], dfl_path=False), port),
        "api": "dra",
    }
    out = release("install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                  "-f", release.values("install", values))  # fmt: skip
    assert "STATUS: deployed" in out, out
    pod = wait_agent_ready(cluster)
    assert pod["spec"]["serviceAccountName"] == RELEASE
    assert http_status(f"http://127.0.0.1:{port}/readyz") == 200
    cdi = f"example.com/fpga=fpga-{device.number}"
    claims.wait_devices(
        DRIVER,
        lambda found: any(device_attribute(d, DRIVER, "cdiName") == cdi for d in found.values()),
        f"{cdi} published by the chart's agent",
        timeout=60,
    )

    # The chart's DeviceClass, by the name `cdi-gen deviceclasses` gives it.
    claims.claim("fpga-claim", f"fpga.{DRIVER}")
    claims.pod_with_claim("fpga-consumer", "fpga-claim")
    claims.pods.wait_running("fpga-consumer")
    seen = claims.pods.seen("fpga-consumer")
    assert list(seen.devices) == [str(device.path)], seen
    assert seen.env == {"FPGA_DEVICE": f"fpga-{device.number}"}
    claim = claims.get_claim("fpga-claim")
    assert claim is not None
    (result,) = allocated_devices(claim)
    assert (result["driver"], result["pool"]) == (DRIVER, NODE_NAME)

    assert f"{VENDOR}-fpga.json" in _specs(cluster)
    claims.pods.delete_all()
    claims.delete_all()
    _uninstall(release, cluster)
    _wait_no_slices(claims)


def test_helm_with_an_existing_configmap_reads_it_at_install_and_at_upgrade(
    cluster: Cluster, loops: LoopDevices, claims: Claims, release: Helm, agent_image: AgentImage
) -> None:
    """`existingConfigMap`: the chart reads the site's ConfigMap from the API server (Helm's
    lookup) for the DeviceClasses and the checksum, so after editing it `helm upgrade` alone
    rolls the agent and adds the new class's DeviceClass, as README says."""
    devices = [loops.add(), loops.add()]
    assert cluster.api is not None
    api = cluster.api
    configmaps = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    config = loop_fpga_config([devices[0].name], dfl_path=False)

    def site_configmap() -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "site-devices", "namespace": NAMESPACE},
            "data": {"agent.yaml": yaml.safe_dump(config, sort_keys=False)},
        }

    api.create(configmaps, site_configmap())
    try:
        values = {
            **chart_values(cluster, agent_image, config, free_port()),
            "api": "dra",
            "existingConfigMap": {"name": "site-devices", "key": "agent.yaml"},
        }
        del values["config"]
        release("install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "-f", release.values("install", values))  # fmt: skip
        pod = wait_agent_ready(cluster)
        classes = "/apis/resource.k8s.io/v1/deviceclasses"
        assert api.get_or_none(f"{classes}/fpga.{DRIVER}") is not None
        assert api.get_or_none(f"{configmaps}/cdi-gen-config") is None

        config["classes"].append(
            {"name": "scratch",
             "match": {"subsystem": "block", "kernel": devices[1].name,
                       "properties": {"DEVTYPE": "disk"}}}
        )  # fmt: skip
        api.request("PUT", f"{configmaps}/site-devices", site_configmap())
        release("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values")
        until_sync(
            _rolled(cluster, pod["metadata"]["uid"]),
            "a new agent pod, Ready, after helm upgrade",
            120,
            every=0.5,
            observe=lambda: [p.get("status") for p in agent_pods(cluster)],
        )
        scratch = api.get_or_none(f"{classes}/scratch.{DRIVER}")
        assert scratch is not None
        assert scratch["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        claims.wait_devices(
            DRIVER,
            lambda found: any(
                device_attribute(d, DRIVER, "class") == "scratch" for d in found.values()
            ),
            "the added class's device published",
            timeout=60,
        )

        _uninstall(release, cluster)
        _wait_no_slices(claims)
    finally:
        api.delete(f"{configmaps}/site-devices")
