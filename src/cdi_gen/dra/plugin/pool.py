"""The node's DRA pool: every device of the classes served through DRA, as published.

The agent publishes a class's devices here at the same two points where it publishes a
device plugin's list (withdrawals before the spec is rewritten, additions after it is on
disk), so whatever reads the pool (the ResourceSlice publisher, NodePrepareResources, the
health stream) sees a device only while its CDI entry resolves.

The pool holds the entries a driver built (:mod:`cdi_gen.dra.driver.poolentries` builds
cdi-gen's); it knows nothing of how, only that their names are unique. Who must know of a
change (what claims are told of a device that left, :mod:`~cdi_gen.dra.plugin.notices`)
follows it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from cdi_gen.kubelet.boundary import Versioned
from cdi_gen.model import PoolDevice

__all__ = ["DevicePool"]


class DevicePool(Versioned):
    """The devices of every DRA class on the node, by pool name; versioned like a board."""

    def __init__(self) -> None:
        super().__init__()
        self._by_class: dict[str, tuple[PoolDevice, ...]] = {}
        self._devices: Mapping[str, PoolDevice] = MappingProxyType({})
        self._listeners: list[Callable[[tuple[PoolDevice, ...], tuple[PoolDevice, ...]], None]] = []

    def follow(
        self, listener: Callable[[tuple[PoolDevice, ...], tuple[PoolDevice, ...]], None]
    ) -> None:
        """Call ``listener(before, after)`` with a class's devices at each change of them, on
        the loop, once the pool has changed (it must not raise)."""
        self._listeners.append(listener)

    @property
    def devices(self) -> Mapping[str, PoolDevice]:
        """Every device by pool name, classes in publication order (an immutable snapshot,
        safe to read on any thread)."""
        return self._devices

    def get(self, name: str) -> PoolDevice | None:
        return self._devices.get(name)

    @property
    def by_class(self) -> Mapping[str, tuple[PoolDevice, ...]]:
        """Each class's devices as last published (a read-only view)."""
        return MappingProxyType(self._by_class)

    def publish(self, class_name: str, devices: Iterable[PoolDevice]) -> bool:
        """Replace one class's devices; wake every waiter if that changed anything.

        A driver names its entries uniquely; should two devices still share a name (an
        80-bit hash collision), the first keeps it and the other is left out, so the pool
        never holds two devices under one name. Only the loop's thread may call
        it (:class:`~cdi_gen.kubelet.boundary.LoopOwned`): checked before anything changes."""
        self._check_owner()
        new = tuple(devices)
        old = self._by_class.get(class_name, ())
        if old == new and class_name in self._by_class:
            return False
        self._by_class[class_name] = new
        by_name: dict[str, PoolDevice] = {}
        for group in self._by_class.values():
            for d in group:
                by_name.setdefault(d.name, d)
        self._devices = MappingProxyType(by_name)
        self._bump()
        for listener in self._listeners:
            listener(old, new)
        return True
