"""Whether the API server keeps a field of a ResourceSlice: asked once, at start, with a
server-side dry run of a slice create (nothing is stored).

A field whose feature gate is off on the API server (consumable capacity, shared counters on
1.35) is dropped from what it stores without an error, and a pool that relies on it would
then be wrong. The dry run's answer is the slice as it would be stored: the field is kept
there, or it is not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from cdi_gen.dra.plugin.slices import API_VERSION, Slice

__all__ = ["SliceCreator", "dropped", "probe_slice"]


class SliceCreator(Protocol):
    """The one API server call the question needs (:class:`~cdi_gen.apiserver.client.ApiClient`)."""

    def create_slice(self, obj: Slice, *, dry_run: bool = False) -> Awaitable[Slice]: ...


def probe_slice(driver: str, node: str, purpose: str, spec: dict[str, Any]) -> Slice:
    """A slice of node ``node``'s pool with ``spec``'s fields, never stored (named for
    ``purpose`` in case an API server logs it)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-{driver}-{purpose}-"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            **spec,
        },
    }


async def dropped(
    client: SliceCreator, probe: Slice, kept: Callable[[Slice], bool], why: str
) -> str | None:
    """None when the dry run of ``probe`` answers a slice that ``kept`` accepts, else why not
    (``why`` when the field was dropped).

    A refusal of the dry run (a status the API server answered) is such a reason too: the
    form without the field works everywhere. Raises
    :class:`~cdi_gen.apiserver.errors.ApiServerError` when there is no answer (the start is
    retried)."""
    from cdi_gen.apiserver.errors import ApiServerError

    try:
        got = await client.create_slice(probe, dry_run=True)
    except ApiServerError as exc:
        if exc.status is None or exc.status >= 500:
            raise
        return f"the API server refused a dry-run slice: {exc}"
    return None if kept(got) else why
