"""Server streams that follow a versioned value, and the status messages every service sends.

Both kubelet plugins stream a value the agent changes: the device plugin its device list
(ListAndWatch), the DRA plugin its devices' health (NodeWatchResources). Each stream runs on
a server thread and blocks on the value's condition between sends; a :class:`StreamGate`
caps how many are open (each holds a server thread that calls need) and ends all of them
when the server's generation stops. :func:`follow` is the loop they share: send, wait for a
newer version (or a resend deadline), send again, until the value closes, the client leaves
or the server stops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import NoReturn, TypeVar

import grpc

from cdi_gen.kubelet.boundary import Versioned

__all__ = ["MAX_STATUS_CHARS", "STREAM_CHECK_SECONDS", "StreamGate", "abort", "clip", "follow"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Longest status message sent (and logged): gRPC refuses metadata over 16 KiB, which
#: the caller would see as RESOURCE_EXHAUSTED instead of our answer.
MAX_STATUS_CHARS = 1024
#: How often an idle stream checks that its client is still there. Only a safety net: a
#: client leaving wakes its stream through grpc's callback, a server stopping through
#: ``interrupt``; each check wakes the idle agent.
STREAM_CHECK_SECONDS = 30.0


def clip(text: str) -> str:
    """``text`` cut to :data:`MAX_STATUS_CHARS`, saying how much was cut."""
    if len(text) <= MAX_STATUS_CHARS:
        return text
    return f"{text[:MAX_STATUS_CHARS]}... ({len(text) - MAX_STATUS_CHARS} more characters)"


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, text: str) -> NoReturn:
    """End the call with ``code`` and ``text`` (clipped)."""
    context.abort(code, clip(text))
    raise AssertionError("unreachable: abort raises")


class StreamGate:
    """How many streams of one service are open, and the server generation they belong to.

    ``generation`` grows each time a server generation stops (:meth:`end_all`), which ends
    its streams.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.generation = 0
        self._open = 0
        self._lock = threading.Lock()

    def end_all(self) -> None:
        with self._lock:
            self.generation += 1

    def enter(self) -> int | None:
        """Count one more stream and return its generation, or None when at the limit."""
        with self._lock:
            if self._open >= self.limit:
                return None
            self._open += 1
            return self.generation

    def leave(self) -> None:
        with self._lock:
            self._open -= 1


def follow(
    gate: StreamGate,
    value: Versioned,
    context: grpc.ServicerContext,
    build: Callable[[], T],
    *,
    what: str,
    resend_seconds: float | None = None,
) -> Iterator[T]:
    """Stream ``build()`` now and after every change of ``value`` (and every
    ``resend_seconds`` without one), until ``value`` closes, the client leaves or the
    server's generation stops. ``what`` names the stream in errors (``device list of
    resource example.com/fpga``). Aborts with RESOURCE_EXHAUSTED when ``gate`` is full."""
    generation = gate.enter()
    if generation is None:
        abort(
            context,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{what}: already {gate.limit} streams open",
        )
    context.add_callback(value.interrupt)  # a client leaving wakes its stream at once

    def stopping() -> bool:
        return gate.generation != generation or not context.is_active()

    try:
        while not stopping():
            seen = value.version
            try:
                item = build()
            except Exception as exc:
                log.exception("building the %s failed", what)
                abort(context, grpc.StatusCode.INTERNAL, f"{what} failed: {exc}")
            yield item
            deadline = None if resend_seconds is None else time.monotonic() + resend_seconds
            while value.version <= seen and not value.closed and not stopping():
                wait = STREAM_CHECK_SECONDS
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    wait = min(left, wait)
                value.wait_newer_blocking(seen, wait, stopping)
            if value.closed:
                return
    finally:
        gate.leave()
