"""The parts of composite groups that left the node while a prepared claim holds them.

A composite class's whole consumes the counter of each part published beside it
(:func:`~cdi_gen.dra.plugin.slices.composites`); a part withdrawn takes its counter with it,
and the scheduler would then offer the whole although the part's claim still runs. So a part
that leaves while a claim prepared here holds it stays in the pool, gone (tainted
``<driver>/gone``, which keeps new claims off it), as long as its whole is published and the
claim is prepared; it goes with the claim's unprepare (:meth:`HeldParts.keep` asked again)
or comes back present with its device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from cdi_gen.model import PoolDevice

__all__ = ["HeldParts"]


class HeldParts:
    """Per class, the parts last offered; ``held(name)`` says whether a prepared claim holds
    pool device ``name`` (False until the driver part exists)."""

    def __init__(self, held: Callable[[str], bool]) -> None:
        self.held = held
        self._offered: dict[str, dict[str, PoolDevice]] = {}

    def keep(self, class_name: str, devices: Iterable[PoolDevice]) -> tuple[PoolDevice, ...]:
        """``devices`` (one class's entries as they are to be offered), with each part offered
        before that is missing now, held, and whose whole is among them, kept as gone."""
        out = tuple(devices)
        names = {d.name for d in out}
        wholes = {d.composite for d in out if d.composite and not d.part}
        before = self._offered.get(class_name, {})
        kept = tuple(
            part if part.gone else dataclasses.replace(part, gone=True)
            for name, part in before.items()
            if name not in names and part.composite in wholes and self.held(name)
        )
        out += kept
        self._offered[class_name] = {d.name: d for d in out if d.composite and d.part}
        return out

    def kept(self) -> list[str]:
        """The classes with a part kept now (to offer again once a claim is unprepared)."""
        return [c for c, parts in self._offered.items() if any(p.gone for p in parts.values())]
