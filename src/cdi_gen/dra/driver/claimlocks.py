"""A lock per claim UID: what the server threads take to record or remove a claim.

A call takes the locks of all its claims at once (all or none), so two calls never
deadlock; a call whose claim stays held past its timeout gets an error the kubelet retries.
No claim's lock is held while the API server answers (:mod:`~cdi_gen.dra.driver.pending`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager

__all__ = ["ClaimLocks"]


class ClaimLocks:
    """A lock per claim UID, taken for a set of UIDs at once (all or none)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._held: set[str] = set()
        #: Times a caller found a UID held and waited (the event a test waits for).
        self.waits = 0

    @contextmanager
    def holding(
        self, uids: Collection[str], timeout: float, on_wait: Callable[[], None] | None = None
    ) -> Iterator[bool]:
        """Hold every UID of ``uids`` for the block; yields False (holding none) when
        another call still held one after ``timeout`` seconds. ``on_wait`` is called once
        when the block has to wait."""
        wanted = frozenset(uids)
        with self._changed:
            if not wanted.isdisjoint(self._held):
                self.waits += 1
                if on_wait is not None:
                    on_wait()
            got = self._changed.wait_for(lambda: wanted.isdisjoint(self._held), max(timeout, 0))
            if got:
                self._held |= wanted
        try:
            yield got
        finally:
            if got:
                with self._changed:
                    self._held -= wanted
                    self._changed.notify_all()
