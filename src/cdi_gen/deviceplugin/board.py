"""The published device list of one class: a versioned value that many readers can await.

Every class served as a device plugin has one (a DRA class publishes into the driver's pool
instead): the agent's class runner publishes here at its two points (the withdrawal before the
spec write, the new list after it), and the class's device plugin serves it. Every ListAndWatch
stream of the class's plugin waits on it independently, so each open stream sees every change
(a shared queue would hand each change to one stream only). ``publish`` is a plain call from
the agent's asyncio loop; readers await :meth:`DeviceBoard.wait_newer` on that loop, or block
in :meth:`DeviceBoard.wait_newer_blocking` on another thread (the gRPC server's), woken by a
condition variable: the device list itself is an immutable snapshot, safe to read anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from cdi_gen.kubelet.boundary import Versioned
from cdi_gen.model import AdvertisedDevice


class DeviceBoard(Versioned):
    """Latest device list of a class with a version number that grows on every change."""

    def __init__(self, devices: Iterable[AdvertisedDevice] = ()) -> None:
        super().__init__()
        self._devices: Mapping[str, AdvertisedDevice] = MappingProxyType({d.id: d for d in devices})

    @property
    def devices(self) -> Mapping[str, AdvertisedDevice]:
        """The current devices by ID, in publication order (read-only)."""
        return self._devices

    def get(self, device_id: str) -> AdvertisedDevice | None:
        return self._devices.get(device_id)

    def publish(self, devices: Iterable[AdvertisedDevice]) -> bool:
        """Replace the list; wake every waiter if it differs. Return whether it changed.

        Only the loop's thread may publish (:class:`~cdi_gen.kubelet.boundary.LoopOwned`):
        checked before anything changes, so a refused call leaves the list as it was."""
        self._check_owner()
        new = {d.id: d for d in devices}
        if new == dict(self._devices) and list(new) == list(self._devices):
            return False
        self._devices = MappingProxyType(new)
        self._bump()
        return True
