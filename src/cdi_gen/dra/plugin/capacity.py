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

from collections.abc import Awaitable
from typing import Protocol

from cdi_gen.dra.plugin.slices import API_VERSION, Slice, device_capacity

__all__ = ["SliceCreator", "consumable_capacity", "probe_slice"]


class SliceCreator(Protocol):
    """The one API server call the question needs (:class:`~cdi_gen.apiserver.client.ApiClient`)."""

    def create_slice(self, obj: Slice, *, dry_run: bool = False) -> Awaitable[Slice]: ...


def probe_slice(driver: str, node: str) -> Slice:
    """A slice with one shareable device, never stored: what the dry run sends."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-{driver}-capacity-"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "probe",
                    "allowMultipleAllocations": True,
                    "capacity": device_capacity(2),
                }
            ],
        },
    }


async def consumable_capacity(client: SliceCreator, driver: str, node: str) -> str | None:
    """None when the API server keeps ``allowMultipleAllocations``, else why the slots stay.

    A refusal of the dry run (a status the API server answered) is such a reason too: the
    slots work everywhere. Raises :class:`~cdi_gen.apiserver.errors.ApiServerError` when
    there is no answer (the start is retried)."""
    from cdi_gen.apiserver.errors import ApiServerError

    try:
        got = await client.create_slice(probe_slice(driver, node), dry_run=True)
    except ApiServerError as exc:
        if exc.status is None or exc.status >= 500:
            raise
        return f"the API server refused a dry-run slice: {exc}"
    devices = (got.get("spec") or {}).get("devices") or [{}]
    first = devices[0] if isinstance(devices[0], dict) else {}
    if first.get("allowMultipleAllocations") is not True:
        return "the API server drops allowMultipleAllocations"
    return None
