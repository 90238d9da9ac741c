"""The DRA driver's kubelet side against a kubelet stand-in, over real gRPC on unix sockets:
plugin-watcher registration, NodePrepare/UnprepareResources in both versions, the
checkpoint across driver restarts, kubelet restarts, and the device health stream."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cdi_gen._proto.drahealth.v1alpha1 import api_pb2 as health_pb
from cdi_gen.discovery.pool import DevicePool
from cdi_gen.errors import ClaimError
from cdi_gen.kubelet import draplugin
from cdi_gen.kubelet.checkpoint import CheckpointError, checkpoint_path
from cdi_gen.kubelet.draplugin import DraPlugin
from cdi_gen.model import AllocatedDevice, ClaimView, PoolDevice
from tests.fakes.drakubelet import DraConnection, FakeDraKubelet

pytestmark = pytest.mark.timeout(60)

DRIVER = "cdi-gen.example.com"
POOL = "node-a"


def device(name: str, *, healthy: bool = True, gone: bool = False) -> PoolDevice:
    return PoolDevice(
        name=f"fpga-{name}",
        cdi_name=f"example.com/fpga={name}",
        class_name="fpga",
        physical=f"/sys/devices/{name}",
        healthy=healthy,
        gone=gone,
    )


class Claims:
    """An in-memory ClaimReader; counts reads (called on the server's threads)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], ClaimView] = {}
        self.reads = 0
        self._lock = threading.Lock()

    def add(self, name: str, uid: str, *results: AllocatedDevice | None) -> None:
        allocated = None if results == (None,) else tuple(r for r in results if r is not None)
        self.claims["default", name] = ClaimView("default", name, uid, allocated)

    def read_claim(self, namespace: str, name: str) -> ClaimView:
        with self._lock:
            self.reads += 1
        found = self.claims.get((namespace, name))
        if found is None:
            raise ClaimError(f"claim {namespace}/{name}: not found")
        return found


def ours(dev: str, request: str = "fpga", share_id: str | None = None) -> AllocatedDevice:
    return AllocatedDevice(request, DRIVER, POOL, dev, share_id)


class Node:
    """A driver, its pool and claims, and the kubelet stand-in, in one short folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pool = DevicePool()
        self.pool.publish("fpga", [device("0"), device("1")])
        self.claims = Claims()
        self.outcomes: list[tuple[bool, str]] = []
        self.prepared: list[tuple[str, str]] = []

    def plugin(self, **kwargs: object) -> DraPlugin:
        return DraPlugin(
            DRIVER,
            self.pool,
            self.claims,
            pool_name=POOL,
            registry_dir=self.root / "registry",
            plugins_dir=self.root / "plugins",
            state_dir=self.root / "state",
            on_register=lambda ok, error: self.outcomes.append((ok, error)),
            on_prepare=lambda outcome, reason: self.prepared.append((outcome, reason)),
            watch_interval=0.02,
            max_backoff=0.2,
            register_timeout=2.0,
            **kwargs,  # type: ignore[arg-type]
        )


@pytest.fixture
async def node(short_dir: Path) -> AsyncIterator[Node]:
    (short_dir / "registry").mkdir()
    yield Node(short_dir)


async def until(condition: object, within: float = 5.0) -> None:
    for _ in range(int(within / 0.01)):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {within}s")


async def test_registers_through_the_plugin_watcher(node: Node) -> None:
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin() as plugin:
        connection = await kubelet.next_registration()
        await asyncio.wait_for(plugin.wait_registered(), 5)
        assert connection.info.type == "DRAPlugin"
        assert connection.info.name == DRIVER
        assert connection.info.endpoint == str(node.root / "plugins" / DRIVER / "dra.sock")
        assert list(connection.info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        assert connection.service == "v1.DRAPlugin"
        assert plugin.registrations == 1
        assert node.outcomes == [(True, "")]
        assert (node.root / "registry" / f"{DRIVER}-reg.sock").is_socket()
    # Stopped: both sockets are gone, so the kubelet forgets the driver.
    assert not (node.root / "registry" / f"{DRIVER}-reg.sock").exists()
    assert not (node.root / "plugins" / DRIVER / "dra.sock").exists()


async def test_a_refusal_is_reported_and_not_counted(node: Node) -> None:
    kubelet = FakeDraKubelet(node.root / "registry", refuse="driver not allowed here")
    async with kubelet, node.plugin() as plugin:
        await until(lambda: node.outcomes)
        assert node.outcomes[0][0] is False
        assert "driver not allowed here" in node.outcomes[0][1]
        assert plugin.registrations == 0


async def test_prepare_and_unprepare_are_idempotent(node: Node) -> None:
    node.claims.add("c1", "uid-1", ours("fpga-0", share_id="s-1"))
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        kubelet_plugin = await kubelet.next_registration()
        claim = ("default", "c1", "uid-1")
        first = await kubelet_plugin.prepare([claim])
        answer = first.claims["uid-1"]
        assert answer.error == ""
        [dev] = answer.devices
        assert list(dev.request_names) == ["fpga"]
        assert (dev.pool_name, dev.device_name) == (POOL, "fpga-0")
        assert list(dev.cdi_device_ids) == ["example.com/fpga=0"]
        assert dev.share_id == "s-1"
        assert node.claims.reads == 1
        recorded = checkpoint_path(node.root / "state", DRIVER).read_bytes()
        assert b"uid-1" in recorded

        # Again: the same answer, from the checkpoint, without reading the claim.
        again = await kubelet_plugin.prepare([claim])
        assert again == first
        assert node.claims.reads == 1
        assert node.prepared == [("ok", ""), ("ok", "")]

        done = await kubelet_plugin.unprepare([claim])
        assert dict(done.claims) == {"uid-1": done.claims["uid-1"]}
        assert done.claims["uid-1"].error == ""
        assert b"uid-1" not in checkpoint_path(node.root / "state", DRIVER).read_bytes()
        # Unknown now: still a success, and answered.
        twice = await kubelet_plugin.unprepare([claim, ("default", "never", "uid-x")])
        assert {uid: a.error for uid, a in twice.claims.items()} == {"uid-1": "", "uid-x": ""}


async def test_each_claim_gets_its_own_answer(node: Node) -> None:
    other = AllocatedDevice("gpu", "gpu.example.com", POOL, "gpu-0")
    node.pool.publish("fpga", [device("0"), device("1", healthy=False), device("2", gone=True)])
    node.claims.add("good", "u-good", other, ours("fpga-0"))
    node.claims.add("moved", "u-new", ours("fpga-0"))
    node.claims.add("unknown", "u-unknown", ours("fpga-9"))
    node.claims.add("sick", "u-sick", ours("fpga-1"))
    node.claims.add("gone", "u-gone", ours("fpga-2"))
    node.claims.add("foreign", "u-foreign", other)
    node.claims.add("pending", "u-pending", None)
    node.claims.add("elsewhere", "u-elsewhere", AllocatedDevice("fpga", DRIVER, "node-b", "fpga-0"))
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        response = await connection.prepare(
            [
                ("default", "good", "u-good"),
                ("default", "moved", "u-old"),
                ("default", "unknown", "u-unknown"),
                ("default", "sick", "u-sick"),
                ("default", "gone", "u-gone"),
                ("default", "foreign", "u-foreign"),
                ("default", "pending", "u-pending"),
                ("default", "elsewhere", "u-elsewhere"),
                ("default", "missing", "u-missing"),
            ]
        )
    errors = {uid: answer.error for uid, answer in response.claims.items()}
    assert errors.pop("u-good") == ""
    [only] = response.claims["u-good"].devices  # the other driver's device is not ours
    assert only.device_name == "fpga-0"
    expected = {
        "u-old": ("claim default/moved", "'u-old'", "'u-new'"),
        "u-unknown": ("claim default/unknown", "'fpga-9'", "not in this node's pool"),
        "u-sick": ("claim default/sick", "'fpga-1'", "unhealthy"),
        "u-gone": ("claim default/gone", "'fpga-2'", "gone"),
        "u-foreign": ("claim default/foreign", "no device of driver", DRIVER),
        "u-pending": ("claim default/pending", "not allocated"),
        "u-elsewhere": ("claim default/elsewhere", "'node-b'", "another pool"),
        "u-missing": ("claim default/missing", "not found"),
    }
    assert errors.keys() == expected.keys()
    for uid, parts in expected.items():
        for part in parts:
            assert part in errors[uid], (uid, errors[uid])
        assert response.claims[uid].devices == []
    assert sorted(reason for outcome, reason in node.prepared if outcome == "error") == sorted(
        [
            "uid-mismatch",
            "unknown-device",
            "unhealthy",
            "gone",
            "no-devices",
            "not-allocated",
            "other-pool",
            "claim-read",
        ]
    )
    # Nothing refused was recorded.
    assert b"u-good" in checkpoint_path(node.root / "state", DRIVER).read_bytes()
    assert b"u-sick" not in checkpoint_path(node.root / "state", DRIVER).read_bytes()


async def test_a_v1beta1_kubelet_is_served_without_share_id(node: Node) -> None:
    node.claims.add("c1", "uid-1", ours("fpga-1", share_id="s-1"))
    kubelet = FakeDraKubelet(node.root / "registry", services=("v1beta1.DRAPlugin",))
    async with kubelet, node.plugin():
        connection = await kubelet.next_registration()
        assert connection.service == "v1beta1.DRAPlugin"
        response = await connection.prepare([("default", "c1", "uid-1")])
        [dev] = response.claims["uid-1"].devices
        assert list(dev.cdi_device_ids) == ["example.com/fpga=1"]
        assert not hasattr(dev, "share_id")


async def test_a_restarted_driver_answers_from_its_checkpoint(node: Node) -> None:
    node.claims.add("c1", "uid-1", ours("fpga-0"))
    claim = ("default", "c1", "uid-1")
    async with FakeDraKubelet(node.root / "registry") as kubelet:
        async with node.plugin():
            connection = await kubelet.next_registration()
            first = await connection.prepare([claim])
            assert first.claims["uid-1"].error == ""
        # A new agent: the claim is gone from the API server and the device unhealthy,
        # yet the kubelet gets the answer it had.
        node.claims.claims.clear()
        node.pool.publish("fpga", [device("0", healthy=False)])
        async with node.plugin():
            connection = await kubelet.next_registration()
            again = await connection.prepare([claim])
            assert again == first
            assert node.claims.reads == 1
            done = await connection.unprepare([claim])
            assert done.claims["uid-1"].error == ""
        async with node.plugin():
            connection = await kubelet.next_registration()
            gone = await connection.prepare([claim])
            assert "not found" in gone.claims["uid-1"].error


async def test_a_kubelet_restart_registers_the_driver_again(node: Node) -> None:
    node.claims.add("c1", "uid-1", ours("fpga-0"))
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin() as plugin:
        await kubelet.next_registration()
        await until(lambda: plugin.registrations == 1)
        reg_socket = plugin.registration_server.socket_id
        await kubelet.restart()
        connection = await kubelet.next_registration()
        await until(lambda: plugin.registrations == 2)
        # Registered again on the same sockets: re-creating them would only make the
        # kubelet register the driver once more.
        assert plugin.registration_server.socket_id == reg_socket
        await asyncio.sleep(0.3)
        assert plugin.registrations == 2
        assert kubelet.registered.empty()
        response = await connection.prepare([("default", "c1", "uid-1")])
        assert response.claims["uid-1"].error == ""
        assert node.outcomes == [(True, ""), (True, "")]


async def test_a_removed_registration_socket_is_served_again(node: Node) -> None:
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin() as plugin:
        await kubelet.next_registration()
        await until(lambda: plugin.registrations == 1)
        plugin.registration_socket.unlink()
        await kubelet.next_registration()
        await until(lambda: plugin.registrations == 2)


@pytest.mark.parametrize(
    "kubelet_health",
    [
        # 1.37: v1 first, v1alpha1 still accepted; it opens the first the plugin lists.
        ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"),
        # 1.31 - 1.36 know only v1alpha1.
        ("v1alpha1.DRAResourceHealth",),
    ],
    ids=["kubelet-1.37-v1", "kubelet-1.36-v1alpha1"],
)
async def test_the_health_stream_follows_the_pool(
    node: Node, kubelet_health: tuple[str, ...]
) -> None:
    kubelet = FakeDraKubelet(node.root / "registry", health_services=kubelet_health)
    async with kubelet, node.plugin() as plugin:
        connection = await kubelet.next_registration()
        assert connection.health_service == kubelet_health[0]
        connection.watch_health()
        first = await connection.next_health()
        assert set(first) == {"fpga-0", "fpga-1"}
        for health in first.values():
            assert health.health == health_pb.HEALTHY
            assert health.device.pool_name == POOL
            assert health.health_check_timeout_seconds == draplugin.HEALTH_TIMEOUT_SECONDS
            assert health.message == ""
        node.pool.publish("fpga", [device("0", healthy=False), device("1")])
        second = await connection.next_health()
        assert second["fpga-0"].health == health_pb.UNHEALTHY
        assert "health check" in second["fpga-0"].message
        assert second["fpga-1"].health == health_pb.HEALTHY
        assert second["fpga-1"].last_updated_time == first["fpga-1"].last_updated_time
        node.pool.publish("fpga", [device("0", gone=True), device("1")])
        third = await connection.next_health()
        assert third["fpga-0"].health == health_pb.UNHEALTHY
        assert "gone" in third["fpga-0"].message
        node.pool.publish("fpga", [device("1")])
        assert set(await connection.next_health()) == {"fpga-1"}
        await plugin.stop()
        await asyncio.wait_for(connection.health_ended.wait(), 5)
        assert connection.health_error is None  # ended with OK, not cancelled


async def test_the_health_stream_repeats_itself_before_the_kubelet_times_out(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(draplugin, "HEALTH_RESEND_SECONDS", 0.2)
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        connection.watch_health()
        first = await connection.next_health()
        assert await connection.next_health(within=2) == first


async def test_health_streams_are_capped(node: Node) -> None:
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        extra: list[DraConnection] = []
        connection.watch_health()
        await connection.next_health()
        for _ in range(draplugin.MAX_HEALTH_STREAMS):
            more = DraConnection(
                connection.socket,
                connection.info,
                connection.service,
                connection.channel,
                connection.health_service,
            )
            more.watch_health()
            extra.append(more)
        ended = await asyncio.wait_for(
            asyncio.wait(
                [asyncio.ensure_future(e.health_ended.wait()) for e in extra],
                return_when=asyncio.FIRST_COMPLETED,
            ),
            5,
        )
        assert ended
        refused = [e for e in extra if e.health_ended.is_set()]
        assert len(refused) == 1
        assert refused[0].health_error is not None
        assert "RESOURCE_EXHAUSTED" in str(refused[0].health_error.code())
        for e in extra:
            if e._health_task is not None:
                e._health_task.cancel()


async def test_a_corrupt_checkpoint_stops_the_start_and_is_kept(node: Node) -> None:
    path = checkpoint_path(node.root / "state", DRIVER)
    path.parent.mkdir()
    path.write_bytes(b'{"kind": "something else"}')
    plugin = node.plugin()
    with pytest.raises(CheckpointError, match="not a cdi-gen DRA checkpoint"):
        await plugin.start()
    assert path.read_bytes() == b'{"kind": "something else"}'
    assert not plugin.registration_socket.exists()
