"""Issue 36 item 2 on a real node: claims aligned on Kubernetes' standard
``resource.kubernetes.io/pcieRoot`` attribute, which the agent publishes for every device with
a PCI device above it; and (issue 56 item 4) ``resource.kubernetes.io/numaNode`` (KEP-6072),
published where that PCI device has a NUMA node.

The only device nodes of this machine with a PCI parent are its virtio disk (the root
filesystem) and that disk's partitions; loop devices and zram are virtual. So the aligned pair
is two shares of the whole disk (``sharing: {replicas: 3}``, which this lane's API server takes
as consumable capacity: one device with 3 shares), handed over read-only (cgroup ``r``, no
``w`` or ``m``) to a pod that only checks that the node is there. A loop device
(no PCI parent, so no ``pcieRoot``) is the partner a ``matchAttribute`` can never accept.
Where the disk's PCI function has a NUMA node (its sysfs ``numa_node`` is not -1), the aligned
claim also selects on it and aligns on it; where it has none (-1, as on a VM without NUMA),
the attribute must be absent.

One agent serves both classes; the cluster is the current lane's single node (Kubernetes 1.37,
no gates: ``matchAttribute`` is part of GA structured parameters, the standard names need no
gate at all).
"""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from loopdev import LoopDevices

from tests.waiting import until_sync

from .agent import DRIVER, VENDOR
from .claims import (
    CLAIMS,
    Claims,
    allocated_devices,
    claim_consumer,
    device_attribute,
    for_extended_resource,
    generated_device_classes,
)
from .cluster import Cluster
from .conftest import DraAgentFactory
from .pods import NAMESPACE, phase, status

PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
NUMA_NODE = "resource.kubernetes.io/numaNode"
DISK, LOOP = "disk", "fpga"


def pci_disk() -> tuple[str, str, str]:
    """(kernel name, pcieRoot, BDF) of the first whole disk of the host with a PCI parent,
    read from sysfs here, apart from the agent's own derivation."""
    for entry in sorted(Path("/sys/class/block").iterdir()):
        if (entry / "partition").exists():
            continue
        parts = entry.resolve().parts  # /, sys, devices, pci0000:00, ..., <BDF>, ..., <name>
        if len(parts) > 4 and parts[2] == "devices" and parts[3].startswith("pci"):
            bdf = next(p for p in reversed(parts) if (Path("/sys/bus/pci/devices") / p).exists())
            return entry.name, parts[3], bdf
    pytest.fail("this machine has no whole disk with a PCI parent to align claims on")


def pci_numa_node(bdf: str) -> int | None:
    """The NUMA node of PCI function ``bdf`` as sysfs has it, None for -1 (no affinity)."""
    node = int((Path("/sys/bus/pci/devices") / bdf / "numa_node").read_text())
    return None if node < 0 else node


def _config(disk: str, loop: str) -> str:
    classes = [
        {
            "name": DISK,
            "match": {"subsystem": "block", "kernel": disk, "properties": {"DEVTYPE": "disk"}},
            "deviceName": "{kernel}",
            # The host's disk: readable at most, never writable or creatable in the pod.
            "node": {"permissions": "r"},
            "sharing": {"replicas": 3},
            "containerEdits": {"env": ["DISK_DEVICE={name}"]},
        },
        {
            "name": LOOP,
            "match": {"subsystem": "block", "kernel": loop, "properties": {"DEVTYPE": "disk"}},
            "deviceName": f"{LOOP}-{{number}}",
            "containerEdits": {"env": ["FPGA_DEVICE={name}"]},
        },
    ]
    return json.dumps({"vendor": VENDOR, "classes": classes}, indent=2) + "\n"


def _claim(
    claims: Claims, name: str, classes: dict[str, str], aligned: bool, numa: int | None = None
) -> None:
    """A claim of one device per request (request name -> DeviceClass), constrained to one
    pcieRoot when ``aligned``; with ``numa``, every request selects that standard NUMA node
    and the devices are aligned on it too."""
    requests = [
        {"name": r, "exactly": {"deviceClassName": c, "allocationMode": "ExactCount", "count": 1}}
        for r, c in classes.items()
    ]
    devices: dict[str, Any] = {"requests": requests}
    if aligned:
        devices["constraints"] = [{"matchAttribute": PCIE_ROOT}]
    if numa is not None:
        expression = f'device.attributes["resource.kubernetes.io"].numaNode == {numa}'
        for request in requests:
            request["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
        devices.setdefault("constraints", []).append({"matchAttribute": NUMA_NODE})
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }
    claims.api.create(CLAIMS, body)
    # Deleted with the test's other DRA objects.
    claims.created.append(f"{CLAIMS}/{name}")


_SCRIPT = """\
trap 'exit 0' TERM
if [ -b /dev/{disk} ]; then echo "SEEN /dev/{disk}"; else echo "MISSING /dev/{disk}"; fi
echo "ENV DISK_DEVICE=${{DISK_DEVICE:-}}"
echo END
sleep 3600 & wait
"""


def _pod(claims: Claims, name: str, claim: str, disk: str) -> None:
    pod = claim_consumer(name, claim=claim)
    (container,) = pod["spec"]["containers"]
    container["command"] = ["sh", "-c", _SCRIPT.format(disk=disk)]
    claims.pods.add(pod)


def _log(claims: Claims, pod: str) -> str:
    return claims.api.text(f"{claims.pods.path(pod)}/log?container=app")


def test_two_requests_aligned_on_one_pcie_root(
    cluster: Cluster,
    loops: LoopDevices,
    dra_agent: DraAgentFactory,
    claims: Claims,
    tmp_path: Path,
) -> None:
    api = cluster.api
    assert api is not None
    disk, root, bdf = pci_disk()
    numa = pci_numa_node(bdf)
    loop = loops.add()
    config = _config(disk, loop.name)
    dra_agent(config)
    config_path = tmp_path / "deviceclasses-config.yaml"
    config_path.write_text(config)
    generated = generated_device_classes(config_path)
    classes = {}
    for cls in (DISK, LOOP):
        body = for_extended_resource(generated, f"{VENDOR}/{cls}")
        claims.ensure_device_class(body)
        classes[cls] = str(body["metadata"]["name"])

    shared = f"{DISK}-{disk}"
    loop_device = f"{LOOP}-{LOOP}-{loop.number}"

    def topology(devices: dict[str, Any]) -> dict[str, tuple[Any, Any, Any]]:
        return {n: tuple(d.get("attributes", {}).get(k) for k in (PCIE_ROOT, PCI_BUS_ID, NUMA_NODE))
                for n, d in devices.items()}  # fmt: skip

    published = claims.wait_devices(
        DRIVER,
        lambda found: (
            set(found) == {shared, loop_device}
            and device_attribute(found[shared], DRIVER, "kernelName") == disk
        ),
        f"the disk ({shared}, by capacity) and {loop_device} published",
    )
    # The standard names, fully qualified, on the disk only; its NUMA node only where sysfs
    # gives one, and then as the driver's own numaNode says too.
    assert topology(published) == {
        shared: ({"string": root}, {"string": bdf}, None if numa is None else {"int": numa}),
        loop_device: (None, None, None),
    }
    assert device_attribute(published[shared], DRIVER, "numaNode") == numa

    # Negative first: a disk share and the loop device on one root cannot be had. The
    # scheduler says so in an event; the pod stays pending.
    _claim(claims, "misaligned", {"disk": classes[DISK], "loop": classes[LOOP]}, aligned=True)
    _pod(claims, "misaligned", "misaligned", disk)
    selector = urllib.parse.quote("involvedObject.kind=Pod,involvedObject.name=misaligned")
    events = f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector={selector}"

    def scheduling_events() -> list[str]:
        return [
            str(e.get("message", ""))
            for e in api.get(events)["items"]
            if e.get("reason") == "FailedScheduling"
        ]

    until_sync(
        lambda: bool(scheduling_events()),
        "the scheduler's FailedScheduling event for pod misaligned",
        60,
        every=0.3,
        observe=lambda: (status(claims.pods.get("misaligned")), scheduling_events()),
    )
    assert phase(claims.pods.get("misaligned")) == "Pending"
    assert allocated_devices(claims.get_claim("misaligned")) == []

    # Two disk shares on one root (and, where the disk has one, on one NUMA node, selected
    # by the standard name): allocated, prepared, injected.
    pair = {"first": classes[DISK], "second": classes[DISK]}
    _claim(claims, "aligned", pair, aligned=True, numa=numa)
    _pod(claims, "aligned", "aligned", disk)
    claims.pods.wait_running("aligned", timeout=90)
    results = allocated_devices(claims.get_claim("aligned"))
    assert sorted(r["request"] for r in results) == ["first", "second"]
    assert {r["driver"] for r in results} == {DRIVER}
    got = [(r["device"], r.get("shareID")) for r in results]
    assert [d for d, _ in got] == [shared, shared] and len({i for _, i in got if i}) == 2, got
    until_sync(
        lambda: "END" in _log(claims, "aligned"),
        "pod aligned's output",
        30,
        every=0.3,
        observe=lambda: _log(claims, "aligned"),
    )
    log = _log(claims, "aligned")
    assert f"SEEN /dev/{disk}" in log, log
    # A share carries its physical device's edits: the disk's name, whichever share.
    assert f"ENV DISK_DEVICE={disk}\n" in log, log

    # The same pair of classes without the constraint is allocatable, so what kept the
    # first pod pending was the constraint alone; it still is, past that later event.
    _claim(claims, "unaligned", {"disk": classes[DISK], "loop": classes[LOOP]}, aligned=False)
    _pod(claims, "unaligned", "unaligned", disk)
    claims.pods.wait_running("unaligned", timeout=90)
    assert phase(claims.pods.get("misaligned")) == "Pending"
    assert allocated_devices(claims.get_claim("misaligned")) == []
