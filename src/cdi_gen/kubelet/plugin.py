"""The protocol the agent runs kubelet plugins through.

The agent starts, stops and watches plugins only through :class:`KubeletPlugin`, so a DRA
driver can run beside the device plugins without the agent knowing which API each speaks.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["KubeletPlugin"]


class KubeletPlugin(Protocol):
    """One plugin the kubelet talks to: served on its socket(s), registered, restartable."""

    @property
    def resource_name(self) -> str:
        """What the plugin serves, for logs and ``/readyz`` (resource or driver name)."""
        ...

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

    async def wait_registered(self) -> None:
        """Return once the kubelet has accepted the current registration."""
        ...
