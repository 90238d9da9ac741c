"""Issue 57 on a real node: a network interface moved into one pod through CDI ``netDevices``.

A veth pair stands in for a USB NIC or a CAN adapter (this machine's kernel has veth and
macvlan, no dummy or vcan): a net class matches its host end, a pod asks for it through the
device plugin or through a DRA claim, and the lane's runtime (containerd 2.3 or CRI-O 1.36,
each running runc 1.5, which applies OCI ``linux.netDevices``) moves it into the pod's network
namespace under the class's name, ``net0``. runc keeps the end's global addresses and brings
it up there, so the pod talks TCP across the pair to the peer end, which stays on the host
with the test's echo server on it. While the pod holds the interface the host no longer sees
it, and a second pod asking for it waits. When the pod ends the runtime removes its network
namespace, and a veth end inside dies with its pair (a physical NIC would come back to the
host): the test recreates the pair under the same names, and the device is free again, for
the waiting claim (DRA) or a new pod (device plugin).

The oldest lane (containerd 1.7, whose CDI library reads cdiVersion 0.8.0 at most, over Debian's
runc 1.1) shows the refusal instead: one line naming the runtime and the need, no device
offered, the interface left on the host.

The agent is told the node's runtime with ``--runtime`` (``containerd@2.3.7,runc@1.5.3``) as an
operator would: on this machine PATH holds Debian's podman 4.3, whose CDI library reads 0.5.0 at
most, and that is not the node's runtime.
"""

from __future__ import annotations

import json
import os
import re
import socketserver
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from containerd.image import IMAGE_NAME

from cdi_gen.cdi.runtimes import version_from_output
from cdi_gen.cdi.specnames import spec_filename
from tests.waiting import until_sync

from .agent import DRIVER, VENDOR
from .api import ApiError
from .claims import REQUEST, Claims, allocated_devices, device_attribute, generated_device_classes
from .cluster import Cluster
from .conftest import AgentFactory, DraAgentFactory, wait_capacity
from .lane import Lane
from .pods import Pods

CLASS = "veth"
RESOURCE = f"{VENDOR}/{CLASS}"
#: The interface's name inside the pod (the class's ``netDevice.name``).
IN_POD = "net0"
#: Link-local addresses of the pair, on no network but the pair itself: the end that moves
#: keeps its address in the pod (runc re-adds global addresses), the peer's is on the host.
POD_ADDRESS, HOST_ADDRESS, PREFIX_LENGTH = "169.254.213.2", "169.254.213.1", 30
#: Test-owned interface names, unique per process (at most 15 bytes: IFNAMSIZ).
PREFIX = f"cgn{os.getpid() % 100000}"
#: The runtime removes a pod's network namespace after the pod object is gone; the kernel
#: destroys what was in it from a work queue.
GONE_TIMEOUT = 60.0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def on_host(name: str) -> bool:
    """Whether this (the host's) network namespace has an interface ``name``."""
    return Path("/sys/class/net", name).exists()


@dataclass
class VethPair:
    """``host`` is the end the class matches and the pod gets; ``peer`` stays on the host."""

    host: str
    peer: str
    #: The host end's MAC, read when made (the pod may take the end at once).
    mac: str = ""

    def create(self) -> None:
        _ip("link", "add", self.host, "type", "veth", "peer", "name", self.peer)
        self.mac = Path("/sys/class/net", self.host, "address").read_text().strip()
        _ip("addr", "add", f"{POD_ADDRESS}/{PREFIX_LENGTH}", "dev", self.host)
        _ip("addr", "add", f"{HOST_ADDRESS}/{PREFIX_LENGTH}", "dev", self.peer)
        _ip("link", "set", self.peer, "up")
        _ip("link", "set", self.host, "up")

    def remove(self) -> None:
        for name in (self.host, self.peer):
            subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


@pytest.fixture
def veth() -> Iterator[VethPair]:
    pair = VethPair(f"{PREFIX}h", f"{PREFIX}p")
    pair.remove()  # a pair an interrupted run left behind
    pair.create()
    try:
        yield pair
    finally:
        pair.remove()


@dataclass
class EchoServer:
    """TCP on the peer end's address: answers each line with ``pong <line>`` and records who
    sent what (the address a pod connected from, the line)."""

    port: int
    heard: list[tuple[str, str]] = field(default_factory=list)


@pytest.fixture
def echo(veth: VethPair) -> Iterator[EchoServer]:
    heard: list[tuple[str, str]] = []

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            line = self.rfile.readline(200).decode(errors="replace").strip()
            heard.append((self.client_address[0], line))
            self.wfile.write(f"pong {line}\n".encode())

    # Bound to the address, not the interface: it keeps listening while the pair is
    # destroyed with a pod's namespace and made again.
    server = socketserver.ThreadingTCPServer((HOST_ADDRESS, 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    try:
        yield EchoServer(server.server_address[1], heard)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def class_config(veth: VethPair) -> str:
    cls = {
        "name": CLASS,
        "match": {"subsystem": "net", "kernel": veth.host},
        "deviceName": "{kernel}",
        "netDevice": {"name": IN_POD},
    }
    return json.dumps({"vendor": VENDOR, "classes": [cls]}, indent=2) + "\n"


def _version(binary: Path, pattern: str) -> str:
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    found = re.search(pattern, out.stdout, re.M)
    assert found is not None, f"{binary} --version: {out.stdout!r}"
    return found[1]


def runtime_reference(lane: Lane) -> str:
    """The node's runtime and its runc as ``--runtime`` names them, e.g.
    ``containerd@2.3.7,runc@1.5.3``."""
    if lane.runtime == "cri-o":
        name, version = "cri-o", lane.runtime_release()
    else:
        name = "containerd"
        daemon = lane.runtime_root(allow_build=False) / "usr/bin/containerd"
        out = subprocess.run(
            [str(daemon), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        version = version_from_output("containerd", out.stdout)
    assert version, f"lane {lane.name}: no runtime version"
    runc = _version(lane.runc(allow_build=False), r"^runc version (\S+)")
    return f"{name}@{version},runc@{runc}"


_SCRIPT = """\
trap 'exit 0' TERM
echo "LINK $(cat /sys/class/net/{name}/address 2>/dev/null || echo none)"
while true; do
  echo "REPLY $(echo "ping $HOSTNAME" | nc -w 2 {address} {port} 2>&1)"
  sleep 1 & wait
done
"""


def net_pod(name: str, port: int, *, resource: str = "", claim: str = "") -> dict[str, Any]:
    """A pod in its own network namespace (no hostNetwork: runc moves no interface into the
    host's) that prints the MAC of ``net0`` and, every second, the echo server's answer
    across the pair; it asks for the device by ``resource`` (device plugin) or ``claim``."""
    container: dict[str, Any] = {
        "name": "app",
        "image": IMAGE_NAME,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", _SCRIPT.format(name=IN_POD, address=HOST_ADDRESS, port=port)],
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "automountServiceAccountToken": False,
        "containers": [container],
    }
    if resource:
        container["resources"] = {"limits": {resource: "1"}}
    else:
        spec["resourceClaims"] = [{"name": REQUEST, "resourceClaimName": claim}]
        container["resources"] = {"claims": [{"name": REQUEST}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "cdi-gen-cluster-test"}},
        "spec": spec,
    }


def wait_traffic(pods: Pods, echo: EchoServer, pod: str, veth: VethPair) -> None:
    """The pod has the host end under ``net0`` (its MAC) and talks to the peer end across
    the pair; the host no longer sees that end, only its peer."""

    def log() -> str:
        try:
            return pods.api.text(f"{pods.path(pod)}/log?container=app")
        except ApiError as exc:  # no log until the container runs
            return f"(no log: {exc})"

    until_sync(
        lambda: f"REPLY pong ping {pod}" in log(),
        f"pod {pod}: an answer from {HOST_ADDRESS} across the pair",
        60,
        every=0.5,
        observe=log,
    )
    assert f"LINK {veth.mac}" in log().splitlines()
    assert (POD_ADDRESS, f"ping {pod}") in echo.heard
    assert not on_host(veth.host), f"{veth.host} still on the host while {pod} holds it"
    assert on_host(veth.peer)


def wait_gone_with_the_pod(veth: VethPair) -> None:
    """What the runtime does with the pod's namespace: removed, and the veth end in it with
    its pair (a veth end is not given back to the host)."""
    until_sync(
        lambda: not on_host(veth.peer) and not on_host(veth.host),
        f"the pair {veth.host}/{veth.peer} gone with the pod's network namespace",
        GONE_TIMEOUT,
        every=0.2,
    )


@dataclass
class Net:
    """What a scenario here uses on the node."""

    cluster: Cluster
    lane: Lane
    pods: Pods
    veth: VethPair
    echo: EchoServer


@pytest.fixture
def net(cluster: Cluster, lane: Lane, pods: Pods, veth: VethPair, echo: EchoServer) -> Net:
    return Net(cluster, lane, pods, veth, echo)


@pytest.mark.lanes("current", "crio")
def test_device_plugin_moves_the_interface_into_the_pod_and_frees_it_after(
    net: Net, node_agent: AgentFactory
) -> None:
    cluster, pods, veth, echo = net.cluster, net.pods, net.veth, net.echo
    node_agent(class_config(veth), ("--runtime", runtime_reference(net.lane)))
    wait_capacity(cluster, RESOURCE, 1)
    spec_path = cluster.cdi_run / spec_filename(VENDOR, CLASS)
    spec = json.loads(spec_path.read_text())
    assert spec["cdiVersion"] == "1.1.0"
    assert spec["devices"] == [
        {
            "name": veth.host,
            "containerEdits": {"netDevices": [{"hostInterfaceName": veth.host, "name": IN_POD}]},
        }
    ]

    pods.add(net_pod("net-a", echo.port, resource=RESOURCE))
    pods.wait_running("net-a")
    wait_traffic(pods, echo, "net-a", veth)
    # In the pod, not gone: the host's "remove" of the end (long before the traffic) left
    # the device in the spec and advertised.
    assert json.loads(spec_path.read_text())["devices"] == spec["devices"]
    assert cluster.allocatable(RESOURCE) == (1, 1)

    pods.add(net_pod("net-b", echo.port, resource=RESOURCE))
    message = pods.wait_unschedulable("net-b")
    assert f"Insufficient {RESOURCE}" in message, message
    # Its proof given, the waiting pod goes first: the device dies with net-a's namespace,
    # and the scheduler, reading the Node's capacity seconds late, could bind a waiting pod
    # that the kubelet, which no longer has the device, then rejects (UnexpectedAdmission).
    pods.delete("net-b")

    pods.delete("net-a")
    wait_gone_with_the_pod(veth)
    veth.create()  # the same names: the same device
    until_sync(spec_path.exists, "the device back in the spec", 30, every=0.2)
    wait_capacity(cluster, RESOURCE, 1)
    pods.add(net_pod("net-c", echo.port, resource=RESOURCE))
    pods.wait_running("net-c")
    wait_traffic(pods, echo, "net-c", veth)


@pytest.mark.lanes("current", "crio")
def test_dra_claim_moves_the_interface_into_the_pod_and_frees_it_after(
    net: Net, dra_agent: DraAgentFactory, claims: Claims, tmp_path: Path
) -> None:
    pods, veth, echo = net.pods, net.veth, net.echo
    config = class_config(veth)
    dra_agent(config, args=("--runtime", runtime_reference(net.lane)))
    config_path = tmp_path / "deviceclasses.yaml"
    config_path.write_text(config)
    (device_class,) = generated_device_classes(config_path)
    claims.ensure_device_class(device_class)
    cdi_name = f"{RESOURCE}={veth.host}"
    devices = claims.wait_devices(
        DRIVER,
        lambda found: (
            [device_attribute(d, DRIVER, "cdiName") for d in found.values()] == [cdi_name]
        ),
        f"the node's slices publishing {cdi_name}",
    )
    (published,) = devices

    class_name = device_class["metadata"]["name"]
    claims.claim("net-a-claim", class_name)
    pods.add(net_pod("net-a", echo.port, claim="net-a-claim"))
    pods.wait_running("net-a")
    (result,) = allocated_devices(claims.get_claim("net-a-claim"))
    assert result["device"] == published
    wait_traffic(pods, echo, "net-a", veth)
    # In the pod, not gone: still published, and the claim's status has its network data.
    claims.wait_devices(DRIVER, lambda found: published in found, f"{published} still published")

    def network_data() -> object:
        entries = (claims.get_claim("net-a-claim") or {}).get("status", {}).get("devices", [])
        return [e.get("networkData") for e in entries if e.get("device") == published]

    until_sync(
        lambda: network_data() == [{"interfaceName": IN_POD, "hardwareAddress": veth.mac}],
        "the claim's status with the interface's network data",
        30,
        every=0.2,
        observe=network_data,
    )

    claims.claim("net-b-claim", class_name)
    pods.add(net_pod("net-b", echo.port, claim="net-b-claim"))
    message = pods.wait_unschedulable("net-b")
    assert "cannot allocate all claims" in message, message
    assert allocated_devices(claims.get_claim("net-b-claim")) == []

    pods.delete("net-a")
    wait_gone_with_the_pod(veth)
    veth.create()
    pods.wait_running("net-b", timeout=90)
    (result,) = allocated_devices(claims.get_claim("net-b-claim"))
    assert result["device"] == published
    wait_traffic(pods, echo, "net-b", veth)


@pytest.mark.lanes("oldest")
def test_oldest_lane_refuses_a_net_class_in_one_line(
    cluster: Cluster, lane: Lane, node_agent: AgentFactory, pods: Pods, veth: VethPair
) -> None:
    reference = runtime_reference(lane)
    assert reference.startswith("containerd@1.7."), reference
    agent = node_agent(class_config(veth), ("--runtime", reference))

    def refusals() -> list[str]:
        return [line for line in agent.log().splitlines() if "left out" in line]

    until_sync(lambda: bool(refusals()), "the agent's refusal", 30, every=0.2, observe=refusals)
    (line,) = refusals()
    assert f"device '{veth.host}'" in line, line
    assert "netDevices needs cdiVersion 1.1.0" in line, line
    assert "containerd 1.7.24" in line, line
    # Nothing to offer: the interface stays on the host and a pod asking for it waits.
    assert cluster.allocatable(RESOURCE) == (0, 0)
    assert not (cluster.cdi_run / spec_filename(VENDOR, CLASS)).exists()
    pods.add(net_pod("net-refused", 1, resource=RESOURCE))
    message = pods.wait_unschedulable("net-refused")
    assert f"Insufficient {RESOURCE}" in message, message
    assert on_host(veth.host)
