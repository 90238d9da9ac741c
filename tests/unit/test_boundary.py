"""The thread boundary: loop-owned values refuse a change from another thread, and the
bridge refuses a wait on its own loop (which would stop the loop that answers it)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.kubelet.boundary import LoopBridge, WrongThreadError, wrong_thread_changes
from cdi_gen.model import PoolDevice

DEVICE = PoolDevice("fpga-0", "example.com/fpga=0", "fpga", "/sys/f0")


def test_a_change_from_a_second_thread_is_refused_and_counted() -> None:
    pool = DevicePool()
    pool.publish("fpga", [DEVICE])  # binds the pool to this thread
    before = len(wrong_thread_changes())
    with ThreadPoolExecutor(1, thread_name_prefix="grpc") as threads:
        refused = threads.submit(pool.publish, "fpga", [])
        with pytest.raises(WrongThreadError, match="DevicePool changed on thread grpc"):
            refused.result()
        # Reading a snapshot from any thread stays free.
        assert threads.submit(lambda: list(pool.devices)).result() == ["fpga-0"]
    assert len(wrong_thread_changes()) == before + 1
    assert pool.publish("fpga", [])  # the owner still may


def test_the_first_thread_to_change_a_value_owns_it() -> None:
    pool = DevicePool()
    owner = threading.Thread(target=pool.publish, args=("fpga", [DEVICE]))
    owner.start()
    owner.join()
    before = len(wrong_thread_changes())
    with pytest.raises(WrongThreadError):
        pool.close()
    assert len(wrong_thread_changes()) == before + 1


async def test_the_bridge_refuses_its_own_loop() -> None:
    bridge = LoopBridge(asyncio.get_running_loop())
    before = len(wrong_thread_changes())

    async def answer() -> int:
        return 1

    with pytest.raises(WrongThreadError, match="its own loop"):
        bridge.start(answer())
    assert len(wrong_thread_changes()) == before + 1
    assert await asyncio.to_thread(lambda: bridge.start(answer()).result(5)) == 1
