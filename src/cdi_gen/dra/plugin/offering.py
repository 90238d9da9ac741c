"""What the node's ResourceSlices offer, and the life of their publishing: the part of a
DRA driver's lifecycle that is the same whatever its devices.

:class:`Offering` is given the pool a driver fills (what NodePrepareResources and health
answer from), its kubelet plugin to serve and the API client once open, and keeps
``offered``, the pool the :class:`~cdi_gen.dra.plugin.publisher.SlicePublisher` follows:

- the slices offer the pool only while the plugin serves: a device in a slice is one the
  scheduler may allocate, and only a served plugin can prepare it. Until the plugin serves,
  and whenever it stops serving, the publisher follows an empty pool, which also withdraws
  the devices of slices an earlier run left; they are published when the plugin serves;
- the publisher runs on the agent's group, after the older instance of a rolling update has
  handed the slices over; a failure of it that is a bug starts it over after a wait that
  grows while it keeps failing (a :class:`~cdi_gen.retry.Retry` bounded by
  ``retry_max_seconds``), never stopping the agent;
- in a rolling update the newest instance publishes: this one yields the slices to a newer
  one the kubelet registered, and takes them back (a new offered pool and publisher, which
  adopts the slices and restores deleted ones) when that one goes while this one runs;
- closing ends the publisher's last write before the plugin's sockets go (then handed over
  to a newer instance, or not), so a newer instance never publishes beside this one.

It knows nothing of what the devices are or how a claim is prepared: the driver builds the
pool's entries (:mod:`cdi_gen.dra.driver.poolentries`) and makes the plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.logs import fields
from cdi_gen.model import PoolDevice
from cdi_gen.modes import make_folder
from cdi_gen.retry import Retry, Tools, bounded, describe
from cdi_gen.waits import first_of

if TYPE_CHECKING:
    from cdi_gen.apiserver.client import ApiClient
    from cdi_gen.dra.plugin.publisher import SlicePublisher
    from cdi_gen.dra.plugin.server import DraPlugin

__all__ = ["RESTART_SECONDS", "WITHDRAW_SECONDS", "Offering"]

log = logging.getLogger(__name__)

#: Longest a spec rewrite waits for a withdrawal to reach the API server. The order (out of
#: the slice, then out of the spec) holds whenever the API server answers; when it does not,
#: the node's devices must still follow the hardware, and NodePrepareResources refuses a
#: device that is gone whatever a stale slice says.
WITHDRAW_SECONDS = 5.0

#: First wait before a publisher that failed unexpectedly starts over (doubled while it
#: keeps failing; never above ``retry_max_seconds``).
RESTART_SECONDS = 5.0


class Offering:
    """The slices of the DRA driver ``driver`` on ``node``: ``pool`` offered while the
    plugin serves, published by one publisher at a time; ``tools`` lends the metrics, the
    retry bound and the agent's task group."""

    def __init__(self, pool: DevicePool, tools: Tools, *, driver: str, node: str) -> None:
        #: Every device of the driver: what NodePrepareResources and health answer from.
        self.pool = pool
        #: What the ResourceSlices offer: ``pool`` while the kubelet plugin serves, else
        #: empty. The publisher follows this one.
        self.offered = DevicePool()
        self.tools = tools
        self.metrics = tools.metrics
        self.driver = driver
        self.node = node
        self.plugin: DraPlugin | None = None
        self.publisher: SlicePublisher | None = None
        self._client: ApiClient | None = None
        #: Why the plugin does not serve now ("" while it does).
        self.not_serving = "not started"
        self._closed = False
        #: Set once the publisher has ended for good (its last write done).
        self._published_out = asyncio.Event()
        #: Told each gated field the API server drops from our slices, once (the driver).
        self.on_dropped: Callable[[str], None] | None = None

    # -- what the slices offer ------------------------------------------------------------

    def publish(self, class_name: str, devices: Iterable[PoolDevice]) -> bool:
        """Put one class's devices into the pool, and into what the slices offer while the
        plugin serves; whether what the slices offer changed (nothing to wait for if not)."""
        devices = tuple(devices)
        self.pool.publish(class_name, devices)
        return self.offered.publish(class_name, devices if self.serving else ())

    @property
    def serving(self) -> bool:
        """Whether the kubelet plugin serves (the slices offer the pool)."""
        return not self.not_serving

    @property
    def published(self) -> bool:
        """Whether what the slices offer now is in the API server."""
        publisher = self.publisher
        return publisher is not None and publisher.published_version >= self.offered.version

    def _serving_changed(self, serving: bool, why: str) -> None:
        """The plugin's sockets became served, or stopped being: offer the pool, or
        nothing. Not once closing or handed over (the slices then stay, see :meth:`close`)."""
        # Kept while handed over too: what is offered if this instance takes the slices back.
        self.not_serving = "" if serving else why or "not serving"
        if self.offered.closed:
            return
        # The pool keeps each class's devices: offered again as they are when serving resumes.
        for name, devices in self.pool.by_class.items():
            self.offered.publish(name, devices if serving else ())
        if serving:
            log.info(
                "DRA driver serving; its devices are offered in the ResourceSlices",
                extra=fields(driver=self.driver, devices=len(self.pool.devices)),
            )
        else:
            log.warning(
                "DRA driver not serving; its devices are withdrawn from the ResourceSlices: %s",
                self.not_serving,
                extra=fields(driver=self.driver),
            )

    async def withdrawn(self) -> None:
        """Wait (bounded) until what the slices offer now is in the API server."""
        publisher = self.publisher
        if publisher is None:
            return
        if not await publisher.published(self.offered.version, WITHDRAW_SECONDS):
            log.warning(
                "ResourceSlices not updated within %gs; the spec changes anyway",
                WITHDRAW_SECONDS,
                extra=fields(driver=self.driver),
            )

    # -- the plugin and the publisher -----------------------------------------------------

    async def serve(self, plugin: DraPlugin) -> None:
        """Serve ``plugin``'s sockets (their folders made first); raises what its start
        raises, and then leaves no socket served. The first plugin given is the one kept: its
        serving decides what is offered and, with a pod UID (a rolling update may come), it
        yields the slices to a newer instance and takes them back."""
        if self.plugin is None:
            self.plugin = plugin
            plugin.follow_serving(self._serving_changed)
            if plugin.pod_uid is not None:
                self.tools.spawn(self._yield_slices(plugin), f"successor {self.driver}")
        plugin = self.plugin
        make_folder(plugin.registration_socket.parent)
        make_folder(plugin.socket_path.parent)
        try:
            await plugin.start()
        except BaseException:
            # A socket served before the failure must not stay (the kubelet would dial a
            # driver that cannot prepare); the next attempt serves both anew.
            with contextlib.suppress(Exception):
                await plugin.stop(grace=0)
            raise

    def start_publisher(self, client: ApiClient) -> None:
        """Publish ``offered`` from now on, once: serving, the pool; not serving, an empty
        pool (earlier slices withdrawn)."""
        if self.publisher is None:
            self._client = client
            self._start_publisher(client)

    def _start_publisher(self, client: ApiClient) -> None:
        """A publisher of its own for ``offered``, run on the agent's group."""
        from cdi_gen.dra.plugin.publisher import SlicePublisher

        publisher = SlicePublisher(
            client, self.driver, self.node, self.offered, retry_max=self.tools.retry_max_seconds
        )
        self.publisher = publisher
        publisher.on_dropped = self.on_dropped
        self._published_out = asyncio.Event()
        self.tools.spawn(self._publish(publisher, self._published_out), f"slices {self.driver}")
        self._export(publisher)

    def _export(self, publisher: SlicePublisher) -> None:
        """The pool's generation and whether it is published, read at scrape time (the
        publisher's own state, never a copy gone stale)."""
        self.metrics.pool_generation.labels(self.driver).set_function(lambda: publisher.generation)
        self.metrics.pool_published.labels(self.driver).set_function(
            lambda: float(publisher.published_version >= self.offered.version)
        )

    async def _publish(self, publisher: SlicePublisher, out: asyncio.Event) -> None:
        """Run the publisher until the pool closes, once no older instance of the driver
        (a rolling update) writes the slices. It retries API failures itself; anything
        else is a bug, logged and counted, and must not stop the agent (it would take the
        device plugins and the specs of every other class with it): start it over, after a
        wait that grows while it keeps failing (one traceback per doubling of the attempts)."""
        try:
            if self.plugin is not None:
                await self._unless_closed(self.plugin.handover.predecessors_yielded())
            await self._run_publisher(publisher)
        finally:
            out.set()

    async def _unless_closed(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` until it returns or the offered pool closes (the agent stops)."""
        # No version is above this one: it returns when the pool closes.
        done = await first_of(work, self.offered.wait_newer(sys.maxsize))
        if isinstance(done[0], Exception):
            # A bug: publishing goes on (stale slices would be worse than a race).
            log.error("waiting to publish failed: %s", describe(done[0]), exc_info=done[0])

    async def _run_publisher(self, publisher: SlicePublisher) -> None:
        retrying = Retry(
            bounded(self.tools.retry_max_seconds, RESTART_SECONDS),
            logger=log,
            extra=fields(driver=self.driver),
            count=self.metrics.failures.labels(self.driver, "internal").inc,
        )
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            try:
                await publisher.run()
                return
            except Exception as exc:
                retrying.ran(loop.time() - began)  # it ran well for a while: a new failure
                retrying.failed(
                    describe(exc),
                    "publishing ResourceSlices failed (attempt %(attempt)d); starting over in "
                    "%(delay)gs",
                    exc_info=True,
                )
                await asyncio.sleep(retrying.delay)

    # -- a rolling update -----------------------------------------------------------------

    async def _yield_slices(self, plugin: DraPlugin) -> None:
        """The newest instance publishes the slices: once a newer one registered beside us
        (a rolling update), this one stops publishing (the slices stay as they are, its).
        Should that one go while this one still runs (killed: out of memory, a bad release
        crashing), this one takes them back: nobody else would publish them again."""
        while True:
            found = await plugin.handover.superseded()
            log.info("a newer instance publishes the ResourceSlices now: %s", found)
            self.offered.close()
            # Said only once our last write is done: the newer one publishes after it, and
            # so has the last word.
            await self._published_out.wait()
            plugin.handover.mark_yielded()
            await plugin.handover.successors_gone()
            if self._closed or self._client is None:
                return
            log.warning(
                "the newer instance is gone (%s); this one publishes the ResourceSlices again",
                found,
                extra=fields(driver=self.driver),
            )
            plugin.handover.mark_yielded(False)
            self._take_back(self._client)

    def _take_back(self, client: ApiClient) -> None:
        """Publish again after a handover whose successor went: a new offered pool (the
        handed-over one is closed for good) with the pool's devices while the plugin serves,
        published by a new publisher, which adopts the slices there and restores deleted
        ones."""
        offered = DevicePool()
        for name, devices in self.pool.by_class.items():
            offered.publish(name, devices if self.serving else ())
        self.offered = offered
        self._start_publisher(client)

    async def close(self, *, successor: bool) -> bool:
        """Stop publishing, then serving; whether a newer instance took over (``successor``:
        whether one may come, which this one then keeps serving for, bounded). The slices
        stay (running pods keep their devices, and a new agent adopts them)."""
        self._closed = True
        # Closing the offered pool ends the publisher's run (a task of the agent's group);
        # closed first, so that the plugin's stop below withdraws nothing.
        self.offered.close()
        self.pool.close()
        if self.plugin is None:
            return False
        if self.publisher is not None:
            # A write still under way ends before our socket goes: a newer instance takes a
            # socket no longer served for an instance that writes no more.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WITHDRAW_SECONDS):
                    await self._published_out.wait()
        handed_over = await self.plugin.hand_over() if successor else False
        await self.plugin.stop(grace=1.0)
        return handed_over
