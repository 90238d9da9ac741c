"""Work written to the API server at a pace: a token bucket, and a queue of the latest work
per key that one task on the loop drains in order, a token per item.

What is put while earlier items wait is kept once per key (the caller merges it into what
waits, :meth:`PacedQueue.waiting`), and a key put again moves behind the others, so the last
item written is the latest thing said. Used by the Events' writer and the DRA driver's notices
to its claims: a device that flaps cannot flood the API server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["PacedQueue", "TokenBucket"]

log = logging.getLogger(__name__)

K = TypeVar("K")
V = TypeVar("V")


class TokenBucket:
    """``burst`` tokens at once, one more each ``1 / rate`` seconds of ``clock``."""

    def __init__(
        self, burst: int, rate: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst = burst
        self.rate = rate
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> float:
        """Take a token: 0 when one was there, else the seconds until one is (none taken)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self.rate


class PacedQueue(Generic[K, V]):
    """Items by key, each handed to ``write`` in order, one token of ``bucket`` each, by one
    task started on the loop at the first :meth:`put`. ``write`` says its own failures (an
    exception that still escapes is logged here and the queue goes on)."""

    def __init__(self, write: Callable[[K, V], Awaitable[None]], bucket: TokenBucket) -> None:
        self.bucket = bucket
        self._write = write
        self._waiting: OrderedDict[K, V] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.closed = False

    def __len__(self) -> int:
        return len(self._waiting)

    def waiting(self, key: K) -> V | None:
        """Take what waits for ``key`` out of the queue (to merge it and put it again)."""
        return self._waiting.pop(key, None)

    def put(self, key: K, item: V) -> None:
        """``item`` for ``key``, behind the others (on the loop; nothing once closed)."""
        self._waiting.pop(key, None)
        self._waiting[key] = item
        if self.closed:
            return
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()

    async def close(self) -> None:
        """Stop writing; what still waits is dropped."""
        self.closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            if not self._waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            wait = self.bucket.take()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            key, item = self._waiting.popitem(last=False)
            try:
                await self._write(key, item)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("a paced write failed")
