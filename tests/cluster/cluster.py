"""A Kubernetes cluster of real components, started and stopped as one object.

Control plane on 127.0.0.1 (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) in the
host's namespaces; per node (one by default, ``node_count=3`` for the several-node scenarios) a
CRI runtime with CDI on (containerd, or CRI-O in the crio lane: ``crio.py``) and a kubelet
inside the node's own private mount namespace (``namespace.py``), each node with its own name,
folder, kubelet ports and pod subnet. Which releases, which runtime and config and which feature
gates come from the cluster's :class:`~cluster.lane.Lane`. Every port is picked free at start
and every file lives in one short work folder under /tmp (the first node's files too; each
other node has a subfolder), so several sessions can run side by side. ``stop()`` undoes
everything whatever state the start reached, and reports what it could not undo.
``node_count=0`` starts the control plane alone (benchmarks/fleet.py has kwok fake its Nodes);
``apiserver_only`` only etcd and kube-apiserver: an API server of other feature gates beside the
lane's cluster, for what it keeps of the objects it is sent (test_dra_counters_dropped.py).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import random
import re
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from containerd.daemon import Containerd, DaemonError, remove_work
from containerd.image import IMAGE_NAME, build_archive
from pki import Authority, Pair, kubeconfig
from ports import free_port

from .api import Api
from .build import Binaries
from .crio import Crio, CrioError
from .lane import Lane
from .namespace import NodeNamespace
from .process import Component, ComponentError

NODE_NAME = "cdi-gen-node"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
#: Debian's containernetworking-plugins; containerd sets up each pod's ``lo`` with loopback,
#: its ``eth0`` with ptp and host-local (see _cni).
CNI_BIN = Path("/usr/lib/cni")
CNI_PLUGINS = ("loopback", "ptp", "host-local")
#: How often the kubelet recomputes its Node status; a changed allocatable reaches the API at
#: the next tick. The kubelet's default is 10 s; 1 s keeps the tests short.
NODE_STATUS_SECONDS = 1
#: How often the kubelet syncs every pod again (see kubelet_config): its default is 1 min.
SYNC_SECONDS = 10


def _routed_networks() -> list[ipaddress.IPv4Network]:
    networks = []
    with open("/proc/net/route") as f:
        next(f)
        for line in f:
            fields = line.split()
            # Destination and mask are little-endian hex.
            dest, mask = (socket.inet_ntoa(bytes.fromhex(h)[::-1]) for h in (fields[1], fields[7]))
            networks.append(ipaddress.IPv4Network(f"{dest}/{mask}", strict=False))
    return networks


def _free_pod_subnet(taken: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A /24 in 10.244.0.0/16 that no route of the host (nor another cluster's pod) uses, nor
    one in ``taken`` (another node's of this cluster, which has no route before its first
    pod)."""
    routed = [n for n in _routed_networks() if n.prefixlen > 0]  # not the default route
    routed += taken
    candidates = list(ipaddress.IPv4Network("10.244.0.0/16").subnets(new_prefix=24))
    random.shuffle(candidates)
    for subnet in candidates:
        if not any(subnet.overlaps(n) for n in routed):
            return subnet
    raise ComponentError("no free /24 in 10.244.0.0/16 for the pod network")


def host_ip() -> str:
    """The address of the default route's interface: the kubelet refuses a loopback node IP."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))  # no packet is sent for a UDP connect
        except OSError as exc:
            raise ComponentError(f"no IPv4 default route for the node's address: {exc}") from exc
        address: str = s.getsockname()[0]
        return address


#: A node's CRI runtime: both start, stop, import an image, and name their socket, log and the
#: cgroup parent the kubelet is given.
NodeRuntime = Containerd | Crio


def _https_ok(port: int, path: str = "/healthz") -> bool:
    context = ssl.create_default_context()
    # The scheduler's and controller-manager's serving certificates are self-signed; this
    # only asks whether they answer.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}{path}", context=context, timeout=2
        ) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@dataclass
class Node:
    """One node: its name, folder, kubelet ports and pod subnet; its mount namespace,
    runtime and kubelet once started."""

    name: str
    work: Path
    #: Suffix of its certificates, kubeconfig and kubelet component ("" for the first node).
    suffix: str
    ports: dict[str, int] = field(default_factory=dict)
    namespace: NodeNamespace | None = None
    runtime: NodeRuntime | None = None
    kubelet: Component | None = None
    #: Addresses of pods without hostNetwork (chosen free at start).
    pod_subnet: ipaddress.IPv4Network | None = None

    @property
    def containerd(self) -> Containerd | None:
        """The node's runtime when it is a containerd (its config, ``ctr``)."""
        return self.runtime if isinstance(self.runtime, Containerd) else None

    @property
    def device_plugin_dir(self) -> Path:
        assert self.namespace is not None
        return self.namespace.device_plugin_dir

    @property
    def kubelet_dir(self) -> Path:
        assert self.namespace is not None
        return self.namespace.kubelet_dir

    @property
    def cdi_run(self) -> Path:
        assert self.namespace is not None
        return self.namespace.cdi_run

    @property
    def cdi_etc(self) -> Path:
        assert self.namespace is not None
        return self.namespace.cdi_etc


@dataclass
class Cluster:
    binaries: Binaries
    etcd_root: Path
    #: The lane's runtime binaries (``Lane.runtime_root``): containerd's or CRI-O's.
    runtime_root: Path
    lane: Lane
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(dir="/tmp", prefix="cgk")))
    #: How many nodes (kubelet + runtime + mount namespace each) join the control plane;
    #: 0 starts the control plane alone.
    node_count: int = 1
    #: ``--kube-api-qps`` and ``--kube-api-burst`` of the scheduler and the controller-manager
    #: (0: their defaults, 50 and 20 QPS); the fleet benchmark sets what scale tests use.
    client_qps: int = 0
    #: etcd and kube-apiserver alone, no controllers and no nodes (``node_count`` must be 0).
    apiserver_only: bool = False
    components: dict[str, Component] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    api: Api | None = None
    node_ip: str = ""
    ports: dict[str, int] = field(default_factory=dict)
    #: Seconds per start-up step, in order (for the benchmark and the report).
    timings: dict[str, float] = field(default_factory=dict)

    # ----- the first node (the single-node scenarios use only it) -------------------------

    @property
    def namespace(self) -> NodeNamespace | None:
        return self.nodes[0].namespace if self.nodes else None

    @property
    def containerd(self) -> Containerd | None:
        return self.nodes[0].containerd if self.nodes else None

    @property
    def runtime(self) -> NodeRuntime | None:
        return self.nodes[0].runtime if self.nodes else None

    @property
    def pod_subnet(self) -> ipaddress.IPv4Network | None:
        return self.nodes[0].pod_subnet if self.nodes else None

    # ----- paths ---------------------------------------------------------------------------

    @property
    def pki(self) -> Path:
        return self.work / "pki"

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.work / "admin.kubeconfig"

    @property
    def device_plugin_dir(self) -> Path:
        assert self.namespace is not None
        return self.namespace.device_plugin_dir

    @property
    def node_name(self) -> str:
        return NODE_NAME

    @property
    def kubelet_dir(self) -> Path:
        """The kubelet's root folder (/var/lib/kubelet inside the node) as seen from the host."""
        assert self.namespace is not None
        return self.namespace.kubelet_dir

    @property
    def plugins_registry_dir(self) -> Path:
        """The kubelet's plugin watcher folder, where a DRA driver puts its registration
        socket. The path is the same inside the node (the namespace only binds folders over
        /var/lib and /var/log; /tmp is shared), so a socket path under it, or under
        ``kubelet_plugins_dir``, is one the kubelet can dial as it is."""
        assert self.namespace is not None
        return self.namespace.plugins_registry_dir

    @property
    def kubelet_plugins_dir(self) -> Path:
        """The kubelet's plugins folder: a DRA driver serves ``<driver>/dra.sock`` in it."""
        assert self.namespace is not None
        return self.namespace.kubelet_plugins_dir

    @property
    def cdi_etc(self) -> Path:
        assert self.namespace is not None
        return self.namespace.cdi_etc

    @property
    def cdi_run(self) -> Path:
        """/var/run/cdi of the node: the dynamic spec folder the runtime reads last."""
        assert self.namespace is not None
        return self.namespace.cdi_run

    # ----- start ---------------------------------------------------------------------------

    def start(self) -> None:
        """Everything up to a Ready Node (or, without nodes, a control plane that takes pods);
        on failure the caller still calls ``stop()``."""
        started = time.monotonic()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.node_ip = host_ip()
        for name in ("etcd", "etcd-peer", "apiserver", "scheduler", "controller-manager"):
            self.ports[name] = free_port()
        for i in range(self.node_count):
            # The first node is the cluster's folder itself, as before there were several; the
            # others' folder names stay unique on the machine (containerd's cgroup parent is
            # named after its folder).
            work = self.work if i == 0 else self.work / f"{self.work.name}n{i}"
            name = NODE_NAME if i == 0 else f"{NODE_NAME}-{i}"
            node = Node(name, work, "" if i == 0 else f"-{i}")
            node.ports = {"kubelet": free_port(), "kubelet-healthz": free_port()}
            self.nodes.append(node)
        if self.nodes:
            # The first node's ports keep their names for whoever reads them.
            self.ports.update(self.nodes[0].ports)
        step = time.monotonic()
        certs = self._certificates()
        self._timed("certificates", step)
        self._start_etcd()
        self._start_apiserver(certs)
        if self.apiserver_only:
            assert not self.nodes, "an API server alone has no nodes"
            self.timings["total"] = time.monotonic() - started
            return
        self._start_controllers()
        self._start_nodes(certs)
        self.timings["total"] = time.monotonic() - started

    def _gate_flags(self) -> list[str]:
        """``--feature-gates`` of the lane; none at all when it sets none."""
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in self.lane.feature_gates.items())
        return ["--feature-gates", gates] if gates else []

    def _timed(self, name: str, since: float) -> None:
        self.timings[name] = time.monotonic() - since

    def _certificates(self) -> dict[str, Pair]:
        ca = Authority(self.pki)
        self.ca = ca
        server = f"https://127.0.0.1:{self.ports['apiserver']}"
        certs = {
            "apiserver": ca.issue(
                "apiserver", "kube-apiserver",
                dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                     "kubernetes.default.svc.cluster.local"),
                ips=("127.0.0.1", self.node_ip, SERVICE_IP),
                server=True,
            ),
            "apiserver-kubelet": ca.issue(
                "apiserver-kubelet", "kube-apiserver-kubelet-client",
                orgs=("system:masters",), client=True,
            ),
            "admin": ca.issue("admin", "cdi-gen-test-admin", orgs=("system:masters",), client=True),
            "scheduler": ca.issue("scheduler", "system:kube-scheduler", client=True),
            "controller-manager": ca.issue(
                "controller-manager", "system:kube-controller-manager", client=True
            ),
            "service-accounts": ca.service_account_keys(),
        }  # fmt: skip
        for user in ("admin", "scheduler", "controller-manager"):
            kubeconfig(self.work / f"{user}.kubeconfig", server, ca.cert, certs[user], user)
        for node in self.nodes:
            # Each kubelet its own identity: the Node authorizer and NodeRestriction let it
            # touch only its own Node and its own pods.
            client, serving = f"kubelet{node.suffix}", f"kubelet-serving{node.suffix}"
            certs[client] = ca.issue(
                client, f"system:node:{node.name}", orgs=("system:nodes",), client=True
            )
            certs[serving] = ca.issue(
                serving, node.name, dns=(node.name,), ips=(self.node_ip,), server=True
            )
            node.work.mkdir(parents=True, exist_ok=True)
            kubeconfig(node.work / "kubelet.kubeconfig", server, ca.cert, certs[client], "kubelet")
        self.api = Api("127.0.0.1", self.ports["apiserver"], ca.cert, *_pair(certs["admin"]))
        return certs

    def _component(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> Component:
        component = Component(name, argv, self.logs / f"{name}.log", env or {})
        self.components[name] = component
        return component

    def _start_etcd(self) -> None:
        step = time.monotonic()
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        etcd = self._component(
            "etcd",
            [
                str(self.etcd_root / "usr/bin/etcd"),
                "--name", "node",
                "--data-dir", str(self.work / "etcd"),
                "--listen-client-urls", client,
                "--advertise-client-urls", client,
                "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"node={peer}",
                # A throwaway store: fsync only slows every write of the tests down.
                "--unsafe-no-fsync",
                "--log-level", "warn",
            ],
        )  # fmt: skip
        etcd.start()
        etcd.wait_ready(lambda: _http_ok(f"{client}/health"), 30, step)
        self._timed("etcd", step)

    def _start_apiserver(self, certs: dict[str, Pair]) -> None:
        step = time.monotonic()
        api = self._component(
            "kube-apiserver",
            [
                str(self.binaries.path("kube-apiserver")),
                "--bind-address", "127.0.0.1",
                "--secure-port", str(self.ports["apiserver"]),
                # Advertised in the "kubernetes" Endpoints, where loopback is not allowed.
                "--advertise-address", self.node_ip,
                "--etcd-servers", f"http://127.0.0.1:{self.ports['etcd']}",
                "--tls-cert-file", str(certs["apiserver"].cert),
                "--tls-private-key-file", str(certs["apiserver"].key),
                "--client-ca-file", str(self.ca.cert),
                "--kubelet-client-certificate", str(certs["apiserver-kubelet"].cert),
                "--kubelet-client-key", str(certs["apiserver-kubelet"].key),
                "--kubelet-certificate-authority", str(self.ca.cert),
                "--kubelet-preferred-address-types", "InternalIP",
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--service-account-key-file", str(certs["service-accounts"].cert),
                "--service-account-signing-key-file", str(certs["service-accounts"].key),
                "--service-cluster-ip-range", SERVICE_CIDR,
                "--authorization-mode", "Node,RBAC",
                "--enable-admission-plugins", "NodeRestriction",
                "--allow-privileged=true",
                *self._gate_flags(),
                "--profiling=false",
                "--v=1",
            ],
        )  # fmt: skip
        api.start()
        assert self.api is not None
        api.wait_ready(self.api.healthy, 60, step)
        self._timed("kube-apiserver", step)

    def _start_controllers(self) -> None:
        step = time.monotonic()
        pki = self.pki
        common = [
            "--bind-address", "127.0.0.1",
            "--leader-elect=false",
            *self._gate_flags(),
            *(
                [f"--kube-api-qps={self.client_qps}", f"--kube-api-burst={self.client_qps}"]
                if self.client_qps
                else []
            ),
            "--v=1",
        ]  # fmt: skip
        scheduler = self._component(
            "kube-scheduler",
            [
                str(self.binaries.path("kube-scheduler")),
                "--kubeconfig", str(self.work / "scheduler.kubeconfig"),
                "--authentication-kubeconfig", str(self.work / "scheduler.kubeconfig"),
                "--authorization-kubeconfig", str(self.work / "scheduler.kubeconfig"),
                "--secure-port", str(self.ports["scheduler"]),
                "--cert-dir", str(self.work / "scheduler-certs"),
                *common,
            ],
        )  # fmt: skip
        kcm = self.work / "controller-manager.kubeconfig"
        manager = self._component(
            "kube-controller-manager",
            [
                str(self.binaries.path("kube-controller-manager")),
                "--kubeconfig", str(kcm),
                "--authentication-kubeconfig", str(kcm),
                "--authorization-kubeconfig", str(kcm),
                "--secure-port", str(self.ports["controller-manager"]),
                "--cert-dir", str(self.work / "controller-manager-certs"),
                "--service-account-private-key-file", str(pki / "sa.key"),
                "--root-ca-file", str(self.ca.cert),
                "--use-service-account-credentials=true",
                "--service-cluster-ip-range", SERVICE_CIDR,
                # Its default, /usr/libexec/kubernetes/..., would be created on the host.
                "--flex-volume-plugin-dir", str(self.work / "volume-plugins"),
                *common,
            ],
        )  # fmt: skip
        scheduler.start()
        manager.start()
        scheduler.wait_ready(lambda: _https_ok(self.ports["scheduler"]), 60, step)
        manager.wait_ready(lambda: _https_ok(self.ports["controller-manager"]), 60, step)
        self._timed("scheduler + controller-manager", step)

    def _start_nodes(self, certs: dict[str, Pair]) -> None:
        if not self.nodes:
            # A control plane alone (``node_count=0``): Nodes are someone else's, e.g. kwok's
            # fakes in benchmarks/fleet.py. Pods are still refused until the account exists.
            step = time.monotonic()
            self._wait_default_service_account(self.components["kube-controller-manager"])
            self._timed("default service account", step)
            return
        # The runtimes one after the other (each imports an image), then every kubelet at
        # once: their registration, the slow part, overlaps.
        for node in self.nodes:
            self._start_runtime(node)
        step = time.monotonic()
        for node in self.nodes:
            self._cgroup_root(node)
            node.kubelet = self._component(f"kubelet{node.suffix}", self._kubelet_argv(node, certs))
            node.kubelet.start()
        for node in self.nodes:
            assert node.kubelet is not None
            node.kubelet.wait_ready(functools.partial(self._kubelet_healthy, node), 60, step)
        self._timed("kubelet healthz", step)
        step = time.monotonic()
        for node in self.nodes:
            assert node.kubelet is not None
            node.kubelet.wait_ready(functools.partial(self.node_ready, node.name), 60, step)
        self._timed("node Ready, untainted", step)
        step = time.monotonic()
        assert self.nodes[0].kubelet is not None
        self._wait_default_service_account(self.nodes[0].kubelet)
        self._timed("default service account", step)

    def _start_runtime(self, node: Node) -> None:
        """The node's mount namespace and runtime, with the consumers' busybox image."""
        prefix = "" if not node.suffix else f"{node.name} "
        step = time.monotonic()
        node.namespace = NodeNamespace(node.work)
        node.namespace.start(self.logs / f"namespace{node.suffix}.log")
        self._timed(f"{prefix}node namespace", step)

        step = time.monotonic()
        self._cni(node)
        # Built by setup.py with the lane's other programs; never here.
        runc = self.lane.runc(allow_build=False)
        if self.lane.runtime == "cri-o":
            node.runtime = Crio(
                self.runtime_root, node.work, IMAGE_NAME, node.namespace.enter([]), runc=runc
            )
        else:
            node.runtime = Containerd(
                self.runtime_root,
                node.work,
                # The node's standard folders, which the namespace binds to cdi/etc and cdi/run.
                [Path("/etc/cdi"), Path("/var/run/cdi")],
                IMAGE_NAME,
                command_prefix=node.namespace.enter([]),
                config_version=self.lane.containerd_config_version,
                runc=runc,
            )
        try:
            node.runtime.start()
        except (DaemonError, CrioError) as exc:
            raise ComponentError(f"{self.lane.runtime} of {node.name}: {exc}") from exc
        self.import_image(build_archive(node.work / "busybox-oci.tar"), node)
        self._timed(f"{prefix}{self.lane.runtime} + busybox image", step)

    def _cni(self, node: Node) -> None:
        # containerd reports the pod network not ready (so the Node stays NotReady) until it
        # loads a CNI config, and a pod without hostNetwork (deploy/'s example consumers) needs
        # an address on eth0: containerd refuses a sandbox whose CNI result has none ("failed to
        # find network info"). ptp gives each such pod a veth pair and a /32 route on the host,
        # both gone with the pod; no bridge, no NAT rules, nothing else on the shared machine.
        missing = [p for p in CNI_PLUGINS if not (CNI_BIN / p).exists()]
        if missing:
            raise ComponentError(
                f"CNI plugins {', '.join(missing)} missing in {CNI_BIN}: "
                "apt-get install containernetworking-plugins"
            )
        (node.work / "cni/bin").mkdir(parents=True, exist_ok=True)
        (node.work / "cni/conf").mkdir(parents=True, exist_ok=True)
        for plugin in CNI_PLUGINS:
            link = node.work / "cni/bin" / plugin
            if not link.exists():
                link.symlink_to(CNI_BIN / plugin)
        node.pod_subnet = _free_pod_subnet(
            [n.pod_subnet for n in self.nodes if n.pod_subnet is not None]
        )
        network = {
            "cniVersion": "1.0.0",
            "name": "cdi-gen-pods",
            "plugins": [
                {
                    "type": "ptp",
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(node.pod_subnet)}]],
                        # The addresses handed out live and die with the node's folder.
                        "dataDir": str(node.work / "cni/ipam"),
                    },
                }
            ],
        }
        (node.work / "cni/conf/10-pods.conflist").write_text(json.dumps(network))

    def _cgroup_root(self, node: Node) -> None:
        # The kubelet wants its cgroupRoot to exist in every hierarchy; it is the runtime's
        # parent, so the runtime's teardown removes it with everything the kubelet made in it.
        assert node.runtime is not None
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split(" - ")[0].split()[4] for line in f
                      if line.split(" - ")[1].split()[0] in ("cgroup", "cgroup2")]  # fmt: skip
        for mount in mounts:
            Path(mount, node.runtime.cgroup_parent.lstrip("/")).mkdir(exist_ok=True)

    def kubelet_config(self, node: Node, certs: dict[str, Pair]) -> dict[str, Any]:
        runtime = node.runtime
        assert runtime is not None
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            # From 1.35 the kubelet refuses cgroup v1 hosts unless told otherwise.
            "failCgroupV1": False,
            # Under the runtime's own parent, which its teardown removes.
            "cgroupRoot": runtime.cgroup_parent,
            "containerRuntimeEndpoint": f"unix://{runtime.socket}",
            "address": "0.0.0.0",
            "port": node.ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": node.ports["kubelet-healthz"],
            "tlsCertFile": str(certs[f"kubelet-serving{node.suffix}"].cert),
            "tlsPrivateKeyFile": str(certs[f"kubelet-serving{node.suffix}"].key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.ca.cert)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "nodeStatusUpdateFrequency": f"{NODE_STATUS_SECONDS}s",
            # When the kubelet sees a new pod before the API server's node authorizer has
            # linked the pod to the node, fetching its ResourceClaim is refused ("no
            # relationship found"), and the kubelet (1.35 and 1.37 alike) records the sync as
            # done: the pod waits for the periodic resync, 1 min by default, longer than the
            # tests wait. Seen once in ~40 runs of the DRA scenarios.
            "syncFrequency": f"{SYNC_SECONDS}s",
            "failSwapOn": False,
            # Pods use the host's network namespace: the kubelet's KUBE-FIREWALL and canary
            # chains would land in the host's firewall and outlive the cluster.
            "makeIPTablesUtilChains": False,
            # The machine is shared: never evict or collect images because of its disk.
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "volumePluginDir": str(node.work / "volume-plugins"),
            "serializeImagePulls": False,
            # None in the current lane: the kubelet as users run it.
            **({"featureGates": dict(self.lane.feature_gates)} if self.lane.feature_gates else {}),
        }

    def _kubelet_argv(self, node: Node, certs: dict[str, Pair]) -> list[str]:
        assert node.namespace is not None
        config = node.work / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self.kubelet_config(node, certs), sort_keys=False))
        return node.namespace.enter(
            [
                str(self.binaries.path("kubelet")),
                "--config", str(config),
                "--kubeconfig", str(node.work / "kubelet.kubeconfig"),
                "--hostname-override", node.name,
                "--node-ip", self.node_ip,
                "--v=2",
                # The DRA plugin manager logs its ResourceSlice wipes (and their retries) at
                # 3: what a test of slices left after an uninstall needs to tell why.
                "--vmodule=dra_plugin_manager=3",
            ]
        )  # fmt: skip

    def _kubelet_healthy(self, node: Node | None = None) -> bool:
        port = (node or self.nodes[0]).ports["kubelet-healthz"]
        return _http_ok(f"http://127.0.0.1:{port}/healthz")

    def node(self, name: str = NODE_NAME) -> dict[str, Any] | None:
        """The Node object of the node ``name`` (default: the first)."""
        assert self.api is not None
        return self.api.get_or_none(f"/api/v1/nodes/{name}")

    def node_ready(self, name: str = NODE_NAME) -> bool:
        node = self.node(name)
        if node is None:
            return False
        conditions = node.get("status", {}).get("conditions", [])
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        # The controller-manager lifts the not-ready taint shortly after Ready.
        taints = node.get("spec", {}).get("taints", [])
        return ready and not taints

    def _wait_default_service_account(self, waiter: Component) -> None:
        # Pods are refused until the controller-manager created the namespace's account.
        assert self.api is not None
        api = self.api
        waiter.wait_ready(
            lambda: (
                api.get_or_none("/api/v1/namespaces/default/serviceaccounts/default") is not None
            ),
            60,
            time.monotonic(),
        )

    # ----- use -----------------------------------------------------------------------------

    def import_image(self, archive: Path, node: Node | None = None) -> None:
        """Import an OCI/docker image archive into a node's runtime (default: the first
        node's): containerd's namespace k8s.io as ``ctr images import`` does, or CRI-O's
        containers-storage by ``podman load``; pods then use it with
        ``imagePullPolicy: Never``."""
        runtime = (node or self.nodes[0]).runtime
        assert runtime is not None
        try:
            runtime.import_image(archive)
        except (DaemonError, CrioError) as exc:
            raise ComponentError(f"importing {archive}: {exc}") from exc

    def kubectl(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        """Run the release's kubectl as the cluster admin, e.g. ``kubectl("apply", "-k", d)``."""
        argv = [
            str(self.binaries.path("kubectl")),
            "--kubeconfig", str(self.admin_kubeconfig),
            # not ~/.kube/cache: nothing of a test cluster outlives it
            "--cache-dir", str(self.work / "kubectl-cache"),
            *args,
        ]  # fmt: skip
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise ComponentError(
                f"kubectl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
            )
        return proc.stdout

    def allocatable(self, resource: str, name: str = NODE_NAME) -> tuple[int, int]:
        """A Node's (capacity, allocatable) of ``resource`` (0 when absent)."""
        node = self.node(name) or {}
        status = node.get("status", {})
        return (
            int(status.get("capacity", {}).get(resource, "0")),
            int(status.get("allocatable", {}).get(resource, "0")),
        )

    def metrics(self, component: str) -> str:
        """A component's /metrics as the cluster admin: the apiserver's and the kubelet's
        through the API (the kubelet's by the node proxy), the scheduler's and the
        controller-manager's from their own ports (which ask the apiserver who may read)."""
        assert self.api is not None
        if component == "kube-apiserver":
            return self.api.text("/metrics")
        if component == "kubelet":
            return self.api.text(f"/api/v1/nodes/{NODE_NAME}/proxy/metrics")
        port = {"kube-scheduler": "scheduler", "kube-controller-manager": "controller-manager"}
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # self-signed serving certificates, as in _https_ok
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        url = f"https://127.0.0.1:{self.ports[port[component]]}/metrics"
        with urllib.request.urlopen(url, context=context, timeout=10) as r:
            return str(r.read().decode())

    def feature_gates(self, component: str) -> dict[str, bool]:
        """The gates a running component reports (``kubernetes_feature_enabled``)."""
        found = re.findall(
            r'^kubernetes_feature_enabled\{name="(\w+)",stage="\w*"\} (\d)$',
            self.metrics(component),
            re.MULTILINE,
        )
        return {name: value == "1" for name, value in found}

    def restart_kubelet(self) -> float:
        """SIGTERM the kubelet and start it again; seconds until its healthz answers."""
        kubelet = self.components["kubelet"]
        kubelet.stop()
        step = time.monotonic()
        kubelet.start()
        kubelet.wait_ready(self._kubelet_healthy, 60, step)
        return time.monotonic() - step

    def log_report(self, lines: int = 40) -> str:
        """The end of every component's log, for a failing test's report."""
        parts = [f"cluster work folder: {self.work}"]
        for component in self.components.values():
            parts.append(
                f"----- {component.name} ({component.log_path})\n{component.log_tail(lines)}"
            )
        for node in self.nodes:
            if node.runtime is not None:
                parts.append(
                    f"----- {self.lane.runtime} of {node.name} ({node.runtime.log_path})\n"
                    f"{node.runtime.log_tail(lines)}"
                )
        return "\n".join(parts)

    # ----- stop ----------------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Stop everything that was started, in reverse order; returns what was left behind."""
        problems: list[str] = []
        for node in self.nodes:
            if node.kubelet is not None:
                node.kubelet.stop()
        for node in reversed(self.nodes):
            if node.runtime is not None:
                problems += node.runtime.stop()
            if node.namespace is not None:
                node.namespace.stop()
        for name in ("kube-controller-manager", "kube-scheduler", "kube-apiserver", "etcd"):
            component = self.components.get(name)
            if component is not None:
                component.stop()
        for component in self.components.values():
            if component.running():
                pid = component.process.pid if component.process else None
                problems.append(f"{component.name} (pid {pid}) still running")
        return problems

    def remove(self) -> None:
        """Delete the work folder (unless something is still mounted in it)."""
        remove_work(self.work)


def _pair(pair: Pair) -> tuple[Path, Path]:
    return pair.cert, pair.key


@contextlib.contextmanager
def running_cluster(
    binaries: Binaries, etcd_root: Path, runtime_root: Path, lane: Lane, nodes: int = 1
) -> Any:
    """A started cluster, always stopped and removed at the end (for scripts and benchmarks)."""
    cluster = Cluster(binaries, etcd_root, runtime_root, lane, node_count=nodes)
    try:
        cluster.start()
        yield cluster
    finally:
        problems = cluster.stop()
        cluster.remove()
        if problems:
            raise ComponentError("cluster teardown left: " + "; ".join(problems))
