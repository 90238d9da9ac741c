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

from cdi_gen.dra.plugin.dryrun import SliceCreator, dropped
from cdi_gen.dra.plugin.dryrun import probe_slice as dry_run_slice
from cdi_gen.dra.plugin.slices import Slice

__all__ = ["partitionable_devices", "probe_slice"]


def probe_slice(driver: str, node: str) -> Slice:
    """A slice with one counter set, never stored: what the dry run sends."""
    counters = [{"name": "probe", "counters": {"part": {"value": "1"}}}]
    return dry_run_slice(driver, node, "counters", {"sharedCounters": counters})


async def partitionable_devices(client: SliceCreator, driver: str, node: str) -> str | None:
    """None when the API server keeps ``sharedCounters``, else why composite classes are
    published as their parts alone (see :func:`~cdi_gen.dra.plugin.dryrun.dropped`)."""
    why = "the API server drops sharedCounters (DRAPartitionableDevices off)"
    return await dropped(
        client,
        probe_slice(driver, node),
        lambda got: bool((got.get("spec") or {}).get("sharedCounters")),
        why,
    )
