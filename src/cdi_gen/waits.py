"""The loop's wait for the first of several things: the one way the agent races awaitables.

A supervisor waits for a registration or a kubelet restart, the DRA driver for the older
instance's handover or its own stop, the slice publisher for a pool change, a deletion or
its retry delay. Each wants the same three steps, and each step has gone wrong once by hand:
wait until one is done (or a timeout passes), cancel the others, and wait for every one of
them to end, so that none outlives the wait with its connection or file open. The last
step hands the awaitables' own ends (a result, an exception, a ``CancelledError``) back as
values, while a cancellation of the waiting task itself (the agent stopping) still raises:
suppressing ``CancelledError`` around that step once swallowed SIGTERM for good.

:func:`set_within` is the one wait for an event with a timeout: ``asyncio.wait_for`` on
Python 3.11 returns normally when the event is set in the same step as the waiting task is
cancelled, and the cancellation is lost (the agent's stop then hung on a runner waiting for
a slice write).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

__all__ = ["first_of", "set_within"]


async def first_of(*awaitables: Awaitable[Any], timeout: float | None = None) -> list[Any]:  # noqa: ASYNC109
    """Wait until one of ``awaitables`` is done or ``timeout`` seconds pass, cancel the
    rest, and return how each ended, in order: its result, or the exception it raised (a
    ``CancelledError`` for one cancelled here). Raises only when the caller is cancelled,
    once every awaitable has ended."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
    return ended


async def set_within(event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109
    """Whether ``event`` is set within ``timeout`` seconds; a cancellation of the caller
    always raises, even when the event is set in the same step. A timeout that has passed
    already (0 or less) is False whatever the event, as ``asyncio.wait_for`` answered it: a
    timer that is due wins over a wakeup (the udev monitor's resync, under a storm of events,
    would otherwise never come)."""
    if timeout <= 0:
        await asyncio.sleep(0)  # a step, as every wait gives the loop
        return False
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True
