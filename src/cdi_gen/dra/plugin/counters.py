"""Partitionable devices (KEP-4815): whether the API server keeps a slice's shared counters.

A composite class (``group.offer: both``) publishes a group's whole and its parts as devices
whose counters exclude each other (:func:`~cdi_gen.dra.plugin.slices.composites`). Where the
API server does not serve them (``DRAPartitionableDevices`` off, the default of 1.35), it drops
``sharedCounters`` and ``consumesCounters`` without an error, and the whole and its parts would
all be free at once. :func:`partitionable_devices` asks once at start, with a server-side dry
run of a slice create, whether the counters are kept; until it has answered, and where they
are not, the driver publishes the parts alone
(:class:`~cdi_gen.dra.driver.poolentries.PoolEntries`).
"""

from __future__ import annotations

from cdi_gen.dra.plugin.capacity import SliceCreator
from cdi_gen.dra.plugin.slices import API_VERSION, Slice

__all__ = ["partitionable_devices", "probe_slice"]


def probe_slice(driver: str, node: str) -> Slice:
    """A slice with one counter set, never stored: what the dry run sends."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-{driver}-counters-"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "sharedCounters": [{"name": "probe", "counters": {"part": {"value": "1"}}}],
        },
    }


async def partitionable_devices(client: SliceCreator, driver: str, node: str) -> str | None:
    """None when the API server keeps ``sharedCounters``, else why composite classes are
    published as their parts alone.

    A refusal of the dry run (a status the API server answered) is such a reason too: parts
    alone are safe everywhere. Raises :class:`~cdi_gen.apiserver.errors.ApiServerError` when
    there is no answer (the start is retried)."""
    from cdi_gen.apiserver.errors import ApiServerError

    try:
        got = await client.create_slice(probe_slice(driver, node), dry_run=True)
    except ApiServerError as exc:
        if exc.status is None or exc.status >= 500:
            raise
        return f"the API server refused a dry-run slice with counters: {exc}"
    if not (got.get("spec") or {}).get("sharedCounters"):
        return "the API server drops sharedCounters (DRAPartitionableDevices off)"
    return None
