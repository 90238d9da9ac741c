"""Retries: a wait that doubles between a floor and a bound, the log lines a repeated failure
is worth, and the one guarded retry every loop goes through.

Every retry loop of the agent (a spec write, a plugin or the DRA driver that cannot start, a
registration the kubelet refuses, a publisher that failed) is a :class:`Retry`: its waits are
one :class:`Backoff` bounded by the run's ``retry_max_seconds`` (:func:`bounded`), and each
failure goes through :meth:`Retry.failed`, which counts it (in
``cdi_gen_failures_total{resource, reason}`` where the loop counts) and logs it on
:meth:`Backoff.failed`'s rule.
Its waits never go below :data:`FLOOR_SECONDS`, whatever the caller or a setting asks: a wait
of 1e-9 s once made 46,765 start attempts in 2 s, at full CPU, with 163 MiB of log. (The
run's setting ``retry_max_seconds`` is refused below the floor at load; the clamp here is for
every other caller.)

A failure that repeats is logged when :meth:`Backoff.failed` says so: on attempts 1, 2, 4, 8,
16, … (one line per doubling of the attempts), and at once for a message not seen before in
this run of failures (the first :data:`NEW_MESSAGES` of them: two causes taking turns, or a
message that quotes something changing, must not bring back a line per attempt). An outage
of a day is a dozen lines, while every attempt is still counted in the metrics.
:func:`describe` gives every failure a message, also an exception whose ``str()`` is empty.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from cdi_gen.logs import fields
from cdi_gen.metrics import Metrics

__all__ = [
    "FLOOR_SECONDS",
    "NEW_MESSAGES",
    "Backoff",
    "Failures",
    "Retry",
    "Spawn",
    "Tools",
    "bounded",
    "describe",
]

log = logging.getLogger("cdi_gen.agent.agent")

#: Shortest wait between two attempts of anything.
FLOOR_SECONDS = 0.1
#: Distinct messages of one run of failures logged as soon as they appear.
NEW_MESSAGES = 8
#: Longest message :func:`describe` gives (a failure may quote a whole file or answer).
DESCRIBE_LIMIT = 300


def _seconds(value: float, floor: float) -> float:
    # NaN compares false with everything and would slip through max().
    return floor if math.isnan(value) else max(value, floor)


class Backoff:
    """The waits of one retry loop: ``initial`` doubled after each failure up to ``maximum``;
    both raised to :data:`FLOOR_SECONDS` (and ``maximum`` to ``initial``) when lower."""

    def __init__(self, initial: float = 0.5, maximum: float = 30.0) -> None:
        self.initial = _seconds(initial, FLOOR_SECONDS)
        self.maximum = _seconds(maximum, self.initial)
        #: Failures in a row (0 after a success).
        self.attempts = 0
        self._delay = self.initial
        self._seen: set[str] = set()

    @property
    def delay(self) -> float:
        """The wait before the next attempt."""
        return self._delay

    def failed(self, why: str = "") -> bool:
        """Count one failure (``why`` is its message) and step the wait up; whether this one
        deserves a log line (see the module docstring)."""
        self.attempts += 1
        if self.attempts > 1:
            self._delay = min(self._delay * 2, self.maximum)
        n = self.attempts
        new = why not in self._seen and len(self._seen) < NEW_MESSAGES
        if new:
            self._seen.add(why)
        return new or n & (n - 1) == 0

    def succeeded(self) -> None:
        """Back to the first wait: the next failure is a new one."""
        self.attempts = 0
        self._delay = self.initial
        self._seen.clear()


def describe(exc: BaseException) -> str:
    """One line saying what failed: the exception's message, its lines joined with ``; ``,
    other control characters escaped, cut to :data:`DESCRIBE_LIMIT`; its type and ``repr``
    when the message is empty (an ``assert`` or a bare ``raise SomeError()`` still says what
    happened)."""
    lines = (" ".join(line.split()) for line in str(exc).splitlines())
    text = "; ".join(line for line in lines if line)
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if not text:
        text = f"{type(exc).__name__} without a message: {exc!r}"
    if len(text) > DESCRIBE_LIMIT:
        text = text[:DESCRIBE_LIMIT] + f"... ({len(text)} characters)"
    return text


def bounded(longest: float, first: float = 0.5) -> Backoff:
    """The waits of one retry loop of the agent: from ``first`` (or less, when that is the
    bound) up to ``longest`` (the run's ``retry_max_seconds``)."""
    return Backoff(min(first, longest), longest)


#: ``spawn(work, name)``: run ``work`` as a task of the agent's group (cancelled on stop;
#: closed unrun when the agent is not running).
Spawn = Callable[[Coroutine[Any, Any, None], str], None]


@dataclass(frozen=True, slots=True)
class Tools:
    """What the agent lends its class runners and frontends: the metrics, the bound of every
    retry loop (``retry_max_seconds``) and its task group (``spawn``)."""

    metrics: Metrics
    retry_max_seconds: float
    spawn: Spawn

    def backoff(self, first: float = 0.5) -> Backoff:
        """The waits of one retry loop (see :func:`bounded`)."""
        return bounded(self.retry_max_seconds, first)


class Failures:
    """One class's failures (or one of its devices'): each counted in
    ``cdi_gen_failures_total{resource, reason}`` and logged with the resource's fields."""

    def __init__(self, metrics: Metrics, resource: str) -> None:
        self.metrics = metrics
        self.resource = resource

    def __call__(
        self, reason: str, message: str, *args: object, device: str = "", logged: bool = True
    ) -> None:
        """Count one failure and log it, unless not ``logged`` (a repeat its backoff leaves
        out of the log)."""
        self.metrics.failures.labels(self.resource, reason).inc()
        if not logged:
            return
        extra = fields(
            resource=self.resource, reason=reason, **({"device": device} if device else {})
        )
        if reason == "internal":
            log.exception(message, *args, extra=extra)
        elif reason in ("device-skipped", "version", "invalid-device"):
            log.warning(message, *args, extra=extra)
        else:
            log.error(message, *args, extra=extra)


class Retry:
    """One guarded retry loop: its waits (``backoff``), and each failure counted and logged.

    A failure is reported in one of two ways, as the loop always did: through a class's
    ``failures`` (counted under its resource and ``reason``, logged with its fields), or
    through ``logger`` at ``level`` with ``extra``, counted by ``count`` when given (a loop
    below the agent has no metrics; its caller counts through a hook). Either way it is
    logged only when :meth:`Backoff.failed` says so (a repeat once per doubling).

    Messages are ``%``-templates over a mapping: ``%(attempt)d``, ``%(delay)g`` and
    ``%(why)s`` are the failure's, the rest the caller's (:meth:`failed`'s ``values``).
    """

    def __init__(
        self,
        backoff: Backoff,
        *,
        logger: logging.Logger | None = None,
        level: int = logging.ERROR,
        extra: Mapping[str, object] | None = None,
        failures: Failures | None = None,
        reason: str = "",
        count: Callable[[], None] | None = None,
    ) -> None:
        self.backoff = backoff
        self.logger = logger or log
        self.level = level
        self.extra = extra
        self.failures = failures
        self.reason = reason
        self.count = count

    @property
    def attempts(self) -> int:
        """Failures in a row (0 after a success)."""
        return self.backoff.attempts

    @property
    def delay(self) -> float:
        """The wait before the next attempt."""
        return self.backoff.delay

    def failed(
        self,
        why: str,
        message: str,
        *,
        reason: str | None = None,
        level: int | None = None,
        exc_info: BaseException | bool | None = None,
        **values: object,
    ) -> bool:
        """Count one failure (``why`` is its message), step the wait up and log ``message``
        if the backoff says this one deserves a line; whether it did."""
        logged = self.backoff.failed(why)
        args = {"attempt": self.backoff.attempts, "delay": self.backoff.delay, "why": why}
        args.update(values)
        if self.failures is not None:
            self.failures(reason or self.reason, message, args, logged=logged)
            return logged
        if self.count is not None:
            self.count()
        if logged:
            self.logger.log(
                self.level if level is None else level,
                message,
                args,
                extra=dict(self.extra) if self.extra else None,
                exc_info=exc_info,
            )
        return logged

    def succeeded(self) -> None:
        """Back to the first wait: the next failure is a new one."""
        self.backoff.succeeded()

    def ran(self, seconds: float) -> None:
        """An attempt that ran ``seconds`` before it failed: as long as the longest wait,
        it counts as healthy, and its failure as a new one."""
        if seconds >= self.backoff.maximum:
            self.backoff.succeeded()

    async def until(self, attempt: Callable[[], Awaitable[bool]]) -> None:
        """Retry ``attempt()`` (whose first try failed) after each wait until it returns
        True."""
        while True:
            await asyncio.sleep(self.backoff.delay)
            if await attempt():
                return
