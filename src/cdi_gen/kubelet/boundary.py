"""The one place where the kubelet's gRPC threads meet the agent's asyncio loop.

The agent's state lives on its loop: the device boards, the DRA pool, the API client. The
kubelet's gRPC handlers run on server threads. Every crossing between the two goes through
this module, in one of three ways:

* a value the loop changes and threads wait on: :class:`Versioned` (a version number that
  grows on every change, awaited on the loop by :meth:`Versioned.wait_newer` or blocked on by
  a server thread in :meth:`Versioned.wait_newer_blocking`). Each reader keeps its own
  last-seen version, so every reader sees every change (a shared queue would hand each
  change to one reader only). The kubelet's device board and the DRA device pool are built
  on it; their snapshots are immutable, so any thread may read them, but only the loop's
  thread changes them;
* a coroutine a thread has the loop run and waits for, bounded: :class:`LoopBridge` (the
  claims a NodePrepareResources reads through the API client);
* a thread waking the loop: :func:`wake` (an ``asyncio.Event`` set from a server thread), and
  the loop awaiting a thread's ``threading.Event``: :func:`wait_for_thread`.

What only the loop may change checks it: :class:`LoopOwned` binds to the first thread that
changes it and refuses (:class:`WrongThreadError`) a change from any other, counting it in
:func:`wrong_thread_changes`, which the tests that drive the real gRPC handlers watch. The
check is one comparison of thread idents, on changes only (never on a read).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = [
    "LoopBridge",
    "LoopGoneError",
    "LoopOwned",
    "Versioned",
    "WrongThreadError",
    "wait_for_thread",
    "wake",
    "wrong_thread_changes",
]

T = TypeVar("T")

#: Each refused change, as its message (a count would hide which object it was).
_refused: list[str] = []


def wrong_thread_changes() -> list[str]:
    """The changes of loop-owned state refused so far in this process, oldest first."""
    return list(_refused)


class WrongThreadError(RuntimeError):
    """Loop-owned state changed from a thread other than its loop's."""


def _refuse(what: str) -> None:
    _refused.append(what)
    raise WrongThreadError(f"{what}: only its loop's thread may do that")


class LoopGoneError(RuntimeError):
    """The loop a thread asked to run something is closed (the agent is stopping)."""


class LoopOwned:
    """State that only one thread, its loop's, changes; bound to the first that does.

    Bound on first change rather than at construction: the owners are built before their
    loop runs in places (the agent's wiring, tests), and the first change is always the
    loop's in the agent.
    """

    _owner: int | None = None

    def _check_owner(self) -> None:
        """Refuse a change from any thread but the owner's (the one hot-path cost: a
        thread ident and a comparison)."""
        me = threading.get_ident()
        owner = self._owner
        if owner == me:
            return
        if owner is None:
            self._owner = me
            return
        _refuse(f"{type(self).__name__} changed on thread {threading.current_thread().name}")


class Versioned(LoopOwned):
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
        # The asyncio.Event below is not thread-safe: a change from a server thread would
        # wake the loop's waiters late or never.
        self._check_owner()
        with self._condition:
            self._version += 1
            self._condition.notify_all()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def interrupt(self) -> None:
        """Wake every blocking waiter without a change, so that it re-checks its own
        reasons to stop (a server shutting down, a client gone). Any thread may call it."""
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


class LoopBridge:
    """Coroutines started on ``loop`` from another thread, whose results that thread
    waits for (:mod:`concurrent.futures`: cancelling one cancels it on the loop too)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def start(self, call: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``call`` on the loop. Raises :class:`LoopGoneError` (``call`` closed, never run)
        when the loop is closed, and :class:`WrongThreadError` on the loop's own thread, where
        waiting for the result would stop the loop that computes it."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            call.close()
            _refuse("a coroutine started through the bridge, waited for on its own loop")
        try:
            return asyncio.run_coroutine_threadsafe(call, self.loop)
        except RuntimeError as exc:  # the loop is closed: the agent is stopping
            call.close()
            raise LoopGoneError(str(exc)) from None


def wake(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    """Set ``event`` of ``loop`` from another thread; nothing when the loop is closed (the
    agent stopped: nobody waits any more)."""
    if not loop.is_closed():
        loop.call_soon_threadsafe(event.set)


async def wait_for_thread(event: threading.Event) -> None:
    """Wait on the loop, without blocking it, until a thread sets ``event``."""
    await asyncio.get_running_loop().run_in_executor(None, event.wait)
