"""Issues 22 and 38 on a real node: a claim's configuration may narrow, never widen, what its
class grants.

The class's spec gives its nodes mode ``0660`` and no owner, so the runtime hands each node to
the container's user: a pod running as uid 1000 opens its device for reading and writing; the
same pod with a claim configuring ``fileMode 0440`` cannot (the difference proves the
configuration acted), and sees the env of the DeviceClass's config and of the claim's. A claim
asking for ``0666`` widens the class and is refused, as is an invalid configuration: the agent's
message, naming the field, is in the pod's events, and nothing is written. A monitoring pod with
admin access gets a device a worker holds.
"""

from __future__ import annotations

import copy
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loopdev import LoopDevice, LoopDevices

from tests.waiting import until_sync

from .agent import DRIVER, VENDOR, class_config
from .claims import REQUEST, Claims, claim_consumer, for_extended_resource, generated_device_classes
from .cluster import Cluster
from .conftest import DraAgentFactory
from .pods import NAMESPACE, Pods, status

CLASS = "fpga"
RESOURCE = f"{VENDOR}/{CLASS}"
NON_ROOT = 1000
#: Prints, per loop device, "rw" when it opens for reading and writing, else the shell's
#: error; then the variables the configurations set, and the claim named in the device
#: metadata file (KEP-5304) mounted through the claim's spec.
_METADATA = "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/*/dev/*-metadata.json"
_SCRIPT = """\
trap 'exit 0' TERM
while true; do
  echo BEGIN
  for f in /dev/loop*; do
    [ -b "$f" ] && echo "DEV $f $( (exec 3<>"$f" && echo rw) 2>&1 | tail -n 1)"
  done
  echo "ENV FROM_CLASS=${FROM_CLASS:-}"
  echo "ENV FROM_CLAIM=${FROM_CLAIM:-}"
  echo "ENV META=$(head -n 1 {metadata} 2>&1 | grep -o '"name":"[a-z-]*"' | head -n 1)"
  echo END
  sleep 2 & wait
done
"""
ADMIN_LABEL = "resource.kubernetes.io/admin-access"


def parameters(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "cdi-gen.io/v1alpha1", "kind": "DeviceConfig", **fields}


def opaque(params: dict[str, Any], requests: list[str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"opaque": {"driver": DRIVER, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def non_root_pod(name: str, claim: str) -> dict[str, Any]:
    pod = claim_consumer(name, claim=claim)
    pod["spec"]["securityContext"] = {"runAsUser": NON_ROOT, "runAsGroup": NON_ROOT}
    (container,) = pod["spec"]["containers"]
    container["command"] = ["sh", "-c", _SCRIPT.replace("{metadata}", _METADATA)]
    return pod


def serve(
    dra_agent: DraAgentFactory, claims: Claims, tmp_path: Path, devices: list[LoopDevice]
) -> str:
    """The agent for a class of ``devices`` whose nodes are 0660 without an owner (the
    container's user), and its generated DeviceClass with a configuration of ours setting
    FROM_CLASS; the DeviceClass's name."""
    config = class_config(CLASS, [d.name for d in devices], node={"fileMode": 0o660})
    dra_agent(config)
    config_path = tmp_path / "deviceclasses-config.yaml"
    config_path.write_text(config)
    device_class = copy.deepcopy(
        for_extended_resource(generated_device_classes(config_path), RESOURCE)
    )
    device_class["spec"]["config"] = [opaque(parameters(env={"FROM_CLASS": "yes"}))]
    claims.ensure_device_class(device_class)
    claims.wait_devices(DRIVER, lambda found: len(found) == len(devices), "devices published")
    return str(device_class["metadata"]["name"])


def claim_files(cluster: Cluster) -> list[str]:
    """The per-claim (transient) specs of our vendor on the node."""
    return sorted(p.name for p in cluster.cdi_run.glob(f"{VENDOR}-{CLASS}@*.json"))


@pytest.fixture
def admin_namespace(cluster: Cluster) -> Iterator[None]:
    """The test namespace labelled for admin access, unlabelled again at the end."""
    assert cluster.api is not None
    api = cluster.api
    path = f"/api/v1/namespaces/{NAMESPACE}"

    def label(value: str | None) -> None:
        ns = api.get(path)
        labels = ns["metadata"].setdefault("labels", {})
        if value is None:
            labels.pop(ADMIN_LABEL, None)
        else:
            labels[ADMIN_LABEL] = value
        api.request("PUT", path, ns)

    label("true")
    try:
        yield
    finally:
        label(None)


#: On CRI-O too: its CDI injection applies the configured mode and the container's owner.
@pytest.mark.lanes("current", "crio")
def test_a_claim_narrows_what_its_class_gives_a_non_root_pod(
    cluster: Cluster, loops: LoopDevices, dra_agent: DraAgentFactory, claims: Claims, tmp_path: Path
) -> None:
    pods: Pods = claims.pods
    plain, narrowed = loops.add(), loops.add()
    device_class = serve(dra_agent, claims, tmp_path, [plain, narrowed])

    claims.claim("plain-claim", device_class)
    claims.claim(
        "narrowed-claim",
        device_class,
        config=[
            opaque(
                parameters(deviceNodes={"fileMode": 0o440}, env={"FROM_CLAIM": "yes"}),
                [REQUEST],
            )
        ],
    )
    pods.add(non_root_pod("plain", "plain-claim"))
    pods.add(non_root_pod("narrowed", "narrowed-claim"))
    pods.wait_running("plain")
    pods.wait_running("narrowed")

    ((_, opened),) = pods.seen("plain").devices.items()
    assert opened == "rw"
    seen = pods.seen("narrowed")
    ((_, refused),) = seen.devices.items()
    assert "Permission denied" in refused, refused
    assert seen.env == {
        "FROM_CLASS": "yes",
        "FROM_CLAIM": "yes",
        "META": '"name":"narrowed-claim"',
    }
    # The DeviceClass's config gives every claim of the class a spec of its own (the class's
    # env); the one of a claim goes when the claim is unprepared.
    uids = {
        n: (claims.get_claim(f"{n}-claim") or {})["metadata"]["uid"] for n in ("plain", "narrowed")
    }
    assert claim_files(cluster) == sorted(f"{VENDOR}-{CLASS}@{u}.json" for u in uids.values())
    pods.delete("narrowed")
    until_sync(
        lambda: claim_files(cluster) == [f"{VENDOR}-{CLASS}@{uids['plain']}.json"],
        "the narrowed claim's spec removed at unprepare",
        30,
        every=0.2,
        observe=lambda: claim_files(cluster),
    )


@pytest.mark.parametrize(
    "case",
    [
        ({"fileMod": 384}, "parameters.deviceNodes.fileMod: unknown field"),
        (
            {"fileMode": 0o666},
            "asks for more than its class grants: device '",
        ),
    ],
    ids=["invalid", "widening"],
)
def test_a_refused_config_is_shown_in_the_pods_events(
    cluster: Cluster,
    loops: LoopDevices,
    dra_agent: DraAgentFactory,
    claims: Claims,
    tmp_path: Path,
    *,
    case: tuple[dict[str, Any], str],
) -> None:
    nodes, message = case
    api = cluster.api
    assert api is not None
    pods: Pods = claims.pods
    device_class = serve(dra_agent, claims, tmp_path, [loops.add()])
    claims.claim("bad-claim", device_class, config=[opaque(parameters(deviceNodes=nodes))])
    pods.add(non_root_pod("bad", "bad-claim"))
    selector = urllib.parse.quote("involvedObject.name=bad")
    events = f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector={selector}"

    def messages() -> list[str]:
        return [str(e.get("message", "")) for e in api.get(events)["items"]]

    until_sync(
        lambda: any(message in m for m in messages()),
        "the agent's refusal in the pod's events",
        60,
        every=0.5,
        observe=lambda: (status(pods.get("bad")), messages()),
    )
    text = json.dumps(messages())
    if "fileMod" in nodes:
        assert "config entry status.allocation.devices.config[" in text
    else:
        assert "fileMode 0o666 sets bits 0o6 that the class's fileMode 0o660 does not" in text
    assert claim_files(cluster) == []


@pytest.mark.usefixtures("admin_namespace")
def test_admin_access_beside_a_worker(
    loops: LoopDevices, dra_agent: DraAgentFactory, claims: Claims, tmp_path: Path
) -> None:
    pods: Pods = claims.pods
    device = loops.add()
    device_class = serve(dra_agent, claims, tmp_path, [device])
    claims.claim("worker-claim", device_class)
    claims.pod_with_claim("worker", "worker-claim")
    pods.wait_running("worker")
    claims.claim("monitor-claim", device_class, admin_access=True)
    claims.pod_with_claim("monitor", "monitor-claim")
    pods.wait_running("monitor")
    assert set(pods.seen("monitor").devices) == {str(device.path)}
    assert set(pods.seen("worker").devices) == {str(device.path)}
