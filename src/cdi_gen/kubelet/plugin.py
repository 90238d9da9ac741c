"""The protocol the agent holds each class's device plugin through.

The agent starts and stops its device plugins, and reads their registrations for
``/readyz``, only through :class:`KubeletPlugin`, so it imports no grpc until a kubelet is
used. The DRA plugin is not held this way: the DRA driver (:mod:`cdi_gen.driver`) builds,
starts and stops its :class:`~cdi_gen.kubelet.draplugin.DraPlugin` itself.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["KubeletPlugin"]


class KubeletPlugin(Protocol):
    """One plugin the kubelet talks to: served on its socket(s), registered, restartable."""

    @property
    def registrations(self) -> int:
        """Successful registrations so far; 0 means the kubelet does not know it yet."""
        ...

    async def start(self) -> None:
        """Serve, then register in the background; raise if the socket cannot be served."""
        ...

    async def stop(self, grace: float = 1.0) -> None:
        """Stop serving and registering; never raises for a stopped plugin."""
        ...
