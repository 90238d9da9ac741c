"""Which devices of a class came back: a device removed and added again under the same name
(``deviceName``), or changed in place, whose nodes now have other numbers (pure).

:class:`Comebacks` remembers the last nodes of each device the class removed (the newest
:data:`REMEMBERED` per class: a device gone for longer than that many others is new when it
comes back) and, for each change, says which devices came back with which nodes moved
(:class:`Comeback`), and which came back with the same numbers (nothing in a container
changes). Nodes are paired by their path in the container; a node that came back at another
path (one the kernel's numbering names) with the old node of its type left unpaired.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from cdi_gen.model import ClassChange, DiscoveredDevice, NodeInfo

__all__ = ["REMEMBERED", "Comeback", "Comebacks", "MovedNode"]

#: Removed devices remembered per class (each a few nodes): bounded, whatever the churn.
REMEMBERED = 1024


@dataclass(frozen=True, slots=True)
class MovedNode:
    """One node of a device that came back: as it is now, and the numbers it had."""

    node: NodeInfo
    old: tuple[int, int]
    #: The node's path in the container before, when it came back at another path (a path
    #: the kernel's numbering names: ``/dev/bus/usb/BBB/DDD``, ``/dev/ttyUSBn`` without a
    #: ``node.path``); None: at the same path.
    old_path: str | None = None

    @property
    def new(self) -> tuple[int, int]:
        return (self.node.major or 0, self.node.minor or 0)


@dataclass(frozen=True, slots=True)
class Comeback:
    """A device that came back: its name, the device as it is now, the nodes that moved
    (empty: it came back with the same numbers)."""

    name: str
    device: DiscoveredDevice
    moved: tuple[MovedNode, ...]


def _numbers(node: NodeInfo) -> tuple[int, int] | None:
    if node.major is None or node.minor is None:
        return None
    return (node.major, node.minor)


def _moved(before: Iterable[NodeInfo], now: DiscoveredDevice) -> tuple[MovedNode, ...]:
    """The nodes of ``now`` whose numbers differ from ``before``'s: paired by their path in
    the container, then each node at a new path with the first unpaired old node of its type
    (a path named after the kernel's numbering changes with the numbers)."""
    old = {n.container_path: n for n in before}
    moved, new_paths = [], []
    for node in now.nodes:
        was = old.pop(node.container_path, None)
        if was is None:
            new_paths.append(node)
        elif _numbers(was) is not None and _numbers(node) not in (None, _numbers(was)):
            moved.append(MovedNode(node, _numbers(was) or (0, 0)))
    left = [n for n in old.values() if _numbers(n) is not None]
    for node in new_paths:
        was = next((n for n in left if n.type == node.type), None)
        if was is None or _numbers(node) in (None, _numbers(was)):
            continue
        left.remove(was)
        moved.append(MovedNode(node, _numbers(was) or (0, 0), was.container_path))
    return tuple(moved)


class Comebacks:
    """One class's devices' nodes now and its removed devices' last nodes, and the comebacks
    of each change."""

    def __init__(self, remembered: int = REMEMBERED) -> None:
        self.remembered = remembered
        #: The class's devices' nodes, by name, as the last change left them.
        self._now: dict[str, tuple[NodeInfo, ...]] = {}
        self._gone: OrderedDict[str, tuple[NodeInfo, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._gone)

    def of(self, change: ClassChange) -> list[Comeback]:
        """The devices of ``change`` (as discovery made it, before sharing expands it into
        slots) that came back. Remembers what it removes."""
        before, now = self._now, {d.name: d for d in change.devices}
        found: list[Comeback] = []
        for name in change.added:
            nodes = self._gone.pop(name, None)
            if nodes is not None and name in now:
                found.append(Comeback(name, now[name], _moved(nodes, now[name])))
        for name in change.changed:
            # Gone and back within one batch, or kept while gone (whenGone unhealthy or
            # taint): a comeback only when a node's numbers moved.
            old, new = before.get(name), now.get(name)
            if old is not None and new is not None and not new.gone:
                moved = _moved(old, new)
                if moved:
                    found.append(Comeback(name, new, moved))
        for name in change.removed:
            nodes = before.get(name, ())
            if any(_numbers(n) for n in nodes):
                self._gone.pop(name, None)
                self._gone[name] = nodes
                while len(self._gone) > self.remembered:
                    self._gone.popitem(last=False)
        self._now = {name: d.nodes for name, d in now.items()}
        return found
