"""Claims read for the kubelet's gRPC threads: the one bridge from a synchronous caller to
the API client, which lives on the agent's asyncio loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import TYPE_CHECKING

from cdi_gen.errors import ClaimError
from cdi_gen.model import ClaimView

if TYPE_CHECKING:
    from cdi_gen.apiserver.client import ApiClient

__all__ = ["ClaimReader"]


class ClaimReader:
    """``read_claim`` for a thread other than the loop's: runs :meth:`ApiClient.get_claim`
    on ``loop`` and waits at most ``timeout`` seconds, so a stalled API server costs one
    claim's error, never a stuck NodePrepareResources."""

    def __init__(
        self, client: ApiClient, loop: asyncio.AbstractEventLoop, *, timeout: float = 10.0
    ) -> None:
        self._client = client
        self._loop = loop
        self._timeout = timeout

    def read_claim(self, namespace: str, name: str) -> ClaimView:
        """The claim, or :class:`ClaimError` naming it and why (not found, API error, no
        answer in time, agent stopping). Never call it from the loop's own thread."""
        try:
            future = asyncio.run_coroutine_threadsafe(
                self._client.get_claim(namespace, name), self._loop
            )
        except RuntimeError as exc:  # the loop is closed: the agent is stopping
            raise ClaimError(f"ResourceClaim {namespace}/{name}: {exc}") from None
        try:
            return future.result(self._timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ClaimError(
                f"ResourceClaim {namespace}/{name}: the API server did not answer within "
                f"{self._timeout:g} s"
            ) from None
        except concurrent.futures.CancelledError:
            raise ClaimError(
                f"ResourceClaim {namespace}/{name}: cancelled (agent stopping)"
            ) from None
