"""How the server threads' calls share a claim: who prepares it, and who holds it.

A NodePrepareResources call reads its claims from the API server before it takes any
claim's lock, as Kubernetes' helper library does, so no lock is ever held while the API
server answers. What a lock held across the read would buy, :class:`PendingPrepares` gives:
the call that reads a claim first owns its prepare; another prepare of that claim meanwhile
waits for the owner's answer and reads nothing, and an unprepare meanwhile waits until the
owner has recorded it and then removes it (rather than finding nothing and leaving the
record to land after it: a claim the kubelet believes unprepared, kept for ever).

:class:`ClaimLocks` is a lock per claim UID, held for a record or an unprepare (a few file
writes). A call takes the locks of all its claims at once (all or none), so two calls never
deadlock. Every wait of either is bounded by its caller's timeout; a call whose claim stays
held that long gets an error the kubelet retries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager

from cdi_gen.dra.plugin.claims import PrepareResult

__all__ = ["ClaimLocks", "PendingPrepares"]


class PendingPrepares:
    """The claims whose prepare a call owns, each with the answer it will give."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owned: dict[str, Future[PrepareResult]] = {}
        #: Times a call found a claim's prepare under way and waited for it (the event a
        #: test waits for).
        self.waits = 0

    def take(self, uids: Iterable[str]) -> tuple[list[str], dict[str, Future[PrepareResult]]]:
        """Own the prepare of each UID no other call prepares; returns the UIDs now owned
        (each to be answered with :meth:`finish`) and the others' answers to wait for."""
        owned: list[str] = []
        others: dict[str, Future[PrepareResult]] = {}
        with self._lock:
            for uid in uids:
                under_way = self._owned.get(uid)
                if under_way is not None:
                    others[uid] = under_way
                elif uid not in owned:
                    self._owned[uid] = Future()
                    owned.append(uid)
            self.waits += bool(others)
        return owned, others

    def finish(self, uid: str, result: PrepareResult) -> None:
        """Answer the owned prepare of ``uid``: the calls waiting for it get ``result``."""
        with self._lock:
            answer = self._owned.pop(uid)
        answer.set_result(result)

    def under_way(self, uid: str) -> Future[PrepareResult] | None:
        """The answer of a prepare of ``uid`` under way, for an unprepare to wait for."""
        with self._lock:
            answer = self._owned.get(uid)
            self.waits += answer is not None
        return answer


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
