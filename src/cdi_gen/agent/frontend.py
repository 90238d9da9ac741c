"""What serves a class's devices to the kubelet: one :class:`Frontend` per kubelet API.

The agent's class runners (:mod:`cdi_gen.agent.runner`) publish through a :class:`Frontend` at
their two points (the withdrawal before the spec write, the new list after it) and never
know which API is behind it: :mod:`~cdi_gen.deviceplugin.frontend` serves a class as a
kubelet device plugin, :mod:`~cdi_gen.dra.driver.frontend` through the node's DRA driver. Each is
built in its module and given what it needs (:class:`~cdi_gen.retry.Tools`, a class's
:class:`~cdi_gen.retry.Failures`);
none holds the agent. The grpc and DRA modules load only when a frontend starts or is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from cdi_gen.model import AdvertisedDevice, DiscoveredDevice

__all__ = ["Frontend"]


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
