"""What serves a class's devices to the kubelet: a :class:`Frontend` per kubelet API, and the
:class:`DeviceSink` a DRA class publishes into.

The agent's class runners (:mod:`cdi_gen.agent.runner`) publish each change once, to their
class's one list: a device-plugin class's board, which its
:mod:`~cdi_gen.deviceplugin.frontend` serves, or, for a DRA class, the node's DRA driver
(:mod:`~cdi_gen.dra.node`), which is both the class's pool and its frontend. Each is
built in its module and given what it needs (:class:`~cdi_gen.retry.Tools`, a class's
:class:`~cdi_gen.retry.Failures`); none holds the agent. The grpc and DRA modules load only
when a frontend starts or is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from cdi_gen.config.models import ClassConfig
from cdi_gen.model import AdvertisedDevice, DiscoveredDevice

__all__ = ["DeviceSink", "Frontend"]


class Frontend(Protocol):
    """What serves one class's devices to the kubelet."""

    async def start(self) -> None:
        """Serve: one attempt now, the retries on the agent's group. A frontend shared by
        several classes starts once. Raises only
        :class:`~cdi_gen.errors.SocketInUseError` (now or from a retry: the agent exits):
        another running copy of this agent serves its socket."""
        ...

    async def stop(self) -> None:
        """Stop serving; never raises. A shared frontend stops once."""
        ...

    def waiting(self) -> str | None:
        """For ``/readyz``: what it still waits for (``resource (why)``), or None."""
        ...


class DeviceSink(Protocol):
    """Where a DRA class's devices are published: the kubelet learns of them later."""

    def publish(
        self,
        config: ClassConfig,
        devices: Sequence[AdvertisedDevice],
        discovered: Mapping[str, DiscoveredDevice],
    ) -> bool:
        """The class ``config`` advertises ``devices`` now (``discovered`` by name, for what
        the API describes of them); True when what is offered changed and a withdrawal is
        worth waiting for (:meth:`withdrawn`)."""
        ...

    async def withdrawn(self) -> None:
        """Wait, bounded, until what :meth:`publish` withdrew is out of the kubelet's view."""
        ...

    def degraded(self, config: ClassConfig) -> str | None:
        """For ``/readyz``, still ready: how the class ``config`` is offered in a lesser
        form than it asks (a composite class as its parts alone), or None."""
        ...
