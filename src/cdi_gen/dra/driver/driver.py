"""The node's DRA driver: the device pool, its kubelet plugin and its ResourceSlice publisher.

Classes with ``api: dra`` are served here instead of by a device plugin each. The driver is
the one wrapper the agent runs for all of them: every DRA class's runner has it as its
:class:`~cdi_gen.agent.frontend.Frontend` (started once, whichever class asks first, a failed
attempt retried on the agent's group; stopped once) and as its
:class:`~cdi_gen.agent.frontend.ClassPool`: the runner publishes the class's devices into one
:class:`~cdi_gen.dra.plugin.pool.DevicePool` at the points where a device plugin's class
publishes its board (the entries built by :mod:`~cdi_gen.dra.driver.poolentries`); the
:class:`~cdi_gen.dra.plugin.publisher.SlicePublisher` keeps the node's ResourceSlices equal to
the pool, and the :class:`~cdi_gen.dra.plugin.server.DraPlugin` answers the kubelet's
NodePrepareResources from it through the driver's state, a
:class:`~cdi_gen.dra.driver.preparer.PoolPreparer` that reads each claim through the API server
and records it in the checkpoint.

The slices offer the pool only while the kubelet plugin serves: a device in a slice is one
the scheduler may allocate, and only a served plugin can prepare it. Until the plugin serves
(its checkpoint refused, a socket path too long or a folder that cannot be served), and
whenever it stops serving, the publisher follows an empty pool, which also withdraws the
devices of slices an earlier run left; the devices are published when the plugin serves.

In a rolling update the newest instance publishes: this one yields the slices to a newer one
the kubelet registered, and takes them back (a new offered pool and publisher, which adopts
the slices and restores deleted ones) when that one goes while this one runs.

Every retry loop here (the start, the publisher started over) is a :class:`~cdi_gen.retry.Retry`
bounded by ``retry_max_seconds``. The API server client and the DRA gRPC services are imported
only when a class uses DRA: an agent serving device plugins alone loads neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from cdi_gen.cdi.store import SpecStore
from cdi_gen.config.models import AgentConfig, ClassConfig
from cdi_gen.config.settings import Settings
from cdi_gen.dra.driver.poolentries import PoolCache, pool_devices, shared_once
from cdi_gen.dra.plugin.capacity import consumable_capacity
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.errors import SocketInUseError
from cdi_gen.logs import fields
from cdi_gen.model import AdvertisedDevice, DiscoveredDevice
from cdi_gen.modes import make_folder
from cdi_gen.retry import Retry, Tools, bounded, describe
from cdi_gen.waits import first_of

if TYPE_CHECKING:
    from cdi_gen.apiserver.client import ApiClient
    from cdi_gen.cdi.resolution import SpecResolver
    from cdi_gen.dra.driver.claimstatus import ClaimStatus
    from cdi_gen.dra.plugin.publisher import SlicePublisher
    from cdi_gen.dra.plugin.server import DraPlugin

__all__ = ["RESTART_SECONDS", "WITHDRAW_SECONDS", "DraDriver"]

log = logging.getLogger("cdi_gen.dra.driver.driver")
#: The start's failures are the agent's lines, as every frontend's are.
agent_log = logging.getLogger("cdi_gen.agent.agent")

#: Longest a spec rewrite waits for a withdrawal to reach the API server. The order (out of
#: the slice, then out of the spec) holds whenever the API server answers; when it does not,
#: the node's devices must still follow the hardware, and NodePrepareResources refuses a
#: device that is gone whatever a stale slice says.
WITHDRAW_SECONDS = 5.0

#: First wait before a publisher that failed unexpectedly starts over (doubled while it
#: keeps failing; never above ``retry_max_seconds``).
RESTART_SECONDS = 5.0


class DraDriver:
    """One DRA driver for every ``api: dra`` class of the node."""

    def __init__(
        self,
        config: AgentConfig,
        settings: Settings,
        tools: Tools,
        resolver: SpecResolver | None = None,
        specs: SpecStore | None = None,
    ) -> None:
        self.config = config
        #: The class specs the agent wrote: what a configured claim's own spec starts from.
        self.specs = SpecStore() if specs is None else specs
        self.settings = settings
        self.tools = tools
        self.metrics = metrics = tools.metrics
        #: The runtime's view of the spec folders: a claim is prepared only when its CDI
        #: names resolve there, as Allocate checks them.
        self.resolver = resolver
        self.name = settings.driver_name(config)
        self.node = settings.node()
        #: Every device of the DRA classes: what NodePrepareResources and health answer from.
        self.pool = DevicePool()
        #: What the ResourceSlices offer: ``pool`` while the kubelet plugin serves, else
        #: empty (see the module docstring). The publisher follows this one.
        self.offered = DevicePool()
        #: Per class: the pool entries last built, reused while their device is unchanged.
        self._cache: dict[str, PoolCache] = {}
        #: Shared devices published once with consumable capacity (asked at start; slots
        #: until then).
        self.by_capacity = False
        self._asked_capacity = False
        self.plugin: DraPlugin | None = None
        self.publisher: SlicePublisher | None = None
        self.client: ApiClient | None = None
        #: The prepared claims' status writes (made with the plugin).
        self.claim_status: ClaimStatus | None = None
        #: Why the driver could not start (set by the agent's start attempts), or None.
        self.error: str | None = None
        #: Why the started plugin does not serve now ("" while it does).
        self._not_serving = "not started"
        #: The start's retry loop: counted under the driver's name, logged once per doubling.
        self.retrying = Retry(
            tools.backoff(),
            logger=agent_log,
            extra=fields(driver=self.name, reason="plugin-start"),
            count=metrics.failures.labels(self.name, "plugin-start").inc,
        )
        self._started = False
        self._stopped = False
        #: Whether, at its stop, a newer instance of the driver took over (a rolling update):
        #: the spec files, named alike for both, are then the ones that instance serves.
        self.handed_over = False
        #: Set once the publisher has ended for good (its last write done).
        self._published_out = asyncio.Event()

    # -- the agent's two publication points --------------------------------------------

    def publish(
        self,
        config: ClassConfig,
        advertised: Iterable[AdvertisedDevice],
        discovered: Mapping[str, DiscoveredDevice],
    ) -> bool:
        """Put ``config``'s class into the pool as ``advertised``; whether what the slices
        offer changed (nothing to wait for when it did not)."""
        cache = self._cache.setdefault(config.name, {})
        classes = self.config.class_names
        devices = tuple(
            pool_devices(self.config.vendor, config, advertised, discovered, cache, classes=classes)
        )
        if self.by_capacity:
            devices = tuple(shared_once(devices, classes=classes))
        self.pool.publish(config.name, devices)
        return self.offered.publish(config.name, devices if self.serving else ())

    @property
    def serving(self) -> bool:
        """Whether the kubelet plugin serves (the slices offer the pool)."""
        return not self._not_serving

    def _serving_changed(self, serving: bool, why: str) -> None:
        """The plugin's sockets became served, or stopped being: offer the pool, or
        nothing. Not once stopping or handed over (the slices then stay, see :meth:`stop`)."""
        # Kept while handed over too: what is offered if this instance takes the slices back.
        self._not_serving = "" if serving else why or "not serving"
        if self.offered.closed:
            return
        # The pool keeps each class's devices: offered again as they are when serving resumes.
        for name, devices in self.pool.by_class.items():
            self.offered.publish(name, devices if serving else ())
        if serving:
            log.info(
                "DRA driver serving; its devices are offered in the ResourceSlices",
                extra=fields(driver=self.name, devices=len(self.pool.devices)),
            )
        else:
            log.warning(
                "DRA driver not serving; its devices are withdrawn from the ResourceSlices: %s",
                self._not_serving,
                extra=fields(driver=self.name),
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
                extra=fields(driver=self.name),
            )

    # -- life ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the driver, once (whichever class asks first): one attempt now, the retries
        on the agent's group. Raises only :class:`~cdi_gen.errors.SocketInUseError` (a
        second copy of this agent), as every attempt does."""
        if self._started:
            return
        self._started = True
        if not await self.attempt():
            self.tools.spawn(self.retrying.until(self.attempt), "start DRA driver")

    async def attempt(self) -> bool:
        """One attempt to start the driver; False (counted, and logged as its retry says)
        if it failed."""
        try:
            await self._serve()
        except SocketInUseError:
            raise  # a second copy of this agent: no retry will change that, the agent exits
        except Exception as exc:
            self.error = describe(exc)
            self.retrying.failed(
                self.error,
                "DRA driver failed to start (attempt %(attempt)d, next in %(delay)gs): %(why)s",
            )
            return False
        self.error = None
        self.retrying.succeeded()
        return True

    async def _serve(self) -> None:
        """Connect to the API server, serve the kubelet plugin, publish the slices.

        Each part is made once and kept, so a later attempt resumes where one failed. The
        publisher starts after the first attempt to serve, whatever its outcome: serving, it
        publishes the pool; not serving, an empty pool (earlier slices withdrawn).

        Raises :class:`~cdi_gen.errors.CdiGenError` when the API server's config cannot be
        read, the plugin cannot be made (a socket path too long), its checkpoint is refused or
        a socket cannot be served; the agent retries.
        """
        from cdi_gen.apiserver.client import ApiClient

        settings = self.settings
        if self.client is None:
            self.client = await ApiClient.open(settings.cluster.kubeconfig)
        client = self.client
        if not self._asked_capacity:
            await self._ask_capacity(client)
        try:
            if self.plugin is None:
                self.plugin = self._make_plugin(client)
                self.plugin.follow_serving(self._serving_changed)
                if settings.dra.pod_uid is not None:
                    self.tools.spawn(self._yield_slices(self.plugin), f"successor {self.name}")
            plugin = self.plugin
            make_folder(settings.kubelet.plugins_registry_dir)
            make_folder(settings.kubelet.plugins_dir / self.name)
            try:
                await plugin.start()
            except BaseException:
                # A socket served before the failure must not stay (the kubelet would dial a
                # driver that cannot prepare); the next attempt serves both anew.
                with contextlib.suppress(Exception):
                    await plugin.stop(grace=0)
                raise
        finally:
            if self.publisher is None:
                self._start_publisher(client)
        log.info(
            "DRA driver started",
            extra=fields(driver=self.name, node=self.node, devices=len(self.pool.devices)),
        )

    def _start_publisher(self, client: ApiClient) -> None:
        """Publish ``offered`` from now on: a publisher of its own, run on the agent's group."""
        from cdi_gen.dra.plugin.publisher import SlicePublisher

        publisher = SlicePublisher(
            client, self.name, self.node, self.offered, retry_max=self.settings.retry.max_seconds
        )
        self.publisher = publisher
        self._published_out = asyncio.Event()
        self.tools.spawn(self._publish(publisher, self._published_out), f"slices {self.name}")
        self._export(publisher)

    async def _ask_capacity(self, client: ApiClient) -> None:
        """Whether shared devices are published once, by capacity, or as slots: asked of
        the API server once, before anything is offered, and only when a class is shared."""
        shared = [c for c in self.config.classes if c.api == "dra" and c.sharing.replicas > 1]
        if shared:
            why = await consumable_capacity(client, self.name, self.node)
            self.by_capacity = why is None
            extra = fields(driver=self.name)
            if why is None:
                log.info("shared devices published by capacity", extra=extra)
            else:
                log.info("shared devices published as N slots: %s", why, extra=extra)
        self._asked_capacity = True
        if self.by_capacity:
            classes = self.config.class_names
            for config in shared:
                devices = shared_once(self.pool.by_class.get(config.name, ()), classes=classes)
                self.pool.publish(config.name, devices)
                self.offered.publish(config.name, devices if self.serving else ())

    def _make_plugin(self, client: ApiClient) -> DraPlugin:
        from cdi_gen.dra.driver.claimreader import ApiClaimReader
        from cdi_gen.dra.driver.claimspecs import ClaimSpecs
        from cdi_gen.dra.driver.claimstatus import ClaimStatus
        from cdi_gen.dra.driver.preparer import PoolPreparer
        from cdi_gen.dra.plugin.claims import Refusal
        from cdi_gen.dra.plugin.server import DraPlugin
        from cdi_gen.dra.plugin.service import MAX_READING_CALLS

        settings = self.settings
        registered = {
            ok: self.metrics.registrations.labels(self.name, "ok" if ok else "error")
            for ok in (True, False)
        }

        def on_register(ok: bool, error: str) -> None:
            registered[ok].inc()

        self.claim_status = ClaimStatus(
            client, self.name, asyncio.get_running_loop(), retry_max=settings.retry.max_seconds
        )
        preparer = PoolPreparer(
            self.name,
            self.pool,
            ApiClaimReader(client, asyncio.get_running_loop()),
            pool_name=self.node,
            cdi_kinds=[
                f"{self.config.vendor}/{c.name}" for c in self.config.classes if c.api == "dra"
            ],
            state_dir=settings.paths.state_dir,
            max_reading_calls=MAX_READING_CALLS,
            resolver=self.resolver,
            # A claim's own specs sit beside its class's, written by the same instance.
            claim_specs=ClaimSpecs(
                settings.paths.spec_dir,
                settings.instance or self.config.vendor,
                store=self.specs,
                driver=self.name,
                # Beside the plugin's socket: a host folder the DaemonSet already mounts.
                metadata_dir=settings.kubelet.plugins_dir / self.name / "dra-device-metadata",
            ),
            status=self.claim_status,
        )
        return DraPlugin(
            self.name,
            self.pool,
            preparer,
            pool_name=self.node,
            registry_dir=settings.kubelet.plugins_registry_dir,
            plugins_dir=settings.kubelet.plugins_dir,
            pod_uid=settings.dra.pod_uid,
            on_register=on_register,
            max_backoff=settings.retry.max_seconds,
            # Counted with the device plugins' allocations, under the driver's name: a
            # prepared claim is DRA's allocation on the node.
            on_prepare=self.metrics.allocate_hook(
                self.name,
                [*Refusal, "claim-read", "checkpoint", "internal"],
            ),
        )

    def _export(self, publisher: SlicePublisher) -> None:
        """The pool's generation and whether it is published, read at scrape time (the
        publisher's own state, never a copy gone stale)."""
        self.metrics.pool_generation.labels(self.name).set_function(lambda: publisher.generation)
        self.metrics.pool_published.labels(self.name).set_function(
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
                await self._unless_closed(self.plugin.predecessors_yielded())
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
            extra=fields(driver=self.name),
            count=self.metrics.failures.labels(self.name, "internal").inc,
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

    def waiting(self) -> str | None:
        """For ``/readyz``: what the driver still waits for, or None when ready."""
        if self.error is not None:
            return f"DRA driver {self.name} (not serving: {self.error})"
        if self.plugin is not None and not self.serving:
            return f"DRA driver {self.name} (not serving: {self._not_serving})"
        if self.plugin is None or self.plugin.registrations == 0:
            return f"DRA driver {self.name} (not registered with the kubelet)"
        if self.publisher is None or self.publisher.published_version < self.offered.version:
            return f"DRA driver {self.name} (ResourceSlices not published)"
        return None

    async def _yield_slices(self, plugin: DraPlugin) -> None:
        """The newest instance publishes the slices: once a newer one registered beside us
        (a rolling update), this one stops publishing (the slices stay as they are, its).
        Should that one go while this one still runs (killed: out of memory, a bad release
        crashing), this one takes them back: nobody else would publish them again."""
        while True:
            found = await plugin.superseded()
            log.info("a newer instance publishes the ResourceSlices now: %s", found)
            self.offered.close()
            # Said only once our last write is done: the newer one publishes after it, and
            # so has the last word.
            await self._published_out.wait()
            plugin.mark_yielded()
            await plugin.successors_gone()
            if self._stopped or self.client is None:
                return
            log.warning(
                "the newer instance is gone (%s); this one publishes the ResourceSlices again",
                found,
                extra=fields(driver=self.name),
            )
            plugin.mark_yielded(False)
            self._take_back(self.client)

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

    async def stop(self, *, successor: bool = True) -> None:
        """Stop serving, once; never raises. The slices stay (running pods keep their
        devices, and a new agent adopts them), the kubelet removes them when no driver comes
        back. ``successor``: whether a newer instance may come to take over (a rolling
        update), which this one then keeps serving for, bounded; False for an uninstall."""
        if self._stopped:
            return
        self._stopped = True
        try:
            await self._close(successor)
        except Exception:
            agent_log.exception("stopping the DRA driver failed")

    async def _close(self, successor: bool) -> None:
        # Closing the offered pool ends the publisher's run (a task of the agent's group);
        # closed first, so that the plugin's stop below withdraws nothing.
        self.offered.close()
        self.pool.close()
        if self.plugin is not None:
            if self.publisher is not None:
                # A write still under way ends before our socket goes: a newer instance
                # takes a socket no longer served for an instance that writes no more.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(WITHDRAW_SECONDS):
                        await self._published_out.wait()
            if successor:
                self.handed_over = await self.plugin.hand_over()
            await self.plugin.stop(grace=1.0)
        if self.claim_status is not None:
            await self.claim_status.close()
        if self.client is not None:
            await self.client.close()
