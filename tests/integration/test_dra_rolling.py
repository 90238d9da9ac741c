"""A rolling update with surge, over real gRPC on unix sockets against the kubelet stand-in:
two instances of one DRA driver, each with its pod's sockets, register side by side; either
answers any claim from the state they share; the old one hands over to the newer and
removes only its own sockets, and the newer keeps serving."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cdi_gen.dra.driver.preparer import PoolPreparer
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.dra.plugin.server import DraPlugin
from cdi_gen.model import PoolDevice
from tests.fakes.countingclaims import CountingClaims
from tests.fakes.drakubelet import FakeDraKubelet
from tests.waiting import until

pytestmark = pytest.mark.timeout(60)

DRIVER, POOL = "cdi-gen.example.com", "node-a"
OLD, NEW = "uid-old", "uid-new"


def instance(root: Path, pod_uid: str | None, claims: CountingClaims) -> DraPlugin:
    """One agent's plugin: its own pool and preparer, the node's folders."""
    pool = DevicePool()
    pool.publish("fpga", [PoolDevice("fpga-0", "example.com/fpga=0", "fpga", "/sys/f0")])
    preparer = PoolPreparer(
        DRIVER,
        pool,
        pool_name=POOL,
        cdi_kinds=["example.com/fpga"],
        state_dir=root / "state",
    )
    return DraPlugin(
        DRIVER,
        pool,
        preparer,
        claims=claims,
        pool_name=POOL,
        registry_dir=root / "registry",
        plugins_dir=root / "plugins",
        pod_uid=pod_uid,
        watch_interval=0.02,
        max_backoff=0.2,
        register_timeout=2.0,
    )


async def test_two_instances_serve_side_by_side_and_the_old_one_hands_over(
    short_dir: Path,
) -> None:
    registry = short_dir / "registry"
    old_claims, new_claims = CountingClaims(DRIVER, POOL), CountingClaims(DRIVER, POOL)
    old = instance(short_dir, OLD, old_claims)
    new = instance(short_dir, NEW, new_claims)
    c1, c2 = ("default", "c1", "uid-1"), ("default", "c2", "uid-2")
    async with FakeDraKubelet(registry) as kubelet:
        await old.start()
        try:
            to_old = await kubelet.next_registration()
            assert to_old.socket == registry / f"{DRIVER}-{OLD}-reg.sock"
            assert to_old.info.endpoint == str(short_dir / "plugins" / DRIVER / f"dra-{OLD}.sock")
            assert (await to_old.prepare([c1])).claims["uid-1"].error == ""

            async with new:
                to_new = await kubelet.next_registration()
                assert to_new.socket == registry / f"{DRIVER}-{NEW}-reg.sock"
                await asyncio.wait_for(new.wait_registered(), 5)
                # Both registered, both served: the newer is the old one's successor, and
                # no instance is the newer one's. Each says it is registered beside its socket.
                assert await asyncio.wait_for(old.handover.superseded(), 5) == to_new.socket
                plugins = short_dir / "plugins" / DRIVER
                assert (plugins / f"{DRIVER}-{NEW}-reg.sock.registered").exists()
                assert (plugins / f"{DRIVER}-{OLD}-reg.sock.registered").exists()
                assert new.handover.successors() == []
                # The claim the old one prepared: answered by the new one from the shared
                # checkpoint, its device held against another claim there.
                again = await to_new.prepare([c1])
                assert again.claims["uid-1"] == (await to_old.prepare([c1])).claims["uid-1"]
                assert new_claims.reads == 0
                refused = (await to_new.prepare([c2])).claims["uid-2"].error
                assert "in use by claim default/c1" in refused
                # Unprepared through the new one: freed for the old one too.
                assert (await to_new.unprepare([c1])).claims["uid-1"].error == ""
                assert (await to_old.prepare([c2])).claims["uid-2"].error == ""

                # SIGTERM to the old pod: the newer one is registered, so it hands over at
                # once, and its stop removes its own sockets only.
                assert await old.hand_over(within=5)
                await old.stop()
                assert not (registry / f"{DRIVER}-{OLD}-reg.sock").exists()
                assert not (plugins / f"{DRIVER}-{OLD}-reg.sock.registered").exists()
                assert not (short_dir / "plugins" / DRIVER / f"dra-{OLD}.sock").exists()
                assert (registry / f"{DRIVER}-{NEW}-reg.sock").is_socket()
                assert (short_dir / "plugins" / DRIVER / f"dra-{NEW}.sock").is_socket()
                # The newer one goes on: the claim the old one prepared is its to unprepare.
                assert (await to_new.prepare([c2])).claims["uid-2"].error == ""
                assert (await to_new.unprepare([c2])).claims["uid-2"].error == ""
                assert new.calls.count == 0
        finally:
            await old.stop()


async def test_without_a_pod_uid_there_is_nobody_to_hand_over_to(short_dir: Path) -> None:
    plugin = instance(short_dir, None, CountingClaims(DRIVER, POOL))
    async with FakeDraKubelet(short_dir / "registry") as kubelet, plugin:
        connection = await kubelet.next_registration()
        assert connection.socket == short_dir / "registry" / f"{DRIVER}-reg.sock"
        assert plugin.handover.successors() == []
        assert not await plugin.hand_over(within=5)  # at once: one instance per node


async def test_the_newest_hands_over_to_nobody_within_its_bound(short_dir: Path) -> None:
    plugin = instance(short_dir, NEW, CountingClaims(DRIVER, POOL))
    async with FakeDraKubelet(short_dir / "registry") as kubelet, plugin:
        await kubelet.next_registration()
        # A drain or an uninstall: no newer instance comes; the stop waits its bound only.
        assert not await plugin.hand_over(within=0.1)


async def test_a_newer_socket_not_yet_registered_is_no_successor(short_dir: Path) -> None:
    old = instance(short_dir, OLD, CountingClaims(DRIVER, POOL))
    # The kubelet stand-in refuses every plugin: the newer one serves but is not registered.
    kubelet = FakeDraKubelet(short_dir / "registry", refuse="not now")
    async with kubelet, old:
        new = instance(short_dir, NEW, CountingClaims(DRIVER, POOL))
        async with new:
            await until(lambda: len(kubelet.notified) >= 2, "both registrations refused")
            newer = short_dir / "registry" / f"{DRIVER}-{NEW}-reg.sock"
            assert newer.is_socket()
            assert old.handover.successors() == []
            assert not await old.hand_over(within=0.1)


async def test_the_old_one_sees_its_successor_stop_and_no_longer_counts_it(
    short_dir: Path,
) -> None:
    """A rollback: the newer instance stops after the older one handed over to it. The older
    one's wait for its successors to go returns, and the newer socket, were it left behind,
    is no successor any more: it is not served."""
    old = instance(short_dir, OLD, CountingClaims(DRIVER, POOL))
    async with FakeDraKubelet(short_dir / "registry") as kubelet, old:
        await kubelet.next_registration()
        new = instance(short_dir, NEW, CountingClaims(DRIVER, POOL))
        async with new:
            await kubelet.next_registration()
            await asyncio.wait_for(new.wait_registered(), 5)
            assert await asyncio.wait_for(old.handover.superseded(), 5) == new.registration_socket
            gone = asyncio.create_task(old.handover.successors_gone())
            assert old.handover.successors() == [new.registration_socket]
        await asyncio.wait_for(gone, 5)
        assert old.handover.successors() == []
        assert not await old.hand_over(within=0.1)
