"""first_of: the first of several awaitables, the others cancelled and ended before it returns,
and a cancellation of the caller never swallowed; set_within, an event's wait with a timeout
that never loses a cancellation."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.dra.plugin.publisher import SlicePublisher
from cdi_gen.waits import first_of, set_within


class Waiter:
    """An awaitable that ends when told, and says whether it was cancelled and has ended."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = False
        self.ended = False

    async def wait(self, result: object = None) -> object:
        self.started.set()
        try:
            await self.go.wait()
            if isinstance(result, BaseException):
                raise result
            return result
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self.ended = True


async def test_the_first_done_is_returned_and_the_others_are_cancelled_and_ended() -> None:
    first, other = Waiter(), Waiter()
    first.go.set()
    ended = await first_of(first.wait("registered"), other.wait())
    assert ended[0] == "registered"
    assert isinstance(ended[1], asyncio.CancelledError)
    assert other.cancelled and other.ended


async def test_an_exception_is_handed_back_not_raised() -> None:
    failing, other = Waiter(), Waiter()
    failing.go.set()
    ended = await first_of(failing.wait(ValueError("broken")), other.wait())
    assert isinstance(ended[0], ValueError) and str(ended[0]) == "broken"
    assert other.ended


async def test_after_the_timeout_every_awaitable_is_cancelled() -> None:
    a, b = Waiter(), Waiter()
    ended = await first_of(a.wait(), b.wait(), timeout=0.01)
    assert all(isinstance(e, asyncio.CancelledError) for e in ended)
    assert a.cancelled and b.cancelled


async def test_a_cancelled_caller_raises_once_every_awaitable_has_ended() -> None:
    """The agent's SIGTERM: the caller's cancellation propagates, it is not handed back."""
    a, b = Waiter(), Waiter()
    caller = asyncio.ensure_future(first_of(a.wait(), b.wait()))
    await a.started.wait()
    await b.started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert a.ended and b.ended


async def test_an_event_set_as_its_waiter_is_cancelled_still_cancels_it() -> None:
    # asyncio.wait_for on 3.11 returns when the event is set in the step its waiter is
    # cancelled, and the cancellation is lost: the agent's stop then hung on a runner
    # waiting for a slice write (the publisher's wait below).
    event = asyncio.Event()
    waiting = asyncio.ensure_future(set_within(event, 10))
    await asyncio.sleep(0)
    event.set()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await set_within(event, 0.01)
    assert not await set_within(asyncio.Event(), 0.01)
    # A timeout already passed: False even for an event that is set (a due timer wins).
    assert not await set_within(event, 0)


async def test_the_publishers_wait_is_cancelled_even_when_the_pool_is_published_then() -> None:
    pool = DevicePool()
    publisher = SlicePublisher(cast(Any, None), "example.com", "n", pool)
    waiting = asyncio.ensure_future(publisher.published(1, 10))
    await asyncio.sleep(0)
    publisher._mark_published(1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
