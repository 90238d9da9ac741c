"""The node's DRA driver: the device pool, its kubelet plugin and its ResourceSlice publisher.

Classes with ``api: dra`` are served here instead of by a device plugin each. The agent
publishes their devices into one :class:`~cdi_gen.discovery.pool.DevicePool` at the points
where it would publish a device plugin's list; the
:class:`~cdi_gen.apiserver.publisher.SlicePublisher` keeps the node's ResourceSlices equal to
the pool, and the :class:`~cdi_gen.kubelet.draplugin.DraPlugin` answers the kubelet's
NodePrepareResources from it, reading each claim through the API server.

The API server client and the DRA gRPC services are imported only when a class uses DRA: an
agent serving device plugins alone loads neither.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from cdi_gen.config.models import AgentConfig, ClassConfig
from cdi_gen.config.settings import Settings
from cdi_gen.discovery.pool import DevicePool, PoolCache, pool_devices
from cdi_gen.logs import fields
from cdi_gen.metrics import Metrics
from cdi_gen.model import AdvertisedDevice, DiscoveredDevice
from cdi_gen.modes import make_folder

if TYPE_CHECKING:
    from cdi_gen.apiserver.client import ApiClient
    from cdi_gen.apiserver.publisher import SlicePublisher
    from cdi_gen.kubelet.draplugin import DraPlugin

__all__ = ["RESTART_SECONDS", "WITHDRAW_SECONDS", "DraDriver"]

log = logging.getLogger("cdi_gen.driver")

#: Longest a spec rewrite waits for a withdrawal to reach the API server. The order (out of
#: the slice, then out of the spec) holds whenever the API server answers; when it does not,
#: the node's devices must still follow the hardware, and NodePrepareResources refuses a
#: device that is gone whatever a stale slice says.
WITHDRAW_SECONDS = 5.0

#: Wait before a publisher that failed unexpectedly starts over.
RESTART_SECONDS = 5.0

Spawn = Callable[[Coroutine[Any, Any, None], str], None]


class DraDriver:
    """One DRA driver for every ``api: dra`` class of the node."""

    def __init__(self, config: AgentConfig, settings: Settings, metrics: Metrics) -> None:
        self.config = config
        self.settings = settings
        self.metrics = metrics
        self.name = settings.driver_name(config)
        self.node = settings.node()
        self.pool = DevicePool()
        #: Per class: the pool entries last built, reused while their device is unchanged.
        self._cache: dict[str, PoolCache] = {}
        self.plugin: DraPlugin | None = None
        self.publisher: SlicePublisher | None = None
        self.client: ApiClient | None = None
        #: Why the driver is not serving, or None.
        self.error: str | None = None

    # -- the agent's two publication points --------------------------------------------

    def publish(
        self,
        config: ClassConfig,
        advertised: Iterable[AdvertisedDevice],
        discovered: Mapping[str, DiscoveredDevice],
    ) -> bool:
        """Put ``config``'s class into the pool as ``advertised``; whether the pool changed."""
        cache = self._cache.setdefault(config.name, {})
        classes = self.config.class_names
        devices = pool_devices(
            self.config.vendor, config, advertised, discovered, cache, classes=classes
        )
        return self.pool.publish(config.name, devices)

    async def withdrawn(self) -> None:
        """Wait (bounded) until the pool's current version is in the API server."""
        publisher = self.publisher
        if publisher is None:
            return
        if not await publisher.published(self.pool.version, WITHDRAW_SECONDS):
            log.warning(
                "ResourceSlices not updated within %gs; the spec changes anyway",
                WITHDRAW_SECONDS,
                extra=fields(driver=self.name),
            )

    # -- life ------------------------------------------------------------------------

    async def start(self, spawn: Spawn) -> None:
        """Connect to the API server, publish the pool, serve the kubelet plugin.

        Raises :class:`~cdi_gen.errors.CdiGenError` when the API server's config cannot be
        read or a socket cannot be served; the agent retries.
        """
        from cdi_gen.apiserver.claims import ClaimReader
        from cdi_gen.apiserver.client import ApiClient
        from cdi_gen.apiserver.publisher import SlicePublisher
        from cdi_gen.kubelet.claims import Refusal
        from cdi_gen.kubelet.draplugin import DraPlugin

        settings = self.settings
        if self.publisher is None:
            client = self.client = ApiClient(settings.kubeconfig)
            self.publisher = SlicePublisher(client, self.name, self.node, self.pool)
            spawn(self._publish(self.publisher), f"slices {self.name}")
            self._export(self.publisher)
            reader = ClaimReader(client, asyncio.get_running_loop())
            registered = {
                ok: self.metrics.registrations.labels(self.name, "ok" if ok else "error")
                for ok in (True, False)
            }

            def on_register(ok: bool, error: str) -> None:
                registered[ok].inc()

            self.plugin = DraPlugin(
                self.name,
                self.pool,
                reader,
                pool_name=self.node,
                registry_dir=settings.plugins_registry_dir,
                plugins_dir=settings.kubelet_plugins_dir,
                state_dir=settings.state_dir,
                on_register=on_register,
                # Counted with the device plugins' allocations, under the driver's name: a
                # prepared claim is DRA's allocation on the node.
                on_prepare=self.metrics.allocate_hook(
                    self.name,
                    [*Refusal, "claim-read", "checkpoint", "internal"],
                ),
            )
        assert self.plugin is not None
        make_folder(settings.plugins_registry_dir)
        make_folder(settings.kubelet_plugins_dir / self.name)
        await self.plugin.start()
        log.info(
            "DRA driver serving",
            extra=fields(driver=self.name, node=self.node, devices=len(self.pool.devices)),
        )

    def _export(self, publisher: SlicePublisher) -> None:
        """The pool's generation and whether it is published, read at scrape time (the
        publisher's own state, never a copy gone stale)."""
        self.metrics.pool_generation.labels(self.name).set_function(lambda: publisher.generation)
        self.metrics.pool_published.labels(self.name).set_function(
            lambda: float(publisher.published_version >= self.pool.version)
        )

    async def _publish(self, publisher: SlicePublisher) -> None:
        """Run the publisher until the pool closes. It retries API failures itself; anything
        else is a bug, logged and counted, and must not stop the agent (it would take the
        device plugins and the specs of every other class with it): start it over."""
        while True:
            try:
                await publisher.run()
                return
            except Exception:
                self.metrics.failures.labels(self.name, "internal").inc()
                log.exception(
                    "publishing ResourceSlices failed; starting over in %gs",
                    RESTART_SECONDS,
                    extra=fields(driver=self.name),
                )
                await asyncio.sleep(RESTART_SECONDS)

    def waiting(self) -> str | None:
        """For ``/readyz``: what the driver still waits for, or None when ready."""
        if self.error is not None:
            return f"DRA driver {self.name} (not serving: {self.error})"
        if self.plugin is None or self.plugin.registrations == 0:
            return f"DRA driver {self.name} (not registered with the kubelet)"
        if self.publisher is None or self.publisher.published_version < self.pool.version:
            return f"DRA driver {self.name} (ResourceSlices not published)"
        return None

    async def stop(self) -> None:
        """Stop serving; the slices stay (running pods keep their devices, and a new agent
        adopts them), the kubelet removes them when no driver comes back."""
        # Closing the pool ends the publisher's run (a task of the agent's group).
        self.pool.close()
        if self.plugin is not None:
            await self.plugin.stop(grace=1.0)
        if self.client is not None:
            await self.client.close()
