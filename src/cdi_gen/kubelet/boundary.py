"""A value many readers await: a version number that grows on every change, and wake-ups.

The agent changes a published list from its asyncio loop; readers wait for a newer version
either on that loop (:meth:`Versioned.wait_newer`) or blocked on another thread, a gRPC
server's (:meth:`Versioned.wait_newer_blocking`), woken by a condition variable. Each reader
keeps its own last-seen version, so every reader sees every change (a shared queue would hand
each change to one reader only). The kubelet's device board and the DRA device pool are both
built on it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

__all__ = ["Versioned"]


class Versioned:
    """The version and the wake-ups; subclasses hold the value and call :meth:`_bump`."""

    def __init__(self) -> None:
        self._version = 0
        self._changed = asyncio.Event()
        self._condition = threading.Condition()
        self._closed = False

    @property
    def version(self) -> int:
        return self._version

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wake every waiter for good; readers end when they see ``closed``."""
        self._closed = True
        self._bump()

    def _bump(self) -> None:
        with self._condition:
            self._version += 1
            self._condition.notify_all()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def interrupt(self) -> None:
        """Wake every blocking waiter without a change, so that it re-checks its own
        reasons to stop (a server shutting down, a client gone)."""
        with self._condition:
            self._condition.notify_all()

    def wait_newer_blocking(
        self, version: int, timeout: float, stop: Callable[[], bool] = lambda: False
    ) -> int:
        """Block until the version is above ``version``, the value closes, ``stop()`` holds
        after an :meth:`interrupt`, or ``timeout`` seconds pass; return the version. For
        threads other than the loop's."""
        with self._condition:
            self._condition.wait_for(
                lambda: self._version > version or self._closed or stop(), timeout
            )
            return self._version

    async def wait_newer(self, version: int) -> int:
        """Return once the version is above ``version`` (at once if it already is)."""
        while self._version <= version and not self._closed:
            await self._changed.wait()
        return self._version
