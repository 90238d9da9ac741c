"""The node's ResourceSlices kept equal to the DRA device pool.

:class:`SlicePublisher` follows :class:`~cdi_gen.dra.plugin.pool.DevicePool`: on every pool
version it builds the slices (:func:`~cdi_gen.dra.plugin.slices.build_slices`) and writes
what differs from what it last wrote. A change within one existing slice (a device's health or
attributes, a device added to or removed from it) is one write of that slice, generation
unchanged; any other change (slices to create or delete, two or more slices to write, so a
device may move between them) bumps the pool generation and creates, replaces and deletes
slices to match. At start (and after any failure or foreign change) it lists this driver's
slices on this node: slices with our names are adopted, others deleted, and the generation
continues above the highest one found, so the scheduler never prefers a stale slice. A
generation stays within the API's int64: when another writer has set one so high that the
next would not fit, the pool's slices are deleted and published again from generation 1 (a
new generation line; the scheduler takes the highest generation, so no old slice may remain).

It never stops the agent: a failing API server is retried through a
:class:`~cdi_gen.retry.Retry` bounded by ``retry_max`` (the agent's ``retry_max_seconds``; a
repeated failure logged once per doubling of its attempts, a new cause at once, and one line
when it answers again). A watch (:class:`~cdi_gen.dra.plugin.slicewatch.SliceWatch`) notices
when our slices are deleted or changed behind our back — the kubelet deletes every slice of the
node when it starts, and a driver's slices when its socket goes; another writer may edit them —
and publishes the pool again; the echo of our own writes (the resourceVersion or the content we
wrote) is not taken for a change. When the API server ends the watch it goes on from the last
resourceVersion seen (a bookmark's), without a list. Any failure of the watch, including a line
that is not a well-formed event or 410 Gone (a version too old), starts it again with backoff
after listing again; cancellation always ends the publisher, whatever the watch died of.

:meth:`SlicePublisher.published` lets the agent wait until a pool version is in the API: a
device leaves the slices before its CDI spec entry is removed.

Fields the API server does not know are dropped silently by it (taints without the
``DRADeviceTaints`` gate, counters without ``DRAPartitionableDevices``, a shared device's
``allowMultipleAllocations`` without ``DRAConsumableCapacity``); the publisher
compares what it sent with what came back and says so once.

Each slice is listed, written and deleted by a
:class:`~cdi_gen.dra.plugin.slicewriter.SliceWriter`, which keeps what is known of it, and that
is small (:mod:`~cdi_gen.dra.plugin.slicerecord`): the uid and resourceVersion of our slice in
the API, the times its taints were added, and digests of what was sent and what came back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from cdi_gen.dra.plugin.slicerecord import slice_digest
from cdi_gen.dra.plugin.slices import Slice, build_slices
from cdi_gen.dra.plugin.slicewatch import SliceWatch
from cdi_gen.dra.plugin.slicewriter import SliceWriter
from cdi_gen.retry import Retry, bounded, describe
from cdi_gen.waits import first_of, set_within

if TYPE_CHECKING:
    from cdi_gen.apiserver.client import ApiClient
    from cdi_gen.dra.plugin.pool import DevicePool

__all__ = ["SlicePublisher"]

log = logging.getLogger(__name__)

#: The highest pool generation: the API stores it as an int64.
MAX_GENERATION = (1 << 63) - 1


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
        self.driver = driver
        self.node = node
        self._pool = pool
        self._retry_initial = retry_initial
        #: The longest wait of its retries (the agent's ``retry_max_seconds``).
        self.retry_max = retry_max
        #: Our slices in the API as last seen and written, one at a time.
        self._slices = SliceWriter(client, driver, node)
        self._watch = SliceWatch(
            client, driver, node, self._slices, relist=self._relist, retry=self._retry
        )
        self._generation = 0
        self._need_list = True
        self._dirty = asyncio.Event()
        self._published = -1
        self._published_changed = asyncio.Event()
        #: How many times the pool was written (a new generation, or one slice within one).
        self.publications = 0

    @property
    def on_dropped(self) -> Callable[[str], None] | None:
        """Told each gated field the API server drops, once, on the loop."""
        return self._slices.on_dropped

    @on_dropped.setter
    def on_dropped(self, hook: Callable[[str], None] | None) -> None:
        self._slices.on_dropped = hook

    @property
    def dropped(self) -> set[str]:
        """Gated fields the API server dropped ("taints", "counters", "capacity"), each
        logged once."""
        return self._slices.dropped

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
            await set_within(self._published_changed, left)
        return True

    def _mark_published(self, version: int) -> None:
        self._published = max(self._published, version)
        changed, self._published_changed = self._published_changed, asyncio.Event()
        changed.set()

    async def run(self) -> None:
        """Publish every pool version until the pool closes; never raises for an API failure.
        The slices stay when it ends (the kubelet removes them once our socket is gone)."""
        from cdi_gen.apiserver.errors import ApiServerError

        watcher = asyncio.create_task(self._watch.run(), name=f"watch slices {self.driver}")
        retrying = self._retry(logging.WARNING)
        try:
            while not self._pool.closed:
                target = self._pool.version
                try:
                    await self._sync(tuple(self._pool.devices.values()))
                except ApiServerError as exc:
                    # A write's 409 (someone changed or created the slice) or 404 (deleted
                    # meanwhile) included: what is in the API is listed again.
                    self._need_list = True
                    retrying.failed(
                        str(exc),
                        "publishing ResourceSlices of %(driver)s failed, retrying in "
                        "%(delay).3gs: %(why)s",
                        driver=self.driver,
                    )
                    await self._wait_change(target, retrying.delay)
                    continue
                if retrying.attempts:
                    log.info("ResourceSlices of %s published again", self.driver)
                retrying.succeeded()
                self._mark_published(target)
                await self._wait_change(target, None)
        finally:
            await _stop(watcher)
            self._published_changed.set()

    def _retry(self, level: int) -> Retry:
        """A retry loop of the publisher: its waits bounded by ``retry_max``."""
        return Retry(bounded(self.retry_max, self._retry_initial), logger=log, level=level)

    async def _wait_change(self, version: int, limit: float | None) -> None:
        """Until the pool moves past ``version``, a slice is deleted behind our back, or
        ``limit`` seconds pass."""
        await first_of(self._pool.wait_newer(version), self._dirty.wait(), timeout=limit)
        self._dirty.clear()

    async def _list(self) -> None:
        self._generation = max(self._generation, await self._slices.list())
        self._need_list = False

    async def _sync(self, devices: Iterable[Any]) -> None:
        devices = tuple(devices)
        if self._need_list:
            await self._list()
        desired = self._build(devices, self._generation)
        changed = [
            s for s in desired if self._slices.sent.get(s["metadata"]["name"]) != slice_digest(s)
        ]
        same_slices = {s["metadata"]["name"] for s in desired} == set(self._slices.current)
        # At the int64 end a write starts a new generation line (below) even when one would do.
        one_write = len(changed) == 1 and self._generation < MAX_GENERATION
        if same_slices and (not changed or one_write):
            # The slices stay those there are: no slice to create or delete, at most one to
            # write. A reader sees that slice before or after the write, either way every
            # device exactly once at one generation, so the generation stays (the rule of
            # Kubernetes' own resourceslice controller). Two writes could be seen half done
            # (a device moved between them twice or nowhere): those take a new generation.
            if changed:
                await self._slices.write(changed[0])
                self._published_log(devices, desired)
            return
        if self._generation >= MAX_GENERATION:
            await self._new_generation_line()
        self._generation += 1
        desired = self._build(devices, self._generation)
        for obj in desired:
            await self._slices.write(obj)
        extra = set(self._slices.current) - {s["metadata"]["name"] for s in desired}
        for name in sorted(extra):
            await self._slices.delete(name)
        self._published_log(devices, desired)

    def _published_log(self, devices: tuple[Any, ...], desired: list[Slice]) -> None:
        self.publications += 1
        log.info(
            "published %d devices in %d ResourceSlices of %s, generation %d",
            len(devices),
            len(desired),
            self.driver,
            self._generation,
        )

    async def _new_generation_line(self) -> None:
        """Start the pool's generations again at 1: the next one would not fit the API's
        int64 (another writer set it near the end). The scheduler takes the highest
        generation of a pool, so every slice of the old line must be gone before the first
        of the new one appears."""
        log.warning(
            "ResourceSlices of %s: pool generation %d is at the int64 limit; deleting the "
            "pool's %d slices to publish it again from generation 1",
            self.driver,
            self._generation,
            len(self._slices.current),
        )
        for name in sorted(self._slices.current):
            await self._slices.delete(name)
        self._generation = 0

    def _build(self, devices: tuple[Any, ...], generation: int) -> list[Slice]:
        return build_slices(
            self.driver, self.node, devices, generation, node_uid=self._slices.node_uid
        )

    def _relist(self) -> None:
        """List and publish again: called by the watch when one opens with no version to go on from,
        since what changed while no watch was open (the kubelet deleting the node's slices
        at its start) sent no event, and when it breaks, so that such a change is repaired
        without waiting."""
        self._need_list = True
        self._dirty.set()


async def _stop(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait for it without raising what it died of: in a shutdown the
    caller's own cancellation must be what propagates, never an old error of the task."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s had ended with an error: %s", task.get_name(), describe(exc))
