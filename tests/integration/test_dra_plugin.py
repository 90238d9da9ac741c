"""The DRA driver's kubelet side against a kubelet stand-in, over real gRPC on unix sockets:
plugin-watcher registration, NodePrepare/UnprepareResources in both versions, the
checkpoint across driver restarts, kubelet restarts, and the device health stream; and a
hostile side: a stalled API server, claim references that are not Kubernetes names, a
checkpoint someone else wrote, a kubelet's huge error."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from cdi_gen._proto.drahealth.v1alpha1 import api_pb2 as health_pb
from cdi_gen.apiserver.client import ApiClient
from cdi_gen.cdi.resolution import SpecResolver
from cdi_gen.dra.driver.checkpoint import CHECKPOINT_KIND, CheckpointError, checkpoint_path
from cdi_gen.dra.driver.preparer import PoolPreparer
from cdi_gen.dra.plugin import service as draservice
from cdi_gen.dra.plugin.claimreader import ApiClaimReader
from cdi_gen.dra.plugin.claims import ClaimReader as KubeletClaimReader
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.dra.plugin.server import DraPlugin
from cdi_gen.errors import ClaimError
from cdi_gen.kubelet.transport import WORKERS
from cdi_gen.model import AllocatedDevice, ClaimView, PoolDevice
from tests.fakes.claimserver import ClaimServer, claim_body
from tests.fakes.drakubelet import DraConnection, FakeDraKubelet
from tests.waiting import until

pytestmark = pytest.mark.timeout(60)

DRIVER = "cdi-gen.example.com"
POOL = "node-a"
#: A share ID as the API server gives one: a UID.
SHARE = "6b2f0c1d-4e5a-4b3c-8d7e-9f0a1b2c3d4e"


def device(name: str, *, healthy: bool = True, gone: bool = False, shares: int = 1) -> PoolDevice:
    return PoolDevice(
        name=f"fpga-{name}",
        cdi_name=f"example.com/fpga={name}",
        class_name="fpga",
        physical=f"/sys/devices/{name}",
        healthy=healthy,
        gone=gone,
        shares=shares,
    )


class Claims:
    """An in-memory ClaimReader; counts reads (called on the server's threads).

    A read of a claim named in ``stalled`` waits, like a read from a stalled API server,
    until ``release`` is set or the timeout it is given runs out.
    """

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], ClaimView] = {}
        self.reads = 0
        self.stalled: set[str] = set()
        self.release = threading.Event()
        #: Reads waiting on a stalled claim now, and the timeout of every read.
        self.waiting = 0
        self.timeouts: list[float] = []
        self._lock = threading.Lock()

    def add(self, name: str, uid: str, *results: AllocatedDevice | None) -> None:
        allocated = None if results == (None,) else tuple(r for r in results if r is not None)
        self.claims["default", name] = ClaimView("default", name, uid, allocated)

    def read_claims(
        self, refs: Sequence[tuple[str, str]], timeout: float
    ) -> list[ClaimView | ClaimError]:
        with self._lock:
            self.reads += len(refs)
            self.timeouts.append(timeout)
        answered = True
        if any(name in self.stalled for _, name in refs):
            with self._lock:
                self.waiting += 1
            try:
                answered = self.release.wait(timeout)
            finally:
                with self._lock:
                    self.waiting -= 1
        return [self._one(ns, name, answered, timeout) for ns, name in refs]

    def _one(self, namespace: str, name: str, answered: bool, timeout: float) -> Any:
        if name in self.stalled and not answered:
            return ClaimError(f"claim {namespace}/{name}: no answer within {timeout:g} s")
        found = self.claims.get((namespace, name))
        if found is None:
            return ClaimError(f"claim {namespace}/{name}: not found")
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

    def plugin(
        self,
        reader: KubeletClaimReader | None = None,
        resolver: SpecResolver | None = None,
    ) -> DraPlugin:
        preparer = PoolPreparer(
            DRIVER,
            self.pool,
            pool_name=POOL,
            cdi_kinds=["example.com/fpga"],
            state_dir=self.root / "state",
            resolver=resolver,
        )
        return DraPlugin(
            DRIVER,
            self.pool,
            preparer,
            claims=self.claims if reader is None else reader,
            pool_name=POOL,
            registry_dir=self.root / "registry",
            plugins_dir=self.root / "plugins",
            on_register=lambda ok, error: self.outcomes.append((ok, error)),
            on_prepare=lambda outcome, reason: self.prepared.append((outcome, reason)),
            watch_interval=0.02,
            max_backoff=0.2,
            register_timeout=2.0,
        )


@pytest.fixture
async def node(short_dir: Path) -> AsyncIterator[Node]:
    (short_dir / "registry").mkdir()
    node = Node(short_dir)
    try:
        yield node
    finally:
        node.claims.release.set()  # no server thread stays behind a stalled read


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
        await until(lambda: node.outcomes, "a registration outcome")
        assert node.outcomes[0][0] is False
        assert "driver not allowed here" in node.outcomes[0][1]
        assert plugin.registrations == 0


async def test_prepare_and_unprepare_are_idempotent(node: Node) -> None:
    # A share ID belongs to a device published with shares (consumable capacity).
    node.pool.publish("fpga", [device("0", shares=2), device("1")])
    node.claims.add("c1", "uid-1", ours("fpga-0", share_id=SHARE))
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
        assert dev.share_id == SHARE
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
    node.pool.publish("fpga", [device("0"), device("1", shares=2)])
    node.claims.add("c1", "uid-1", ours("fpga-1", share_id=SHARE))
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


async def test_lowering_a_classs_shares_takes_no_share_allocated_before(node: Node) -> None:
    """As docs/dra.md says ("Lowering a class's shares"): the node counts no shares, the
    scheduler does. After an operator lowers a class from 4 shares to 2 (the agent restarts,
    the device has 2), the 3 shares prepared before are answered again, and a share
    allocated before and not yet prepared, the 4th of a device of 2, is prepared. Only a
    class no longer shared (1) refuses a share not yet prepared; prepared ones stay."""
    shares = [str(uuid.UUID(int=n)) for n in range(1, 6)]
    node.pool.publish("fpga", [device("0", shares=4), device("1")])
    node.claims.add("c1", "uid-1", *(ours("fpga-0", f"r{n}", shares[n]) for n in range(3)))
    node.claims.add("c2", "uid-2", ours("fpga-0", share_id=shares[3]))
    node.claims.add("c3", "uid-3", ours("fpga-0", share_id=shares[4]))
    c1, c2, c3 = (("default", f"c{n}", f"uid-{n}") for n in (1, 2, 3))
    async with FakeDraKubelet(node.root / "registry") as kubelet:
        async with node.plugin():
            connection = await kubelet.next_registration()
            first = await connection.prepare([c1])
            assert len(first.claims["uid-1"].devices) == 3
        node.pool.publish("fpga", [device("0", shares=2), device("1")])
        async with node.plugin():
            connection = await kubelet.next_registration()
            answers = (await connection.prepare([c1, c2])).claims
            assert answers["uid-1"] == first.claims["uid-1"]
            assert answers["uid-2"].error == ""
            assert [d.share_id for d in answers["uid-2"].devices] == [shares[3]]
        node.pool.publish("fpga", [device("0"), device("1")])
        async with node.plugin():
            connection = await kubelet.next_registration()
            answers = (await connection.prepare([c1, c2, c3])).claims
            assert answers["uid-1"] == first.claims["uid-1"]
            assert answers["uid-2"].error == ""
            assert "yet this node publishes it unshared" in answers["uid-3"].error
            # Shares hold nothing: the whole device goes to a claim while they are in use.
            node.claims.add("c4", "uid-4", ours("fpga-0"))
            whole = await connection.prepare([("default", "c4", "uid-4")])
            assert whole.claims["uid-4"].error == ""


async def test_lowering_a_classs_slots_refuses_only_slots_gone_and_not_yet_prepared(
    node: Node,
) -> None:
    """The same as slots (an API server without consumable capacity): after 4 slots become
    2, a claim prepared on slot 3 is answered again; one on slot 2 not yet prepared is
    refused as a device the node does not have."""
    slots = [dataclasses.replace(device(f"0-{n}"), slots=4) for n in range(4)]
    node.pool.publish("fpga", slots)
    node.claims.add("c1", "uid-1", ours("fpga-0-3"))
    node.claims.add("c2", "uid-2", ours("fpga-0-2"))
    c1, c2 = ("default", "c1", "uid-1"), ("default", "c2", "uid-2")
    async with FakeDraKubelet(node.root / "registry") as kubelet:
        async with node.plugin():
            connection = await kubelet.next_registration()
            first = await connection.prepare([c1])
            assert first.claims["uid-1"].error == ""
        node.pool.publish("fpga", [dataclasses.replace(d, slots=2) for d in slots[:2]])
        async with node.plugin():
            connection = await kubelet.next_registration()
            answers = (await connection.prepare([c1, c2])).claims
            assert answers["uid-1"] == first.claims["uid-1"]
            assert "'fpga-0-2' (pool 'node-a') of request 'fpga' is not in this node's pool" in (
                answers["uid-2"].error
            )


async def test_a_kubelet_restart_registers_the_driver_again(node: Node) -> None:
    node.claims.add("c1", "uid-1", ours("fpga-0"))
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin() as plugin:
        await kubelet.next_registration()
        await until(lambda: plugin.registrations == 1, "the first registration")
        reg_socket = plugin.registration_server.socket_id
        await kubelet.restart()
        connection = await kubelet.next_registration()
        await until(lambda: plugin.registrations == 2, "a second registration")
        # Registered again on the same sockets: re-creating them would only make the
        # kubelet register the driver once more.
        assert plugin.registration_server.socket_id == reg_socket
        # Any socket served anew did so before the registration counted: two later passes
        # of the kubelet over its folder would have seen it and registered the driver again.
        scans = kubelet.scans
        await until(lambda: kubelet.scans >= scans + 2, "two passes of the kubelet's watch")
        assert plugin.registrations == 2
        assert kubelet.registered.empty()
        response = await connection.prepare([("default", "c1", "uid-1")])
        assert response.claims["uid-1"].error == ""
        assert node.outcomes == [(True, ""), (True, "")]


async def test_a_removed_registration_socket_is_served_again(node: Node) -> None:
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin() as plugin:
        await kubelet.next_registration()
        await until(lambda: plugin.registrations == 1, "the first registration")
        plugin.registration_socket.unlink()
        await kubelet.next_registration()
        await until(lambda: plugin.registrations == 2, "a second registration")


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
            assert health.health_check_timeout_seconds == draservice.HEALTH_TIMEOUT_SECONDS
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
    monkeypatch.setattr(draservice, "HEALTH_RESEND_SECONDS", 0.2)
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
        for _ in range(draservice.MAX_HEALTH_STREAMS):
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
    with pytest.raises(CheckpointError, match="not a cdi-gen DRA checkpoint") as refused:
        await plugin.start()
    assert "left as it is" in str(refused.value)
    assert "not left" not in str(refused.value)
    assert path.read_bytes() == b'{"kind": "something else"}'
    assert not plugin.registration_socket.exists()


# -- a hostile side -------------------------------------------------------------------------


async def test_a_stalled_api_server_leaves_threads_for_prepared_claims(node: Node) -> None:
    """As many calls as the server has threads wait for a stalled API server; a claim
    prepared earlier is still answered at once, and the calls over the cap are told why."""
    node.claims.add("c1", "uid-1", ours("fpga-0"))
    node.claims.stalled = {f"slow-{i}" for i in range(WORKERS)}
    claim = ("default", "c1", "uid-1")
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        first = await connection.prepare([claim])
        assert first.claims["uid-1"].error == ""
        stuck = [
            asyncio.ensure_future(
                connection.prepare([("default", f"slow-{i}", f"u-slow-{i}")], within=60)
            )
            for i in range(WORKERS)
        ]
        await until(
            lambda: node.claims.waiting >= draservice.MAX_READING_CALLS, "every claim read stalled"
        )
        again = await connection.prepare([claim], within=5)
        assert again == first
        # Every call over the cap answered before the API server comes back: one still on
        # its way to the server would otherwise find a free slot (seen under load).
        await until(
            lambda: sum(f.done() for f in stuck) >= WORKERS - draservice.MAX_READING_CALLS,
            "the calls over the cap answered",
        )
        node.claims.release.set()
        answers = await asyncio.gather(*stuck)
    errors = [a.claims[f"u-slow-{i}"].error for i, a in enumerate(answers)]
    busy = [e for e in errors if "already wait for the API server" in e]
    assert len(busy) == WORKERS - draservice.MAX_READING_CALLS, errors
    assert all("not found" in e for e in errors if e not in busy), errors


async def test_a_stalled_claim_holds_up_only_itself_in_a_call_that_waits_for_it(
    node: Node,
) -> None:
    """No lock is held while the API server answers: a call naming a claim whose read
    stalls in another call still reads and records its other claim meanwhile, reads the
    stalled one no second time, and gets the same answer for it."""
    node.claims.add("slow", "u-slow", ours("fpga-0"))
    node.claims.add("c2", "uid-2", ours("fpga-1"))
    node.claims.stalled = {"slow"}
    slow, other = ("default", "slow", "u-slow"), ("default", "c2", "uid-2")
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin() as plugin:
        connection = await kubelet.next_registration()
        first = asyncio.ensure_future(connection.prepare([slow], within=30))
        await until(lambda: node.claims.waiting == 1, "the slow claim's read stalled")
        second = asyncio.ensure_future(connection.prepare([slow, other], within=30))
        await until(lambda: plugin.calls.count == 1, "the other claim recorded meanwhile")
        assert not first.done() and not second.done()
        node.claims.release.set()
        answers = await asyncio.gather(first, second)
    assert answers[0].claims["u-slow"] == answers[1].claims["u-slow"]
    assert answers[0].claims["u-slow"].error == ""
    assert [d.device_name for d in answers[1].claims["uid-2"].devices] == ["fpga-1"]
    assert node.claims.reads == 2


async def test_a_read_ends_within_the_callers_deadline(node: Node) -> None:
    """A call with a claim on a stalled API server and one prepared earlier is answered
    before the caller gives up: the prepared claim with its devices, the other with why."""
    node.claims.add("c1", "uid-1", ours("fpga-0"))
    node.claims.stalled = {"slow"}
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        first = await connection.prepare([("default", "c1", "uid-1")])
        response = await connection.prepare(
            [("default", "slow", "u-slow"), ("default", "c1", "uid-1")], within=5
        )
    assert response.claims["uid-1"] == first.claims["uid-1"]
    assert "claim default/slow: no answer within" in response.claims["u-slow"].error
    assert node.claims.reads == 2  # c1 once, at first: the second time from the checkpoint
    assert 0 < node.claims.timeouts[-1] < 5


BAD_REFERENCES = [
    # namespace, name, uid, what the error names
    ("../../../../../api/v1/nodes", "..", "u-1", "namespace '../../../../../api/v1/nodes'"),
    ("*", "c1", "u-2", "namespace '*'"),
    ("", "c1", "u-3", "namespace ''"),
    ("default", "..", "u-4", "name '..'"),
    ("default", "c1/../../secrets/token", "u-5", "name 'c1/../../secrets/token'"),
    ("default", "c1\n2026-12-01 forged line", "u-6", "name 'c1\\n2026-12-01 forged line'"),
    ("default", "c" * 300, "u-7", "(300 long)"),
    ("default", "c1", "u-8\x1b[31m", "uid 'u-8\\x1b[31m'"),
    ("default", "c1", "u" * 200, "(200 long)"),
]


async def test_claim_references_are_checked_before_anything_is_read(node: Node) -> None:
    node.claims.add("c1", "u-ok", ours("fpga-0"))
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        response = await connection.prepare(
            [(ns, name, uid) for ns, name, uid, _ in BAD_REFERENCES]
        )
    assert node.claims.reads == 0  # nothing reached the API server
    assert set(response.claims) == {uid for _, _, uid, _ in BAD_REFERENCES}
    for _, _, uid, part in BAD_REFERENCES:
        error = response.claims[uid].error
        assert part in error, error
        assert "DNS label" in error or "DNS subdomain" in error or "claim UID" in error, error
        assert "internal error" not in error
        assert error.isprintable(), error
        assert len(error) < 600, error
        assert response.claims[uid].devices == []
    reasons = sorted(reason for _, reason in node.prepared)
    assert reasons == sorted(["invalid-name"] * 7 + ["invalid-uid"] * 2)


async def test_whatever_the_api_server_answers_each_claim_gets_one_line(node: Node) -> None:
    """The agent's own claim reader and API client against an API server stand-in: answers
    that are not claims and references that are not names are each that claim's refusal,
    naming it and the rule, never 'internal error'; a bad reference is never sent."""
    result = {"request": "fpga", "driver": DRIVER, "pool": POOL, "device": "fpga-0"}
    no_device = {k: v for k, v in result.items() if k != "device"}
    bodies = {
        "good": claim_body("default", "good", "u-good", result),
        "html": b"<html>502 Bad Gateway</html>",
        "pod": orjson.dumps({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "pod"}}),
        "nodev": claim_body("default", "nodev", "u-nodev", no_device),
    }
    expected = {
        "u-good": "",
        "u-html": "ResourceClaim default/html: the answer is not JSON: '<html>502 Bad Gateway",
        "u-pod": "ResourceClaim default/pod: the answer is not a ResourceClaim: kind 'Pod'",
        "u-nodev": "ResourceClaim default/nodev: status.allocation.devices.results[0]: "
        "has no 'device'",
        "u-star": "namespace '*'",
        "u-ctl": "name 'c\\x1b[2J'",
    }
    with ClaimServer.running(node.root) as server:
        for name, body in bodies.items():
            server.bodies["default", name] = body
        client = ApiClient(server.kubeconfig)
        reader = ApiClaimReader(client, asyncio.get_running_loop())
        try:
            async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin(reader):
                connection = await kubelet.next_registration()
                response = await connection.prepare(
                    [("default", name, f"u-{name}") for name in bodies]
                    + [("*", "c", "u-star"), ("default", "c\x1b[2J", "u-ctl")]
                )
        finally:
            await client.close()
    assert set(response.claims) == set(expected)
    for uid, part in expected.items():
        error = response.claims[uid].error
        assert part in error, (uid, error)
        assert "internal error" not in error
        assert error.isprintable(), error
    assert [d.device_name for d in response.claims["u-good"].devices] == ["fpga-0"]
    assert sorted(server.requests) == sorted(
        f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}" for name in bodies
    )


def plant_checkpoint(node: Node, cdi_id: str, mode: int = 0o600) -> Path:
    path = checkpoint_path(node.root / "state", DRIVER)
    path.parent.mkdir(exist_ok=True)
    device = {"requestNames": ["fpga"], "pool": POOL, "device": "fpga-0", "cdiDeviceIds": [cdi_id]}
    claims = {"uid-1": {"namespace": "default", "name": "c1", "devices": [device]}}
    doc = {"kind": CHECKPOINT_KIND, "version": 1, "driver": DRIVER, "claims": claims}
    path.write_bytes(orjson.dumps(doc))
    path.chmod(mode)
    return path


async def test_a_checkpoint_others_could_write_stops_the_start_and_is_kept(node: Node) -> None:
    path = plant_checkpoint(node, "evil.example/host=root", mode=0o666)
    content = path.read_bytes()
    plugin = node.plugin()
    with pytest.raises(CheckpointError, match=r"writable by group or others \(mode 0666\)"):
        await plugin.start()
    assert path.read_bytes() == content
    os.chown(path, 65534, -1)
    path.chmod(0o600)
    with pytest.raises(CheckpointError, match="owned by uid 65534"):
        await plugin.start()
    assert not plugin.registration_socket.exists()


async def test_a_recorded_id_that_is_not_ours_is_never_answered(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    plant_checkpoint(node, "evil.example/host=root")
    node.claims.add("c1", "uid-1", ours("fpga-0"))
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        response = await connection.prepare([("default", "c1", "uid-1")])
    [dev] = response.claims["uid-1"].devices
    assert list(dev.cdi_device_ids) == ["example.com/fpga=0"]  # read and checked anew
    assert node.claims.reads == 1
    assert any("'evil.example/host=root'" in r.getMessage() for r in caplog.records)


async def test_a_huge_registration_error_is_logged_quoted_and_cut(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    error = "no\n2026-12-01 00:00:00 ERROR cdi_gen forged\n" + "x" * (2 << 20)
    kubelet = FakeDraKubelet(node.root / "registry", refuse=error)
    with caplog.at_level(logging.DEBUG, "cdi_gen"):
        async with kubelet, node.plugin():
            await until(lambda: node.outcomes, "a registration outcome")
    ok, outcome = node.outcomes[0]
    assert not ok
    assert outcome.isprintable(), outcome[:200]
    assert len(outcome) < 300, len(outcome)
    assert "'no\\n2026-12-01" in outcome
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("cdi_gen")]
    assert any("'no\\n2026-12-01" in line for line in lines), lines
    for line in lines:
        assert "\n" not in line, line[:200]
        assert len(line) < 1000, line[:200]


async def test_a_claim_is_prepared_only_when_its_cdi_names_resolve(node: Node) -> None:
    """As Allocate does: the runtime's spec folders (the real SpecCache) must resolve every
    name the claim gets, else the kubelet would hand on a name the runtime cannot find."""
    from cdi_gen.cdi.registry import SpecCache

    folder = node.root / "cdi"
    folder.mkdir()
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "example.com/fpga",
        "devices": [{"name": "0", "containerEdits": {"env": ["FPGA=0"]}}],
    }
    (folder / "example.com-fpga.json").write_bytes(orjson.dumps(spec))
    node.claims.add("resolves", "u-1", ours("fpga-0"))
    node.claims.add("missing", "u-2", ours("fpga-1"))
    # A second file defining the same device: the runtime refuses a conflicting name.
    node.claims.add("later", "u-3", ours("fpga-0"))
    async with (
        FakeDraKubelet(node.root / "registry") as kubelet,
        node.plugin(resolver=SpecCache([folder])),
    ):
        connection = await kubelet.next_registration()
        response = await connection.prepare(
            [("default", "resolves", "u-1"), ("default", "missing", "u-2")]
        )
        assert response.claims["u-1"].error == ""
        assert list(response.claims["u-1"].devices[0].cdi_device_ids) == ["example.com/fpga=0"]
        refused = response.claims["u-2"].error
        assert "CDI devices do not resolve" in refused and "example.com/fpga=1" in refused
        assert ("error", "unresolved") in node.prepared

        (folder / "other.json").write_bytes(orjson.dumps(spec))
        # Released first: a device prepared for another claim is refused as in use.
        await connection.unprepare([("default", "resolves", "u-1")])
        later = await connection.prepare([("default", "later", "u-3")])
        assert "CDI devices do not resolve" in later.claims["u-3"].error


async def test_an_unprepare_during_the_prepare_of_that_claim_leaves_no_stale_record(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """The kubelet may unprepare a claim while a prepare of it still waits for the API
    server (the pod was deleted meanwhile). The unprepare must not be answered before the
    prepare has recorded the claim, else the record lands after the unprepare removed
    nothing and the checkpoint keeps a claim the kubelet believes unprepared, answered from
    it whenever that UID is asked for again."""
    result = {"request": "fpga", "driver": DRIVER, "pool": POOL, "device": "fpga-0"}
    claim = ("default", "c1", "uid-1")
    caplog.set_level(logging.INFO, "cdi_gen")
    with ClaimServer.running(node.root) as server:
        server.bodies["default", "c1"] = claim_body("default", "c1", "uid-1", result)
        server.stalled.add(("default", "c1"))
        client = ApiClient(server.kubeconfig)
        reader = ApiClaimReader(client, asyncio.get_running_loop())
        try:
            async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin(reader):
                connection = await kubelet.next_registration()
                prepare = asyncio.ensure_future(connection.prepare([claim], within=30))
                await until(lambda: server.requests, "the claim's read at the API server")
                unprepare = asyncio.ensure_future(connection.unprepare([claim], within=30))
                await until(
                    lambda: (
                        unprepare.done()
                        or any("waits for the call" in r.getMessage() for r in caplog.records)
                    ),
                    "the unprepare answered, or waiting for the prepare",
                )
                server.release.set()
                prepared, unprepared = await asyncio.gather(prepare, unprepare)
        finally:
            await client.close()
    assert prepared.claims["uid-1"].error == ""
    assert unprepared.claims["uid-1"].error == ""
    recorded = orjson.loads(checkpoint_path(node.root / "state", DRIVER).read_bytes())
    assert recorded["claims"] == {}, "the unprepared claim is still recorded"
