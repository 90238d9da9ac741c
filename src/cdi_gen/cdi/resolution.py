"""Whether CDI names resolve as the container runtime will resolve them, asked by the kubelet
plugins before they answer: Allocate (device plugin) and NodePrepareResources (DRA) hand the
kubelet only names the runtime can find in its spec folders (priority, conflicts, a foreign
spec shadowing ours).

The answer comes from :class:`cdi_gen.cdi.registry.SpecCache` behind the
:class:`SpecResolver` protocol: from its cache, on the calling thread, when no folder changed
but by the agent's own writes (which the writer told it of: a DRA claim's own spec written
just before its names are checked costs no scan), else from one scan on a worker shared by
every plugin and bounded by :data:`SPEC_CHECK_SECONDS`, so a hung or hostile folder holds
that one worker and later checks time out, never the gRPC server's threads.
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Iterable
from typing import Protocol

__all__ = ["SPEC_CHECK_SECONDS", "SpecResolver", "unresolved"]

#: Longest a check waits for the spec folders to be read when they changed (a scan reads at
#: most a capped amount per file; this bounds a hung filesystem).
SPEC_CHECK_SECONDS = 5.0


class SpecResolver(Protocol):
    """What the plugins need from :class:`cdi_gen.cdi.registry.SpecCache`.

    A resolver may also offer ``unresolved_if_fresh(names) -> list[str] | None``: the same
    answer without reading any folder (what the agent itself wrote it knows), or None when
    the folders must be read first.
    """

    def unresolved(self, qualified_names: Iterable[str]) -> list[str]:
        """One message per name a runtime could not resolve; empty when all resolve."""
        ...


@functools.cache
def _spec_scans() -> concurrent.futures.ThreadPoolExecutor:
    # One worker for every plugin: a stuck scan holds one thread and later checks time
    # out instead of piling threads up.
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cdi-gen-spec-scan")


def unresolved(resolver: SpecResolver, qualified_names: list[str]) -> list[str]:
    """One message per name of ``qualified_names`` the runtime could not resolve (empty: all
    resolve). Raises :class:`TimeoutError`, saying so, when the folders changed and were not
    read within :data:`SPEC_CHECK_SECONDS`."""
    fast = getattr(resolver, "unresolved_if_fresh", None)
    answer: list[str] | None = fast(qualified_names) if fast is not None else None
    if answer is not None:
        return answer
    scan = _spec_scans().submit(resolver.unresolved, qualified_names)
    try:
        return scan.result(timeout=SPEC_CHECK_SECONDS)
    except TimeoutError:
        raise TimeoutError(
            f"the spec folders were not read within {SPEC_CHECK_SECONDS:g}s"
        ) from None
