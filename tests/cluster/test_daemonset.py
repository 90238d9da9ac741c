"""Scenario 6, the DaemonSet as shipped: the image from deploy/Containerfile, the README's
``kubectl apply -k deploy/kubernetes`` (through the overlay of ``daemonset.py``) and its
``kubectl apply -f deploy/kubernetes/examples/one-consumer.yaml``, on the real node.

The example consumer's image, ``docker.io/library/busybox:1.36``, cannot be pulled here; a
busybox image from Debian's static busybox is imported under that name instead, so the example
is applied unchanged.
"""

from __future__ import annotations

import contextlib
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from containerd.image import build_archive
from loopdev import LoopDevices
from ports import free_port

from tests.waiting import until_sync

from .cluster import NODE_NAME, Cluster
from .conftest import _TEST_LOGS, _wait_nothing_allocatable, wait_capacity
from .daemonset import DEPLOY, NAMESPACE, SELECTOR, loop_fpga_config, write_overlay
from .image import AgentImage

# A cold agent image build takes minutes (see image.py); the scenario itself well under one.
#: The shipped DaemonSet runs in the oldest lane (Kubernetes 1.35, containerd 1.7) and the crio
#: lane (Kubernetes 1.36, CRI-O 1.36, the image loaded into its containers-storage) too.
pytestmark = [pytest.mark.timeout(900), pytest.mark.lanes("current", "oldest", "crio")]

RESOURCE = "example.com/fpga"
EXAMPLE = DEPLOY / "examples" / "one-consumer.yaml"
EXAMPLE_POD = "/api/v1/namespaces/default/pods/fpga-consumer"
EXAMPLE_IMAGE = "docker.io/library/busybox:1.36"


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def agent_pods(cluster: Cluster) -> list[dict[str, Any]]:
    assert cluster.api is not None
    items: list[dict[str, Any]] = cluster.api.get(
        f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={SELECTOR}"
    )["items"]
    return items


def wait_agent_ready(cluster: Cluster, timeout: float = 120) -> dict[str, Any]:
    """The DaemonSet's one pod, once its readiness probe (/readyz) passed."""
    deadline = time.monotonic() + timeout
    while True:
        pods = agent_pods(cluster)
        if len(pods) == 1 and _ready(pods[0]):
            return pods[0]
        for pod in pods:
            for status in pod.get("status", {}).get("containerStatuses", []):
                # A crash loop or an image problem will not heal: say so now.
                waiting = status.get("state", {}).get("waiting", {})
                if waiting.get("reason") in ("CrashLoopBackOff", "ErrImageNeverPull"):
                    raise AssertionError(f"agent pod {waiting['reason']}: {status}")
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"DaemonSet pod not Ready within {timeout:.0f} s: {[p.get('status') for p in pods]}"
            )
        time.sleep(0.5)


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def diagnostics(cluster: Cluster) -> str:
    """What a failing run needs: the agent pods' state and logs, the example pod's."""
    parts = []
    for args in (
        ("-n", NAMESPACE, "describe", "daemonset,pods", "-l", SELECTOR),
        ("-n", NAMESPACE, "logs", "-l", SELECTOR, "--tail=100", "--prefix"),
        ("describe", "pod", "fpga-consumer"),
        ("logs", "fpga-consumer"),
    ):
        proc_out = cluster.kubectl(*args, check=False, timeout=30)
        parts.append(f"----- kubectl {' '.join(args)}\n{proc_out}")
    return "\n".join(parts)


@contextlib.contextmanager
def shipped_run(
    cluster: Cluster, agent_image: AgentImage, tmp_path: Path, what: str
) -> Iterator[tuple[Path, int]]:
    """Images imported; yields (overlay folder, metrics port); at the end everything applied
    from deploy/ is deleted, the example pod first (with DRA, the running agent unprepares
    its claim), and the specs the agent wrote are removed. ``what`` names the diagnostics."""
    cluster.import_image(agent_image.archive)
    cluster.import_image(build_archive(tmp_path / "busybox.tar", name=EXAMPLE_IMAGE))
    overlay = tmp_path / "overlay"
    port = free_port()
    # Added to the report of a failing test (the hook in conftest.py), read while the
    # DaemonSet still runs.
    _TEST_LOGS.append((f"{what} and example pod (kubectl)", lambda: diagnostics(cluster)))
    try:
        yield overlay, port
    finally:
        _TEST_LOGS.clear()
        # The example's shell is PID 1 and ignores SIGTERM: without a short grace period the
        # delete would wait the default 30 s for the SIGKILL.
        cluster.kubectl(
            "delete", "--wait", "--grace-period=1", "--ignore-not-found", "-f", str(EXAMPLE)
        )
        if overlay.exists():
            # Foreground: --wait then also waits for the DaemonSet's pod to be gone.
            cluster.kubectl(
                "delete", "--wait", "--cascade=foreground", "--ignore-not-found", "-k", str(overlay)
            )
        # Left behind on purpose by the agent (no --cleanup-on-exit: running pods keep their
        # devices); nothing else writes into the node's CDI folder during this test.
        for spec in cluster.cdi_run.glob("*"):
            spec.unlink()


@pytest.fixture
def shipped_daemonset(
    cluster: Cluster, agent_image: AgentImage, tmp_path: Path
) -> Iterator[tuple[Path, int]]:
    """:func:`shipped_run` of the device-plugin DaemonSet."""
    with shipped_run(cluster, agent_image, tmp_path, "DaemonSet") as run:
        yield run
    assert not agent_pods(cluster), "the DaemonSet's pod outlived its deletion"
    # As after the other scenarios: the next test starts with no example.com device.
    _wait_nothing_allocatable(cluster)


def test_daemonset_as_shipped_serves_the_example_consumer(
    cluster: Cluster,
    loops: LoopDevices,
    shipped_daemonset: tuple[Path, int],
    agent_image: AgentImage,
) -> None:
    overlay, port = shipped_daemonset
    device = loops.add()
    write_overlay(overlay, agent_image.name, loop_fpga_config([device.name]), port)

    out = cluster.kubectl("apply", "-k", str(overlay))
    assert "configmap/cdi-gen-config created" in out, out
    assert "daemonset.apps/cdi-gen created" in out, out

    pod = wait_agent_ready(cluster)
    (container,) = pod["spec"]["containers"]
    assert container["image"] == agent_image.name
    assert pod["spec"]["nodeName"] == NODE_NAME
    # The readiness the kubelet saw, asked directly: every spec written, every plugin registered.
    assert http_status(f"http://127.0.0.1:{port}/readyz") == 200

    # Registered: the agent says so (its JSON log, through the API as `kubectl logs` reads it)
    # and the kubelet advertises the one loop device as example.com/fpga.
    assert cluster.api is not None
    agent_log = cluster.api.text(
        f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}/log"
    )
    assert f'"msg":"registered {RESOURCE} with the kubelet"' in agent_log, agent_log
    wait_capacity(cluster, RESOURCE, 1, timeout=60)
    spec = (cluster.cdi_run / "example.com-fpga.json").read_text()
    assert f'"fpga-{device.number}"' in spec

    # docs/operations.md's first check, as an operator runs it: doctor in the agent's pod
    # judges the node through the pod's mounts, and finds nothing wrong with a working agent.
    report = cluster.kubectl("-n", NAMESPACE, "exec", "ds/cdi-gen", "--", "cdi-gen", "doctor")
    assert "OK   class fpga: 1 device(s) match" in report.splitlines(), report
    assert not [line for line in report.splitlines() if line.startswith("FAIL")], report

    out = cluster.kubectl("apply", "-f", str(EXAMPLE))
    assert "pod/fpga-consumer created" in out, out
    cluster.api.wait_for(
        EXAMPLE_POD,
        lambda p: p is not None and p.get("status", {}).get("phase") == "Running",
        120,
        "example pod fpga-consumer Running",
    )

    # The example prints its device nodes and the class env, then sleeps.
    def example_log() -> str:
        return cluster.api.text(f"{EXAMPLE_POD}/log")

    until_sync(
        lambda: "FPGA_DEVICE=" in example_log(),
        "output from the example pod",
        30,
        every=0.5,
        observe=example_log,
    )
    log = example_log()
    major, minor = device.rdev()
    # ls -l of a block device: "brw-rw-rw- 1 root root 7, 432 <date> /dev/dfl-port.432".
    node = re.search(rf"^b\S+\s+\d+\s+\S+\s+\S+\s+{major},\s+{minor}\s.*(/dev/\S+)$", log, re.M)
    assert node is not None, log
    assert node.group(1) == f"/dev/dfl-port.{device.number}", log
    assert f"FPGA_DEVICE=fpga-{device.number}" in log.splitlines(), log
    print(f"example pod output:\n{log}")
