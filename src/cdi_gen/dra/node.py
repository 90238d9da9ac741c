"""The node's DRA driver as the agent runs it: cdi-gen's devices in the generic lifecycle.

Classes with ``api: dra`` are served here instead of by a device plugin each. The driver is
the one wrapper the agent runs for all of them: every DRA class's runner has it as its
:class:`~cdi_gen.agent.frontend.Frontend` (started once, whichever class asks first, a failed
attempt retried on the agent's group; stopped once) and as its
:class:`~cdi_gen.agent.frontend.DeviceSink`: the runner publishes the class's devices at the
points where a device plugin's class publishes its board, and the driver turns them into pool
entries (:mod:`~cdi_gen.dra.driver.poolentries`; a shared class's slots as one device where
the API server serves consumable capacity, a composite class's wholes beside their parts where
it keeps counters, both asked once at start; counters dropped later leave the parts alone).

The rest is the generic part's: an :class:`~cdi_gen.dra.plugin.offering.Offering` keeps the
node's ResourceSlices offering the pool while the plugin serves, runs the publisher and
yields the slices in a rolling update; the :class:`~cdi_gen.dra.plugin.server.DraPlugin`
answers the kubelet's NodePrepareResources, reading each claim through the API server and
handing it to the driver part, a :class:`~cdi_gen.dra.driver.preparer.PoolPreparer` that
checks it against the pool and records it in the checkpoint. When a device that claims hold
leaves the node or comes back, :class:`~cdi_gen.dra.plugin.notices.DeviceNotices` tells those
claims (a status condition) and their pods (Events, :mod:`~cdi_gen.apiserver.events`);
:meth:`DraDriver.announce` is the agent's hook for what it then did. This module is the one
place the two parts and the agent's API client meet: the driver part itself imports no grpc,
kubelet or API server (``.importlinter``).

The start's retry loop is a :class:`~cdi_gen.retry.Retry` bounded by ``retry_max_seconds``.
The API server client and the DRA gRPC services are imported only when a class uses DRA: an
agent serving device plugins alone loads neither.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from cdi_gen.cdi.store import SpecStore
from cdi_gen.config.models import AgentConfig, ClassConfig
from cdi_gen.config.settings import Settings
from cdi_gen.dra.driver.heldparts import HeldParts
from cdi_gen.dra.driver.poolentries import PoolEntries
from cdi_gen.dra.plugin.capacity import consumable_capacity
from cdi_gen.dra.plugin.counters import partitionable_devices
from cdi_gen.dra.plugin.offering import Offering
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.errors import SocketInUseError
from cdi_gen.logs import fields
from cdi_gen.model import AdvertisedDevice, DiscoveredDevice
from cdi_gen.retry import Retry, Tools, describe

if TYPE_CHECKING:
    from cdi_gen.apiserver.client import ApiClient
    from cdi_gen.cdi.resolution import SpecResolver
    from cdi_gen.dra.driver.preparer import PoolPreparer
    from cdi_gen.dra.plugin.claimstatus import ClaimStatus
    from cdi_gen.dra.plugin.notices import DeviceNotices
    from cdi_gen.dra.plugin.server import DraPlugin

__all__ = ["Announcing", "CompositeForm", "DraDriver"]

log = logging.getLogger("cdi_gen.dra.node")
#: The start's failures are the agent's lines, as every frontend's are.
agent_log = logging.getLogger("cdi_gen.agent.agent")


class Announcing:
    """The driver's hook for what the agent did about a held device that came back."""

    #: What claims holding a device that left or came back are told (made with the plugin).
    notices: DeviceNotices | None = None

    def announce(
        self, class_name: str, device_id: str, action: str, lines: Sequence[str], *, failed: bool
    ) -> None:
        """What the agent did about a held device of class ``class_name`` that came back
        (``device_id`` its CDI device name): see :meth:`DeviceNotices.announce_device
        <cdi_gen.dra.plugin.notices.DeviceNotices.announce_device>`. From any thread; never
        waits, never raises; nothing before the driver has started."""
        if self.notices is not None:
            self.notices.announce_device(class_name, device_id, action, lines, failed=failed)


class DraDriver(Announcing):
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
        #: The pool offered in the ResourceSlices, their publisher, the plugin's serving.
        self.offering = Offering(self.pool, tools, driver=self.name, node=self.node)
        #: The pool entries: shared devices as slots, composites as parts, until asked.
        self.entries = PoolEntries(config.vendor, config.class_names)
        self._asked_capacity = False
        self.composites = CompositeForm(self)  # whole and parts, or parts alone
        self.preparer: PoolPreparer | None = None  # the driver part, made with the plugin
        self.held_parts = HeldParts(functools.partial(_held, self))
        self.offering.on_dropped = self.composites.dropped
        self.client: ApiClient | None = None
        #: The prepared claims' status writes (made with the plugin).
        self.claim_status: ClaimStatus | None = None
        #: Why the driver could not start (set by the agent's start attempts), or None.
        self.error: str | None = None
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

    @property
    def plugin(self) -> DraPlugin | None:
        """The kubelet plugin, once made."""
        return self.offering.plugin

    # -- the agent's two publication points --------------------------------------------

    def publish(
        self,
        config: ClassConfig,
        advertised: Iterable[AdvertisedDevice],
        discovered: Mapping[str, DiscoveredDevice],
    ) -> bool:
        """Put ``config``'s class into the pool as ``advertised``; whether what the slices
        offer changed (nothing to wait for when it did not)."""
        devices = self.entries.build(config, advertised, discovered)
        return self.offering.publish(config.name, self.held_parts.keep(config.name, devices))

    @property
    def serving(self) -> bool:
        """Whether the kubelet plugin serves (the slices offer the pool)."""
        return self.offering.serving

    async def withdrawn(self) -> None:
        """Wait (bounded) until what the slices offer now is in the API server."""
        await self.offering.withdrawn()

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

        if self.client is None:
            self.client = await ApiClient.open(self.settings.cluster.kubeconfig)
        client = self.client
        if not self._asked_capacity:
            await _ask_capacity(self, client)
        if not self.composites.asked:
            await self.composites.ask(client)
        try:
            plugin = self.plugin if self.plugin is not None else self._make_plugin(client)
            await self.offering.serve(plugin)
        finally:
            self.offering.start_publisher(client)
        log.info(
            "DRA driver started",
            extra=fields(driver=self.name, node=self.node, devices=len(self.pool.devices)),
        )

    def degraded(self, config: ClassConfig) -> str | None:
        return self.composites.degraded(config)  # a composite class as its parts alone

    def _make_plugin(self, client: ApiClient) -> DraPlugin:
        from cdi_gen.dra.driver.claimfiles import ClaimFiles
        from cdi_gen.dra.driver.preparer import PoolPreparer
        from cdi_gen.dra.driver.refusal import DriverRefusal
        from cdi_gen.dra.plugin.claimreader import ApiClaimReader
        from cdi_gen.dra.plugin.claims import NOT_REFUSALS, Refusal
        from cdi_gen.dra.plugin.claimstatus import ClaimStatus
        from cdi_gen.dra.plugin.server import DraPlugin

        settings = self.settings
        ok, failed = (self.metrics.registrations.labels(self.name, r) for r in ("ok", "error"))

        def on_register(registered: bool, error: str) -> None:
            (ok if registered else failed).inc()

        self.claim_status = ClaimStatus(
            client, self.name, asyncio.get_running_loop(), retry_max=settings.retry.max_seconds
        )
        preparer = PoolPreparer(
            self.name,
            self.pool,
            pool_name=self.node,
            cdi_kinds=[
                f"{self.config.vendor}/{c.name}" for c in self.config.classes if c.api == "dra"
            ],
            state_dir=settings.paths.state_dir,
            resolver=self.resolver,
            # A claim's own specs sit beside its class's, written by the same instance.
            claim_files=ClaimFiles(
                settings.paths.spec_dir,
                settings.instance or self.config.vendor,
                store=self.specs,
                driver=self.name,
                # Beside the plugin's socket: a host folder the DaemonSet already mounts.
                metadata_dir=settings.kubelet.plugins_dir / self.name / "dra-device-metadata",
            ),
        )
        self.notices = _notices(self, client, preparer)
        _keep_held_parts(self, preparer)
        return DraPlugin(
            self.name,
            self.pool,
            preparer,
            claims=ApiClaimReader(client, asyncio.get_running_loop()),
            status=self.claim_status,
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
                [*Refusal, *DriverRefusal, *sorted(NOT_REFUSALS)],
            ),
        )

    def waiting(self) -> str | None:
        """For ``/readyz``: what the driver still waits for, or None when ready."""
        if self.error is not None:
            return f"DRA driver {self.name} (not serving: {self.error})"
        if self.plugin is not None and not self.serving:
            return f"DRA driver {self.name} (not serving: {self.offering.not_serving})"
        if self.plugin is None or self.plugin.registrations == 0:
            return f"DRA driver {self.name} (not registered with the kubelet)"
        if not self.offering.published:
            return f"DRA driver {self.name} (ResourceSlices not published)"
        return None

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
        # The publisher's last write, then the plugin (see Offering.close); then the
        # driver's own writers and the client they share.
        self.handed_over = await self.offering.close(successor=successor)
        if self.notices is not None:
            await self.notices.close()
        if self.claim_status is not None:
            await self.claim_status.close()
        if self.client is not None:
            await self.client.close()


async def _ask_capacity(driver: DraDriver, client: ApiClient) -> None:
    """Whether shared devices are published once, by capacity, or as slots: asked of
    the API server once, before anything is offered, and only when a class is shared."""
    shared = [c for c in driver.config.classes if c.api == "dra" and c.sharing.replicas > 1]
    if shared:
        why = await consumable_capacity(client, driver.name, driver.node)
        driver.entries.by_capacity = why is None
        extra = fields(driver=driver.name)
        if why is None:
            log.info("shared devices published by capacity", extra=extra)
        else:
            log.info("shared devices published as N slots: %s", why, extra=extra)
    driver._asked_capacity = True
    if driver.entries.by_capacity:
        for config in shared:
            devices = driver.entries.shared(driver.pool.by_class.get(config.name, ()))
            driver.offering.publish(config.name, devices)


def _held(driver: DraDriver, device: str) -> bool:
    """Whether a claim prepared here holds pool device ``device`` (from what this process
    knows, without the state lock, as :func:`~cdi_gen.dra.driver.preparer.holders`)."""
    from cdi_gen.dra.driver.preparer import holders

    return driver.preparer is not None and bool(holders(driver.preparer, device))


def _keep_held_parts(driver: DraDriver, preparer: PoolPreparer) -> None:
    """The parts kept for a prepared claim follow the claims: asked again after each
    unprepare (which runs on a worker thread; the offer is made on the loop)."""
    driver.preparer = preparer
    loop = asyncio.get_running_loop()
    preparer.on_forgotten = functools.partial(
        loop.call_soon_threadsafe, functools.partial(_offer_kept_again, driver)
    )


def _offer_kept_again(driver: DraDriver) -> None:
    """A claim was unprepared: the classes with a held part kept are offered again, without
    the parts no claim holds any more (on the loop)."""
    for config in driver.config.classes:
        if config.name in driver.held_parts.kept():
            devices = driver.held_parts.keep(config.name, driver.entries.current(config))
            driver.offering.publish(config.name, devices)


def _notices(driver: DraDriver, client: ApiClient, preparer: PoolPreparer) -> DeviceNotices:
    """What the claims holding a device are told when it leaves and comes back, Events
    through ``client`` (made on the loop; follows the pool)."""
    from cdi_gen.apiserver.events import EventRecorder
    from cdi_gen.dra.driver.preparer import holders
    from cdi_gen.dra.plugin.notices import DeviceNotices

    notices = DeviceNotices(
        driver.name,
        driver.node,
        driver.pool,
        functools.partial(holders, preparer),
        status=driver.claim_status,
        claims=client,
        events=EventRecorder(client, driver.name, driver.node),
    )
    driver.pool.follow(notices.published)
    return notices


class CompositeForm:
    """How ``driver``'s composite classes (``group.offer: both``) are published: each group's
    whole beside its parts, kept apart by counters, where the API server keeps them; else
    the parts alone (never a whole and its parts free at once)."""

    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver
        self.asked = False
        #: Why the parts are published alone, once known, else None.
        self.parts_alone: str | None = None

    def classes(self) -> list[ClassConfig]:
        return [
            c
            for c in self.driver.config.classes
            if c.api == "dra" and c.group is not None and c.group.offer == "both"
        ]

    async def ask(self, client: ApiClient) -> None:
        """Asked of the API server once, before anything is offered, and only when a class
        is composite: until then the parts are published alone."""
        driver = self.driver
        composite = self.classes()
        if composite:
            why = await partitionable_devices(client, driver.name, driver.node)
            if why is None:
                log.info(
                    "composite classes published whole and in parts, with counters",
                    extra=fields(driver=driver.name),
                )
                driver.entries.partitionable = True
                self._republish(composite)
            else:
                self._alone(why)
        self.asked = True

    def dropped(self, field: str) -> None:
        """The publisher saw the API server drop ``field`` from a slice: counters dropped
        (the gate turned off under a running agent) leave the parts alone from now on."""
        if field == "counters" and self.driver.entries.partitionable:
            self.driver.entries.partitionable = False
            self._alone("the API server dropped the counters of a slice")
            self._republish(self.classes())

    def degraded(self, config: ClassConfig) -> str | None:
        if self.parts_alone is None or config.group is None or config.group.offer != "both":
            return None
        return f"parts alone, no whole: {self.parts_alone}"

    def _alone(self, why: str) -> None:
        self.parts_alone = why
        log.warning(
            "composite classes published as their parts alone, never a whole beside its parts: %s",
            why,
            extra=fields(driver=self.driver.name),
        )

    def _republish(self, classes: Iterable[ClassConfig]) -> None:
        driver = self.driver
        for config in classes:
            if config.name in driver.pool.by_class:
                devices = driver.held_parts.keep(config.name, driver.entries.current(config))
                driver.offering.publish(config.name, devices)
