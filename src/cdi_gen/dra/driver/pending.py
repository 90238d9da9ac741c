"""The prepares under way on the server threads, by claim UID.

A NodePrepareResources call reads its claims from the API server before it takes any
claim's lock, as Kubernetes' helper library does, so no lock is ever held while the API
server answers. What a lock held across the read would buy, this register gives: the call
that reads a claim first owns its prepare; another prepare of that claim meanwhile waits
for the owner's answer and reads nothing, and an unprepare meanwhile waits until the owner
has recorded it and then removes it (rather than finding nothing and leaving the record to
land after it: a claim the kubelet believes unprepared, kept for ever). Every wait is
bounded by its caller's timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import Future

from cdi_gen.dra.plugin.claims import PrepareResult

__all__ = ["PendingPrepares"]


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
