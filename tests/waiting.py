"""The suite's one polling helper: tests wait for an event or a counter, never for time.

``until`` (on the event loop; ``condition`` may be a plain function or a coroutine function,
e.g. one scraping /metrics) and ``until_sync`` (from a thread) poll ``condition`` until it
returns something truthy and return that value. On timeout they fail with one line naming
``what`` was awaited and what was last observed (``observe()`` when given, else the last value
the condition returned), so a failure says what the system was doing instead of only "timed
out".

A negative check ("X did not happen") is never "sleep, then look": wait with these helpers for a
later event that proves the system handled the moment in question (a counter of scans, attempts
or handled events moving past it), then assert that X did not happen.

``within`` is a ceiling for a broken system, not a speed target: keep it generous.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

EVERY = 0.01


def _failure(what: str, within: float, last: object) -> AssertionError:
    shown = repr(last)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return AssertionError(f"{what}: not within {within:g}s (last seen: {shown})")


@overload
async def until(
    condition: Callable[[], Awaitable[T]],
    what: str,
    within: float = ...,
    every: float = ...,
    observe: Callable[[], object] | None = ...,
) -> T: ...


@overload
async def until(
    condition: Callable[[], T],
    what: str,
    within: float = ...,
    every: float = ...,
    observe: Callable[[], object] | None = ...,
) -> T: ...


async def until(
    condition: Callable[[], object],
    what: str,
    within: float = 10.0,
    every: float = EVERY,
    observe: Callable[[], object] | None = None,
) -> object:
    """Poll ``condition`` on the running loop until it is truthy; return its value."""
    deadline = time.monotonic() + within
    while True:
        last = condition()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() >= deadline:
            raise _failure(what, within, last if observe is None else observe())
        await asyncio.sleep(every)


def until_sync(
    condition: Callable[[], T],
    what: str,
    within: float = 10.0,
    every: float = EVERY,
    observe: Callable[[], object] | None = None,
) -> T:
    """Poll ``condition`` from a thread (no event loop) until it is truthy; return its value."""
    deadline = time.monotonic() + within
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise _failure(what, within, last if observe is None else observe())
        time.sleep(every)
