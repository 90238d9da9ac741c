"""The claims the kubelet's calls work on now, by UID: one call per claim at a time.

NodePrepareResources and NodeUnprepareResources may come at once for one claim on several of
the server's threads (the kubelet retries a call whose answer it did not get in time, and
sends a claim's unprepare as soon as its pod ends). :class:`InFlight` is the one thing the
generic part holds across a call's work: a call takes the claims no other call holds and
waits for the others, bounded by what is left of its deadline. A prepare that waited for
another prepare of the claim takes that call's answer instead of reading the claim again
(unless that call could not read it); an unprepare that waited for a prepare finds the claim
recorded and forgets it, so a record never lands after the unprepare that should have
removed it.

It also counts the calls that wait for the API server, under the same lock: a slow API
server must not take every server thread, so a call beyond ``max_reading`` gets an error for
the claims it would read at once, and the claims answered from what was prepared before are
answered whatever the API server does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager
from dataclasses import dataclass, field

from cdi_gen.dra.plugin.claims import PrepareResult

__all__ = ["Held", "InFlight"]


@dataclass(frozen=True, slots=True)
class Held:
    """One call's hold on a claim: a prepare's (its answer when it ends) or an unprepare's
    (None when it ends)."""

    prepare: bool
    ended: Future[PrepareResult | None] = field(default_factory=Future)


class InFlight:
    """The claims held by a call now; at most ``max_reading`` calls read claims at once."""

    def __init__(self, max_reading: int) -> None:
        self.max_reading = max_reading
        self._lock = threading.Lock()
        self._held: dict[str, Held] = {}
        self._reading = 0
        #: Calls that waited for another's hold (tests wait for a call to be waiting).
        self.waits = 0

    def take(
        self,
        uids: Iterable[str],
        *,
        prepare: bool,
        deadline: float,
        waiting: Callable[[list[str]], None] | None = None,
    ) -> tuple[list[str], dict[str, PrepareResult], list[str]]:
        """Hold each claim of ``uids`` for this call, waiting for a call that holds one until
        ``deadline`` (``time.monotonic()``); return the UIDs now held (:meth:`release` each),
        the answers of other prepares this ``prepare`` takes over, and the UIDs still held by
        another call at the deadline. ``waiting`` is told the UIDs held by others before the
        first wait."""
        pending = list(dict.fromkeys(uids))
        mine: list[str] = []
        answered: dict[str, PrepareResult] = {}
        waited = False
        while pending:
            others: dict[str, Held] = {}
            with self._lock:
                for uid in pending:
                    held = self._held.get(uid)
                    if held is None:
                        self._held[uid] = Held(prepare)
                        mine.append(uid)
                    else:
                        others[uid] = held
            pending = list(others)
            left = deadline - time.monotonic()
            if not others or left <= 0:
                break
            if not waited:
                waited = True
                if waiting is not None:
                    waiting(pending)
                with self._lock:
                    self.waits += 1
            wait([h.ended for h in others.values()], left, FIRST_COMPLETED)
            for uid, held in others.items():
                if not held.ended.done():
                    continue
                answer = held.ended.result()
                # Taken over unless the other call could not read the claim: its deadline
                # may have been shorter than this one's.
                if prepare and answer is not None and answer.reason != "claim-read":
                    answered[uid] = answer
                    pending.remove(uid)
        return mine, answered, pending

    def release(self, uid: str, answer: PrepareResult | None = None) -> None:
        """End this call's hold on ``uid``; ``answer``: a prepare's, for the calls waiting."""
        with self._lock:
            held = self._held.pop(uid)
        held.ended.set_result(answer)

    @contextmanager
    def reading(self) -> Iterator[bool]:
        """For the block, count this call among those reading claims: yields False (and
        counts nothing) when ``max_reading`` calls read already."""
        with self._lock:
            if self._reading >= self.max_reading:
                allowed = False
            else:
                self._reading += 1
                allowed = True
        try:
            yield allowed
        finally:
            if allowed:
                with self._lock:
                    self._reading -= 1
