"""Issue 56's fallback against a real API server that drops counters: the oldest lane's
kube-apiserver (Kubernetes 1.35) with ``DRAPartitionableDevices`` off, its default in 1.35.

The oldest lane's cluster switches that gate on (shared devices' slots need it, ``lane.py``),
so this test starts an API server of its own beside the lanes' clusters: etcd and
kube-apiserver alone (``Cluster(apiserver_only=True)``), the lane's gates but that one. The
real agent (``cdi-gen run --api dra``) serves a composite class (``group.offer: both``) over a
loop disk with three partitions, registered by the fake kubelet (``tests/fakes/drakubelet.py``:
no kubelet, scheduler or runtime is needed to see what the API server keeps). The test reads
the ResourceSlices back from that API server, every write of them through a watch opened
before the agent started, and asserts the parts alone: never the whole beside its parts, no
counters, the warning logged once and ``/readyz`` ready but naming the class degraded. It
prints which form was published (``published form: ...``) and why the agent chose it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from containerd.agent import spawn_agent
from loopdev import LoopDevices, partitioned_image
from ports import free_port
from processes import terminate

from tests.fakes.drakubelet import FakeDraKubelet
from tests.waiting import until_sync

from .agent import DRIVER, VENDOR
from .api import Api, ApiError
from .claims import SLICES
from .cluster import Cluster
from .dist import FetchError, fetch_etcd
from .lane import OLDEST, LaneError
from .process import ComponentError

GATE = "DRAPartitionableDevices"
NODE = "cdi-gen-gate-off"
ALONE = "composite classes published as their parts alone"
#: What ``/readyz`` says of a composite class published as its parts alone (node.py).
DEGRADED = f"degraded: {VENDOR}/disk (parts alone, no whole"


@pytest.fixture(scope="module")
def gate_off() -> Iterator[Cluster]:
    """The oldest lane's etcd and kube-apiserver, with every gate of the lane but
    ``DRAPartitionableDevices``, which is off (1.35's default); stopped at the module's end."""
    lane = dataclasses.replace(OLDEST, feature_gates={**OLDEST.feature_gates, GATE: False})
    try:
        server = Cluster(
            lane.binaries(allow_build=False),
            fetch_etcd(),
            lane.runtime_root(allow_build=False),  # unused: no node
            lane,
            node_count=0,
            apiserver_only=True,
        )
    except (FetchError, LaneError) as exc:
        pytest.fail(f"lane oldest, API server with {GATE} off: {exc}", False)
    try:
        try:
            server.start()
        except (ComponentError, OSError) as exc:
            pytest.fail(f"kube-apiserver with {GATE} off did not start: {exc}\n"
                        f"{server.log_report()}", False)  # fmt: skip
        yield server
    finally:
        problems = server.stop()
        server.remove()
        assert not problems, problems


@contextlib.contextmanager
def _fake_kubelet(registry: Path) -> Iterator[FakeDraKubelet]:
    """The fake kubelet's plugin watcher on a loop of its own thread (the test is sync); as a
    1.35 kubelet, it knows the v1alpha1 health service only."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake kubelet", daemon=True)
    thread.start()
    kubelet = FakeDraKubelet(registry, health_services=("v1alpha1.DRAResourceHealth",))
    try:
        asyncio.run_coroutine_threadsafe(kubelet.start(), loop).result(10)
        yield kubelet
    finally:
        asyncio.run_coroutine_threadsafe(kubelet.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@contextlib.contextmanager
def _slice_writes(api: Api) -> Iterator[list[dict[str, Any]]]:
    """Every ResourceSlice as written from now on (the watch starts at the list's
    resourceVersion, so nothing written before it is connected is missed)."""
    version = api.get(SLICES)["metadata"]["resourceVersion"]
    seen: list[dict[str, Any]] = []

    def watch() -> None:
        with contextlib.suppress(OSError, ApiError, ValueError):
            for event in api.watch(SLICES, 300, resourceVersion=version):
                seen.append(event)

    thread = threading.Thread(target=watch, name="slice watch", daemon=True)
    thread.start()
    yield seen  # the watch ends with the API server


def _ours(api: Api) -> list[dict[str, Any]]:
    selector = urllib.parse.quote(f"spec.nodeName={NODE},spec.driver={DRIVER}")
    items: list[dict[str, Any]] = api.get(f"{SLICES}?fieldSelector={selector}")["items"]
    return items


def _devices(slices: list[dict[str, Any]]) -> set[str]:
    return {d["name"] for s in slices for d in s["spec"].get("devices") or ()}


def _counted(slices: list[dict[str, Any]]) -> list[str]:
    """What in ``slices`` carries counters: a slice's counter sets or a device's uses."""
    found = [s["metadata"]["name"] for s in slices if s["spec"].get("sharedCounters")]
    found += [
        d["name"]
        for s in slices
        for d in s["spec"].get("devices") or ()
        if d.get("consumesCounters")
    ]
    return found


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def test_a_real_api_server_without_the_gate_gets_the_parts_alone(
    gate_off: Cluster, loops: LoopDevices, tmp_path: Path
) -> None:
    api = gate_off.api
    assert api is not None
    assert gate_off.feature_gates("kube-apiserver")[GATE] is False
    # The Node the slices name (no kubelet registers one): the agent makes it their owner.
    api.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})

    dev = loops.add()
    assert loops.attach_partitioned(dev, partitioned_image(tmp_path / "disk.img", [4, 4, 4])) == 3
    whole = f"disk-{dev.name}"
    parts = {f"{whole}p{n}" for n in (1, 2, 3)}
    config = tmp_path / "composite.yaml"
    disk_class = {
        "name": "disk",
        # Exactly this disk and its partitions: other suites' loop devices stay out.
        "match": [
            {"subsystem": "block", "kernel": dev.name},
            {"subsystem": "block", "kernel": f"{dev.name}p[0-9]*"},
        ],
        "group": {"by": "parent", "subsystem": "block", "offer": "both"},
        "deviceName": "{group}",
    }
    config.write_text(json.dumps({"vendor": VENDOR, "classes": [disk_class]}))

    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="cg"))  # short socket paths
    registry, port, log = work / "registry", free_port(), tmp_path / "agent.log"
    with _slice_writes(api) as writes, _fake_kubelet(registry) as kubelet:
        agent = spawn_agent(
            config,
            [work / "cdi-etc", work / "cdi-run"],
            work / "device-plugins",
            log,
            (
                "--api", "dra",
                "--dra-driver", DRIVER,
                "--plugins-registry-dir", str(registry),
                "--kubelet-plugins-dir", str(work / "plugins"),
                "--state-dir", str(tmp_path / "state"),
                "--kubeconfig", str(gate_off.admin_kubeconfig),
                "--node-name", NODE,
                "--metrics-address", f"127.0.0.1:{port}",
            ),
        )  # fmt: skip
        try:
            agent_log = log.read_text
            until_sync(
                lambda: _devices(_ours(api)) == parts,
                f"the slices offer {sorted(parts)}",
                60,
                observe=lambda: (_ours(api), agent_log()[-3000:]),
            )
            status, ready = until_sync(
                lambda: (r := _readyz(port))[0] == 200 and r,
                "the agent ready",
                30,
                observe=lambda: (_readyz(port), agent_log()[-3000:]),
            )
            assert kubelet.plugins.keys() == {DRIVER}
            slices = _ours(api)
            text = agent_log()
        finally:
            terminate(agent)

    why = [line for line in text.splitlines() if ALONE in line]
    print(f"published form: parts alone; slices: {json.dumps([s['spec'] for s in slices])}")
    print(f"the agent said: {why}")
    print(f"/readyz: {status} {ready.strip()}")
    # The parts alone, without counters, and the whole never beside them at any write.
    assert _devices(slices) == parts
    assert _counted(slices) == []
    written = [e["object"] for e in writes if e["type"] in ("ADDED", "MODIFIED")]
    assert written, "the watch saw no slice written"
    assert [s for s in written if whole in _devices([s]) or _counted([s])] == []
    # Said once (why: the dry run with counters came back without them), and kept in /readyz.
    assert len(why) == 1, text
    assert "the API server drops sharedCounters (DRAPartitionableDevices off)" in why[0]
    assert DEGRADED in ready, ready
