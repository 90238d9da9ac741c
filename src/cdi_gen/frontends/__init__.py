"""What serves a class's devices to the kubelet: one :class:`Frontend` per kubelet API.

The agent's class runners (:mod:`cdi_gen.runner`) publish through a :class:`Frontend` at
their two points (the withdrawal before the spec write, the new list after it) and never
know which API is behind it: :mod:`~cdi_gen.frontends.deviceplugin` serves a class as a
kubelet device plugin, :mod:`~cdi_gen.frontends.dra` through the node's DRA driver. Each is
built in its module and given what it needs (:class:`Tools`, a class's :class:`Failures`);
none holds the agent. The grpc and DRA modules load only when a frontend starts or is built.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cdi_gen.backoff import Backoff
from cdi_gen.logs import fields
from cdi_gen.metrics import Metrics
from cdi_gen.model import AdvertisedDevice, DiscoveredDevice

__all__ = ["Failures", "Frontend", "Spawn", "Tools", "keep_starting"]

log = logging.getLogger("cdi_gen.agent")

#: ``spawn(work, name)``: run ``work`` as a task of the agent's group (cancelled on stop;
#: closed unrun when the agent is not running).
Spawn = Callable[[Coroutine[Any, Any, None], str], None]


class Frontend(Protocol):
    """What serves one class's devices to the kubelet."""

    def publish(
        self, devices: Sequence[AdvertisedDevice], discovered: Mapping[str, DiscoveredDevice]
    ) -> bool:
        """The class advertises ``devices`` now (``discovered`` by name, for what the API
        describes of them); True when the kubelet learns of it later and a withdrawal is
        worth waiting for (:meth:`withdrawn`)."""
        ...

    async def withdrawn(self) -> None:
        """Wait, bounded, until what :meth:`publish` withdrew is out of the kubelet's view."""
        ...

    async def start(self) -> None:
        """Serve: one attempt now, the retries on the agent's group; never raises."""
        ...

    async def stop(self) -> None:
        """Stop serving; never raises."""
        ...

    def waiting(self) -> str | None:
        """For ``/readyz``: what it still waits for (``resource (why)``), or None."""
        ...


@dataclass(frozen=True, slots=True)
class Tools:
    """What the agent lends its class runners and frontends: the metrics, the waits of one
    retry loop (:meth:`~cdi_gen.agent.Agent.backoff`) and its task group (``spawn``)."""

    metrics: Metrics
    backoff: Callable[[], Backoff]
    spawn: Spawn


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


async def keep_starting(start: Callable[[Backoff], Awaitable[bool]], backoff: Backoff) -> None:
    """Retry ``start(backoff)`` (a frontend whose first attempt failed) after each of
    ``backoff``'s waits until it returns True."""
    while True:
        await asyncio.sleep(backoff.delay)
        if await start(backoff):
            return
