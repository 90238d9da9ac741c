"""Where device records come from, behind one small protocol.

The agent reads records from a :class:`RecordSource`: a full enumeration from
:meth:`~RecordSource.start`, then :class:`RecordBatch` es as devices change. udev is the real
source (:mod:`cdi_gen.sources.udev`, the only pyudev user); tests use a pipe-backed fake fed
from recorded data (``tests/fakes/source.py``), so nothing but the tests meant for it reads
this machine's udev database. Recordings themselves (``udevadm info --export-db`` text, the
JSON of ``cdi-gen record``, read by ``--records``) are :mod:`cdi_gen.sources.records`. An
interface that left the host for a pod's network namespace is not a device gone
(:mod:`cdi_gen.sources.netns`, which the udev watcher asks).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from cdi_gen.model import DeviceRecord

__all__ = ["RecordBatch", "RecordSource", "property_int"]


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """Records delivered together. ``full``: a complete enumeration that replaces the state."""

    records: tuple[DeviceRecord, ...]
    full: bool = False
    #: ``time.monotonic()`` when the first record of the batch arrived (0: unknown).
    received: float = 0.0


class RecordSource(Protocol):
    """A source of device records, read on the agent's event loop."""

    @property
    def source(self) -> str:
        """What the records come from, for logs ("udev", "kernel", "recorded")."""
        ...

    def start(self) -> list[DeviceRecord]:
        """Begin watching, then return a full enumeration (nothing in between is lost).

        Raises :class:`~cdi_gen.errors.DiscoveryError` when the source cannot be read.
        """
        ...

    def batches(self) -> AsyncIterator[RecordBatch]:
        """Batches in arrival order until :meth:`close`."""
        ...

    def request_resync(self) -> None:
        """Deliver a full enumeration next (after a batch discovery could not digest)."""
        ...

    def close(self) -> None:
        """Stop; a running :meth:`batches` ends. Safe to call twice."""
        ...


def property_int(text: str | None) -> int | None:
    """A numeric udev value (``MAJOR``, ``numa_node``), None when absent or not a number:
    recorded and live data alike may lack it or hold anything."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None
