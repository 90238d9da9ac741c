"""The DRA kubelet stand-in itself (tests/fakes/drakubelet.py): its stop always ends.

Every DRA test leaves ``async with FakeDraKubelet(...)`` through :meth:`FakeDraKubelet.stop`,
often while the plugin watcher is still registering a socket (the second instance of a
rolling update). On Python 3.11 a cancel that lands in the loop turn in which an awaited call
ends can be lost: ``asyncio.wait_for`` returns the inner result instead (measured with the
fake's own dial, a grpc.aio ``channel_ready`` under ``wait_for``: 145 of 2000 cancels), and
the watcher went on polling while the stop waited for it, without bound, until pytest-timeout
failed test_dra_agent.py's rolling update test after 60 s.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from tests.fakes.drakubelet import FakeDraKubelet

pytestmark = pytest.mark.timeout(60)


def _watchers() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__name__", "") == "_watch"]


async def _stopped(kubelet: FakeDraKubelet) -> None:
    """Stop ``kubelet``; fail if the stop has not returned within 10 s. Waited for beside it,
    not around it: a cancel scope's own cancel would end a stuck watcher and hide the hang."""
    stop = asyncio.ensure_future(kubelet.stop())
    done, _ = await asyncio.wait([stop], timeout=10)
    if not done:
        for task in [stop, *_watchers()]:
            task.cancel()
        raise AssertionError(f"the fake kubelet's stop did not return within 10s: {_watchers()}")
    stop.result()
    assert not _watchers()


async def test_a_stop_ends_the_watcher_even_when_its_call_lost_the_cancel(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registration in flight ends as if the cancel had come a moment late (what 3.11's
    wait_for does with it): the stop still returns, bounded, and no watcher is left."""
    registry = short_dir / "reg"
    registry.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as plugin:
        plugin.bind(str(registry / "example.com-reg.sock"))
        registering = asyncio.Event()

        async def register_losing_the_cancel(self: FakeDraKubelet, path: Path) -> None:
            registering.set()
            try:
                await asyncio.Event().wait()  # the call in flight
            except asyncio.CancelledError:
                return  # ended in the cancel's turn: its outcome, not the cancel

        monkeypatch.setattr(FakeDraKubelet, "_register", register_losing_the_cancel)
        kubelet = FakeDraKubelet(registry)
        await kubelet.start()
        await asyncio.wait_for(registering.wait(), 10)
        await _stopped(kubelet)
        # And it can be started and stopped again (a kubelet restart).
        registering.clear()
        await kubelet.restart()
        await asyncio.wait_for(registering.wait(), 10)
        await _stopped(kubelet)
