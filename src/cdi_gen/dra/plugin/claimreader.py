"""Claims read for the kubelet's gRPC threads from the API client, which lives on the agent's
asyncio loop: :class:`ApiClaimReader`, the driver's
:class:`~cdi_gen.dra.plugin.claims.ClaimReader`, crossing through
:class:`~cdi_gen.kubelet.boundary.LoopBridge`.

Whatever the API server answers becomes, per claim, the claim or one
:class:`~cdi_gen.errors.ClaimError` naming it and why: an answer that is not a ResourceClaim
(not JSON, another kind, a result without a device) as much as a refusal or no answer in
time, so that a hostile or broken server costs that claim's error, never a traceback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cdi_gen.errors import ClaimError, quote
from cdi_gen.kubelet.boundary import LoopBridge, LoopGoneError
from cdi_gen.model import ClaimView

if TYPE_CHECKING:
    from cdi_gen.apiserver.client import ApiClient

__all__ = ["ApiClaimReader"]

log = logging.getLogger(__name__)

#: Longest part of a decoding error quoted in a claim's error.
_WHY_LIMIT = 200


class ApiClaimReader:
    """:meth:`read_claims` for a thread other than the loop's: runs
    :meth:`ApiClient.get_claim` on ``loop`` (through a
    :class:`~cdi_gen.kubelet.boundary.LoopBridge`) for every claim at once and waits at most
    ``timeout`` seconds (or less, when the caller has less), so a stalled API server costs
    each claim its error, never a stuck NodePrepareResources."""

    def __init__(
        self, client: ApiClient, loop: asyncio.AbstractEventLoop, *, timeout: float = 10.0
    ) -> None:
        self._client = client
        self._bridge = LoopBridge(loop)
        self._timeout = timeout

    def read_claims(
        self, refs: Sequence[tuple[str, str]], timeout: float
    ) -> list[ClaimView | ClaimError]:
        """Each claim of ``refs`` (namespace, name), in order, or the :class:`ClaimError`
        naming it and why: not found, API error, an answer that is not a claim, no answer
        within ``timeout`` seconds (at most the reader's own), agent stopping. Never call it
        from the loop's own thread."""
        wait = max(0.0, min(timeout, self._timeout))
        pending: list[concurrent.futures.Future[ClaimView] | ClaimError] = []
        for namespace, name in refs:
            try:
                pending.append(self._bridge.start(self._client.get_claim(namespace, name)))
            except LoopGoneError as exc:
                pending.append(ClaimError(f"ResourceClaim {namespace}/{name}: {exc}"))
        futures = [f for f in pending if isinstance(f, concurrent.futures.Future)]
        concurrent.futures.wait(futures, wait)
        return [
            future if isinstance(future, ClaimError) else _outcome(namespace, name, future, wait)
            for (namespace, name), future in zip(refs, pending, strict=True)
        ]


def _outcome(
    namespace: str,
    name: str,
    future: concurrent.futures.Future[ClaimView],
    waited: float,
) -> ClaimView | ClaimError:
    what = f"ResourceClaim {namespace}/{name}"
    if not future.done():
        future.cancel()  # cancels the call on the loop too
        return ClaimError(f"{what}: the API server did not answer within {waited:g} s")
    if future.cancelled():
        return ClaimError(f"{what}: cancelled (agent stopping)")
    exc = future.exception()
    if exc is None:
        return future.result()
    if isinstance(exc, ClaimError):
        return exc
    # get_claim names every failure it expects (a ClaimError): anything else is a bug here,
    # which still costs only this claim its error (its traceback at debug level).
    log.debug("%s: reading it failed unexpectedly", what, exc_info=exc)
    why = f"{type(exc).__name__}: {quote(str(exc), _WHY_LIMIT)}"
    return ClaimError(f"{what}: cannot be read ({why})")
