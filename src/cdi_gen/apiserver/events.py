"""Kubernetes Events (``events.k8s.io/v1``) the agent records about the objects it serves:
deduplicated, coalesced and rate-limited, so that a device that flaps cannot flood the API
server.

:class:`EventRecorder` is the one way to say something on an object's Events (a pod's, or a
ResourceClaim's): :meth:`EventRecorder.record` is called on the agent's loop, never waits and
never raises; one writer task writes what was recorded, in order:

- **deduplicated**: the same thing said again of the same object (its UID, type, reason,
  action and note) within :data:`SERIES_SECONDS` of the Event first written is counted in that
  Event's ``series`` (a merge patch of ``count`` and ``lastObservedTime``), not a new Event;
- **coalesced**: what is recorded while earlier writes wait is kept once per key with its
  count, and a key said again moves behind the others, so that the last Event written is the
  latest thing said;
- **rate-limited**: every write takes a token of one bucket (:data:`BURST` at once, then one
  each ``1 / RATE`` seconds); at most :data:`MAX_PENDING` keys wait, and what is recorded
  beyond them is dropped, counted (:attr:`EventRecorder.dropped`) and logged once per burst.

``events.k8s.io/v1`` rather than ``core/v1``: its ``action`` and ``reportingController``
fields say which driver did what, its ``series`` is the API's own form of a repeated Event,
and ``kubectl describe`` and ``kubectl events`` show it on the object like any other. An
Event that cannot be written is logged (one line) and dropped: Events are informational.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from cdi_gen.apiserver.errors import ApiServerError
from cdi_gen.logs import fields
from cdi_gen.paced import PacedQueue, TokenBucket

__all__ = [
    "BURST",
    "MAX_NOTE",
    "MAX_PENDING",
    "RATE",
    "SERIES_SECONDS",
    "EventClient",
    "EventRecorder",
    "Regarding",
]

log = logging.getLogger(__name__)

#: Writes at once before the rate applies (a node's devices leaving together).
BURST = 25
#: Writes per second once the burst is spent.
RATE = 0.5
#: How long a repeated Event is counted in the first one's series (then a new Event).
SERIES_SECONDS = 600.0
#: Keys waiting for a token at most; beyond, what is recorded is dropped.
MAX_PENDING = 256
#: The API's bound on ``note`` (bytes).
MAX_NOTE = 1024
#: Keys remembered for their series at most (the oldest forgotten first).
MAX_SERIES = 1024
_MAX_FIELD = 128

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True, slots=True)
class Regarding:
    """The object an Event is about (its ``regarding``): a pod, or a ResourceClaim."""

    kind: str
    namespace: str
    name: str
    uid: str
    api_version: str = "v1"

    def wire(self) -> dict[str, str]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
        }


class EventClient(Protocol):
    """The API calls the recorder makes (:class:`~cdi_gen.apiserver.client.ApiClient`'s)."""

    async def create_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]: ...

    async def patch_event(
        self, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class _Key:
    regarding: Regarding
    type: EventType
    reason: str
    action: str
    note: str


@dataclass(slots=True)
class _Pending:
    count: int
    last: datetime.datetime


@dataclass(slots=True)
class _Series:
    name: str
    count: int
    started: float


def _clip(text: str, limit: int) -> str:
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


def _micro(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventRecorder:
    """Events of ``controller`` (the driver's name) from ``instance`` (its node), written
    through ``client`` on the loop that calls :meth:`record`."""

    def __init__(
        self,
        client: EventClient,
        controller: str,
        instance: str,
        *,
        bucket: TokenBucket | None = None,
        series_seconds: float = SERIES_SECONDS,
        max_pending: int = MAX_PENDING,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime.datetime] | None = None,
    ) -> None:
        self.client = client
        self.controller = _clip(controller, _MAX_FIELD)
        self.instance = _clip(instance, _MAX_FIELD)
        self.bucket = bucket if bucket is not None else TokenBucket(BURST, RATE, clock)
        self.series_seconds = series_seconds
        self.max_pending = max_pending
        self._clock = clock
        self._now = now or (lambda: datetime.datetime.now(datetime.UTC))
        self._pending: PacedQueue[_Key, _Pending] = PacedQueue(self._write_one, self.bucket)
        self._series: OrderedDict[_Key, _Series] = OrderedDict()
        #: Records dropped because :data:`MAX_PENDING` keys already waited.
        self.dropped = 0
        self._dropping = False
        #: Events created and series patches written (tests and metrics read them).
        self.written = 0

    def record(
        self, regarding: Regarding, type: EventType, reason: str, action: str, note: str
    ) -> None:
        """Say ``note`` on ``regarding``'s Events (on the loop; never waits, never raises)."""
        if self._pending.closed:
            return
        key = _Key(
            regarding,
            type,
            _clip(reason, _MAX_FIELD),
            _clip(action, _MAX_FIELD),
            _clip(note, MAX_NOTE),
        )
        when = self._now()
        pending = self._pending.waiting(key)
        if pending is None:
            if len(self._pending) >= self.max_pending:
                self.dropped += 1
                if not self._dropping:
                    self._dropping = True
                    log.warning(
                        "%d Events wait to be written; more are dropped until they are",
                        len(self._pending),
                        extra=fields(driver=self.controller),
                    )
                return
            pending = _Pending(0, when)
        pending.count += 1
        pending.last = when
        self._pending.put(key, pending)  # said again: behind the others

    async def close(self) -> None:
        """Stop writing; what still waits is dropped."""
        await self._pending.close()

    async def _write_one(self, key: _Key, pending: _Pending) -> None:
        if len(self._pending) < self.max_pending:
            self._dropping = False
        try:
            await self._write(key, pending)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an Event is informational: logged, never retried
            log.warning(
                "Event %s on %s %s/%s not written: %s",
                key.reason,
                key.regarding.kind,
                key.regarding.namespace,
                key.regarding.name,
                exc,
                extra=fields(driver=self.controller),
            )

    async def _write(self, key: _Key, pending: _Pending) -> None:
        series = self._series.get(key)
        ns = key.regarding.namespace
        if series is not None and self._clock() - series.started < self.series_seconds:
            count = series.count + pending.count
            patch = {"series": {"count": count, "lastObservedTime": _micro(pending.last)}}
            try:
                await self.client.patch_event(ns, series.name, patch)
            except ApiServerError as exc:
                if exc.status != 404:
                    raise
                # Expired meanwhile (the API server's TTL): a new Event says it again.
            else:
                series.count = count
                self._series.move_to_end(key)
                self.written += 1
                return
        name = f"{key.regarding.name[:236]}.{os.urandom(8).hex()}"
        event: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "eventTime": _micro(pending.last),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": key.action,
            "reason": key.reason,
            "type": key.type,
            "regarding": key.regarding.wire(),
            "note": key.note,
        }
        if pending.count > 1:  # coalesced while it waited: a series from the start
            event["series"] = {"count": pending.count, "lastObservedTime": _micro(pending.last)}
        await self.client.create_event(ns, event)
        self.written += 1
        self._series[key] = _Series(name, pending.count, self._clock())
        self._series.move_to_end(key)
        while len(self._series) > MAX_SERIES:
            self._series.popitem(last=False)
