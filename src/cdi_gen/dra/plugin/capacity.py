"""Consumable capacity (KEP-5075): a shared device published once, with shares that claims
consume, and whether the API server serves it.

A class shared in N slots (``sharing: {replicas: N}``) is, where the API server keeps
``allowMultipleAllocations``, published as one device per physical device with a capacity
``shares`` of value N. A request takes one share unless it asks for more, any whole number
from 1 to N::

    requests:
    - name: dev
      exactly:
        deviceClassName: cdi-gen.io-kvm
        capacity:
          requests:
            shares: 2

The scheduler gives each allocation of the device its own ``shareID`` and stops when the
shares are used up; NodePrepareResources answers each allocation with its share ID, and every
share gets the same CDI device (the first slot's entry: the slots' edits are the device's).
The driver builds those entries (:func:`cdi_gen.dra.driver.poolentries.shared_once`).

Where the API server does not serve it (``DRAConsumableCapacity`` off, the default of 1.35),
it drops ``allowMultipleAllocations`` and the request policy without an error, and the device
would be allocated whole to one claim. :func:`consumable_capacity` asks once at start, with a
server-side dry run of a slice create, whether the field is kept; the slots stay otherwise.
"""

from __future__ import annotations

from cdi_gen.dra.plugin.dryrun import SliceCreator, dropped
from cdi_gen.dra.plugin.dryrun import probe_slice as dry_run_slice
from cdi_gen.dra.plugin.slices import Slice, device_capacity

__all__ = ["consumable_capacity", "probe_slice"]


def probe_slice(driver: str, node: str) -> Slice:
    """A slice with one shareable device, never stored: what the dry run sends."""
    device = {"name": "probe", "allowMultipleAllocations": True, "capacity": device_capacity(2)}
    return dry_run_slice(driver, node, "capacity", {"devices": [device]})


def _kept(got: Slice) -> bool:
    devices = (got.get("spec") or {}).get("devices") or [{}]
    first = devices[0] if isinstance(devices[0], dict) else {}
    return first.get("allowMultipleAllocations") is True


async def consumable_capacity(client: SliceCreator, driver: str, node: str) -> str | None:
    """None when the API server keeps ``allowMultipleAllocations``, else why the slots stay
    (see :func:`~cdi_gen.dra.plugin.dryrun.dropped`)."""
    why = "the API server drops allowMultipleAllocations"
    return await dropped(client, probe_slice(driver, node), _kept, why)
