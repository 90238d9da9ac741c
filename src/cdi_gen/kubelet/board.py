"""The published device list of one class: a versioned value that many readers can await.

The agent publishes here after the spec file is on disk; every ListAndWatch stream of the
class's plugin waits on it independently, so each open stream sees every change (a shared
queue would hand each change to one stream only). ``publish`` is a plain call from the
agent's asyncio loop; readers await :meth:`DeviceBoard.wait_newer` on that loop, or block in
:meth:`DeviceBoard.wait_newer_blocking` on another thread (the gRPC server's), woken by a
condition variable: the device list itself is an immutable snapshot, safe to read anywhere.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from cdi_gen.model import AdvertisedDevice


class DeviceBoard:
    """Latest device list of a class with a version number that grows on every change."""

    def __init__(self, devices: Iterable[AdvertisedDevice] = ()) -> None:
        self._devices: Mapping[str, AdvertisedDevice] = MappingProxyType({d.id: d for d in devices})
        self._version = 0
        self._changed = asyncio.Event()
        self._condition = threading.Condition()
        self._closed = False

    @property
    def version(self) -> int:
        return self._version

    @property
    def devices(self) -> Mapping[str, AdvertisedDevice]:
        """The current devices by ID, in publication order (read-only)."""
        return self._devices

    @property
    def closed(self) -> bool:
        return self._closed

    def get(self, device_id: str) -> AdvertisedDevice | None:
        return self._devices.get(device_id)

    def publish(self, devices: Iterable[AdvertisedDevice]) -> bool:
        """Replace the list; wake every waiter if it differs. Return whether it changed."""
        new = {d.id: d for d in devices}
        if new == dict(self._devices) and list(new) == list(self._devices):
            return False
        self._devices = MappingProxyType(new)
        self._bump()
        return True

    def close(self) -> None:
        """Wake every waiter for good; streams end when they see ``closed``."""
        self._closed = True
        self._bump()

    def _bump(self) -> None:
        with self._condition:
            self._version += 1
            self._condition.notify_all()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def interrupt(self) -> None:
        """Wake every blocking waiter without a change, so that it re-checks its own
        reasons to stop (a server shutting down, a client gone)."""
        with self._condition:
            self._condition.notify_all()

    def wait_newer_blocking(
        self, version: int, timeout: float, stop: Callable[[], bool] = lambda: False
    ) -> int:
        """Block until the version is above ``version``, the board closes, ``stop()`` holds
        after an :meth:`interrupt`, or ``timeout`` seconds pass; return the version. For
        threads other than the loop's."""
        with self._condition:
            self._condition.wait_for(
                lambda: self._version > version or self._closed or stop(), timeout
            )
            return self._version

    async def wait_newer(self, version: int) -> int:
        """Return once the version is above ``version`` (at once if it already is)."""
        while self._version <= version and not self._closed:
            await self._changed.wait()
        return self._version
