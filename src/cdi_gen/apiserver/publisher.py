"""The node's ResourceSlices kept equal to the DRA device pool.

:class:`SlicePublisher` follows :class:`~cdi_gen.discovery.pool.DevicePool`: on every pool
version it builds the slices (:func:`~cdi_gen.apiserver.slices.build_slices`) and, when they
differ from what it last wrote, bumps the pool generation and creates, replaces and deletes
slices to match. At start (and after any failure or foreign deletion) it lists this driver's
slices on this node: slices with our names are adopted, others deleted, and the generation
continues above the highest one found, so the scheduler never prefers a stale slice.

It never stops the agent: a failing API server is retried with backoff (one log line per
outage, one when it answers again). A watch notices when our slices are deleted behind our
back — the kubelet deletes every slice of the node when it starts, and a driver's slices when
its socket goes — and publishes them again.

:meth:`SlicePublisher.published` lets the agent wait until a pool version is in the API: a
device leaves the slices before its CDI spec entry is removed.

Fields the API server does not know are dropped silently by it (taints without the
``DRADeviceTaints`` gate, counters without ``DRAPartitionableDevices``); the publisher
compares what it sent with what came back and says so once.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from cdi_gen.apiserver.slices import Slice, build_slices

if TYPE_CHECKING:
    from cdi_gen.apiserver.client import ApiClient
    from cdi_gen.discovery.pool import DevicePool

__all__ = ["SlicePublisher"]

log = logging.getLogger(__name__)

#: Feature gates whose fields the API server drops when they are off, by our name for them.
GATES = {
    "taints": "DRADeviceTaints (device taints dropped: unhealthy and gone devices stay "
    "allocatable)",
    "counters": "DRAPartitionableDevices (shared counters dropped: slots are published as "
    "plain devices)",
}


def _devices(obj: Slice) -> list[dict[str, Any]]:
    return list((obj.get("spec") or {}).get("devices") or [])


def _dropped(sent: Slice, got: Slice) -> set[str]:
    """Which gated fields ``sent`` had and ``got`` (the API server's answer) lacks."""
    out: set[str] = set()
    sent_devices, got_devices = _devices(sent), {d["name"]: d for d in _devices(got)}
    for device in sent_devices:
        back = got_devices.get(device["name"], {})
        if device.get("taints") and not back.get("taints"):
            out.add("taints")
        if device.get("consumesCounters") and not back.get("consumesCounters"):
            out.add("counters")
    if (sent.get("spec") or {}).get("sharedCounters") and not (got.get("spec") or {}).get(
        "sharedCounters"
    ):
        out.add("counters")
    return out


def _comparable(obj: Slice) -> tuple[Any, Any]:
    """What decides whether a slice must be written: its owner and its spec, without the
    taints' ``timeAdded`` that the API server fills in."""
    spec = copy.deepcopy(obj.get("spec") or {})
    for device in spec.get("devices") or ():
        for taint in device.get("taints") or ():
            taint.pop("timeAdded", None)
    for key in ("devices", "sharedCounters"):
        if not spec.get(key):
            spec.pop(key, None)
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return owners, spec


def _keep_taint_times(obj: Slice, current: Slice | None) -> None:
    """Carry over the time each existing taint was added: a NoExecute taint's
    ``tolerationSeconds`` count from it, and a rewrite of the slice is no new taint."""
    if current is None:
        return
    times = {
        (d["name"], t["key"], t["effect"]): t["timeAdded"]
        for d in _devices(current)
        for t in d.get("taints") or ()
        if t.get("timeAdded")
    }
    for device in _devices(obj):
        for taint in device.get("taints") or ():
            when = times.get((device["name"], taint["key"], taint["effect"]))
            if when is not None:
                taint["timeAdded"] = when


class SlicePublisher:
    """Publishes ``pool`` as ``driver``'s ResourceSlices of ``node`` until the pool closes."""

    def __init__(
        self,
        client: ApiClient,
        driver: str,
        node: str,
        pool: DevicePool,
        *,
        retry_initial: float = 0.5,
        retry_max: float = 30.0,
    ) -> None:
        self._client = client
        self.driver = driver
        self.node = node
        self._pool = pool
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        #: Our slices in the API as last seen (name -> object), and what we last sent.
        self._current: dict[str, Slice] = {}
        self._sent: dict[str, tuple[Any, Any]] = {}
        self._deleting: set[str] = set()
        self._generation = 0
        self._node_uid: str | None = None
        self._need_list = True
        self._dirty = asyncio.Event()
        self._published = -1
        self._published_changed = asyncio.Event()
        #: Gated fields the API server dropped ("taints", "counters"), each logged once.
        self.dropped: set[str] = set()
        #: How many times the slices were written (a generation published).
        self.publications = 0

    @property
    def generation(self) -> int:
        """The pool generation last published."""
        return self._generation

    @property
    def published_version(self) -> int:
        """The newest pool version whose slices are in the API (-1: none yet)."""
        return self._published

    # The agent waits with a bound of its own choosing; a cancel scope would not say whether
    # the version made it, which is the answer it needs.
    async def published(self, version: int, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait until pool ``version`` (or a newer one) is in the API; False after
        ``timeout`` seconds (the API server is failing) or once the pool is closed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._published < version:
            left = deadline - loop.time()
            if left <= 0 or self._pool.closed:
                return False
            changed = self._published_changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)
        return True

    def _mark_published(self, version: int) -> None:
        self._published = max(self._published, version)
        changed, self._published_changed = self._published_changed, asyncio.Event()
        changed.set()

    async def run(self) -> None:
        """Publish every pool version until the pool closes; never raises for an API failure.
        The slices stay when it ends (the kubelet removes them once our socket is gone)."""
        from cdi_gen.apiserver.client import ApiServerError

        watcher = asyncio.create_task(self._watch(), name=f"watch slices {self.driver}")
        delay = self._retry_initial
        failing = False
        try:
            while not self._pool.closed:
                target = self._pool.version
                try:
                    await self._sync(tuple(self._pool.devices.values()))
                except ApiServerError as exc:
                    self._need_list = True
                    if not failing:
                        log.warning(
                            "publishing ResourceSlices of %s failed, retrying with backoff: %s",
                            self.driver,
                            exc,
                        )
                    failing = True
                    await self._wait_change(target, delay)
                    delay = min(delay * 2, self._retry_max)
                    continue
                if failing:
                    log.info("ResourceSlices of %s published again", self.driver)
                failing, delay = False, self._retry_initial
                self._mark_published(target)
                await self._wait_change(target, None)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self._published_changed.set()

    async def _wait_change(self, version: int, limit: float | None) -> None:
        """Until the pool moves past ``version``, a slice is deleted behind our back, or
        ``limit`` seconds pass."""
        waits = [
            asyncio.ensure_future(self._pool.wait_newer(version)),
            asyncio.ensure_future(self._dirty.wait()),
        ]
        try:
            await asyncio.wait(waits, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        self._dirty.clear()

    async def _list(self) -> None:
        from cdi_gen.apiserver.client import ApiServerError

        if self._node_uid is None:
            try:
                self._node_uid = await self._client.node_uid(self.node)
            except ApiServerError as exc:
                if exc.status is None:
                    raise  # no answer: retry everything later
                log.warning("slices published without their Node as owner: %s", exc)
        items = await self._client.list_slices(self.driver, self.node)
        self._current = {s["metadata"]["name"]: s for s in items}
        self._sent = {name: _comparable(s) for name, s in self._current.items()}
        found = [int(s["spec"]["pool"].get("generation") or 0) for s in items]
        self._generation = max([self._generation, *found])
        self._need_list = False

    async def _sync(self, devices: Iterable[Any]) -> None:
        devices = tuple(devices)
        if self._need_list:
            await self._list()
        desired = self._build(devices, self._generation)
        if {s["metadata"]["name"] for s in desired} == set(self._current) and all(
            self._sent.get(s["metadata"]["name"]) == _comparable(s) for s in desired
        ):
            return
        self._generation += 1
        desired = self._build(devices, self._generation)
        for obj in desired:
            await self._write(obj)
        extra = set(self._current) - {s["metadata"]["name"] for s in desired}
        for name in sorted(extra):
            self._deleting.add(name)
            try:
                await self._client.delete_slice(name)
            finally:
                self._deleting.discard(name)
            self._current.pop(name, None)
            self._sent.pop(name, None)
        self.publications += 1
        log.info(
            "published %d devices in %d ResourceSlices of %s, generation %d",
            len(devices),
            len(desired),
            self.driver,
            self._generation,
        )

    def _build(self, devices: tuple[Any, ...], generation: int) -> list[Slice]:
        return build_slices(self.driver, self.node, devices, generation, node_uid=self._node_uid)

    async def _write(self, obj: Slice) -> None:
        from cdi_gen.apiserver.client import ApiServerError

        name = obj["metadata"]["name"]
        current = self._current.get(name)
        _keep_taint_times(obj, current)
        try:
            if current is None:
                result = await self._client.create_slice(obj)
            else:
                obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                result = await self._client.replace_slice(obj)
        except ApiServerError:
            # 409 (someone changed or created it) or 404 (deleted meanwhile): list again.
            self._need_list = True
            raise
        obj["metadata"].pop("resourceVersion", None)
        self._current[name] = result
        self._sent[name] = _comparable(obj)
        for field in sorted(_dropped(obj, result) - self.dropped):
            self.dropped.add(field)
            log.warning(
                "the API server dropped fields of ResourceSlice %s; feature gate off: %s",
                name,
                GATES[field],
            )

    async def _watch(self) -> None:
        """Republish when one of our slices is deleted by someone else."""
        from cdi_gen.apiserver.client import ApiServerError

        delay = self._retry_initial
        first = True
        while True:
            if not first:
                # The watch broke: whatever happened meanwhile is found by listing again.
                self._need_list = True
                self._dirty.set()
            first = False
            try:
                async for kind, obj in self._client.watch_slices(self.driver, self.node):
                    delay = self._retry_initial
                    name = obj["metadata"]["name"]
                    if kind == "DELETED" and name in self._current and name not in self._deleting:
                        log.info("ResourceSlice %s was deleted; publishing it again", name)
                        self._need_list = True
                        self._dirty.set()
            except ApiServerError as exc:
                log.debug("watching ResourceSlices failed: %s", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._retry_max)
