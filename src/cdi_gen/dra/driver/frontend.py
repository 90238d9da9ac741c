"""Classes served through the node's DRA driver (:class:`~cdi_gen.dra.driver.driver.DraDriver`).

Every ``api: dra`` class shares one driver: :class:`DraFrontends` builds it, starts it once
(whichever class asks first; a failed attempt is retried with backoff on the agent's group)
and stops it once, and hands each class a :class:`DraFrontend` that publishes the class into
the driver's pool and waits for a withdrawal to reach the ResourceSlices. Imported only when a
class uses DRA: an agent of device plugins alone never loads the DRA modules.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from cdi_gen.cdi.store import SpecStore
from cdi_gen.config.models import AgentConfig, ClassConfig
from cdi_gen.config.settings import Settings
from cdi_gen.dra.driver.driver import DraDriver
from cdi_gen.logs import fields
from cdi_gen.model import AdvertisedDevice, DiscoveredDevice
from cdi_gen.retry import Backoff, Tools, describe, keep_starting

if TYPE_CHECKING:
    from cdi_gen.cdi.resolution import SpecResolver

__all__ = ["DraFrontend", "DraFrontends"]

log = logging.getLogger("cdi_gen.agent.agent")


class DraFrontends:
    """The node's DRA driver, as the frontend of every ``api: dra`` class."""

    def __init__(
        self,
        config: AgentConfig,
        settings: Settings,
        tools: Tools,
        resolver: SpecResolver,
        specs: SpecStore | None = None,
    ) -> None:
        self.tools = tools
        self.driver = DraDriver(config, settings, tools.metrics, resolver, specs)
        self._started = False
        self._stopped = False

    def of(self, config: ClassConfig) -> DraFrontend:
        """The frontend of the class ``config``."""
        return DraFrontend(self, config)

    async def start(self) -> None:
        """Start the driver, once: one attempt now, the retries on the agent's group."""
        if self._started:
            return
        self._started = True
        backoff = self.tools.backoff()
        if not await self.attempt(backoff):
            self.tools.spawn(keep_starting(self.attempt, backoff), "start DRA driver")

    async def attempt(self, backoff: Backoff) -> bool:
        """One attempt to start the driver; False (counted, and logged as ``backoff`` says)
        if it failed."""
        driver = self.driver
        try:
            await driver.start(self.tools.spawn)
        except Exception as exc:
            why = driver.error = describe(exc)
            self.tools.metrics.failures.labels(driver.name, "plugin-start").inc()
            if backoff.failed(why):
                log.error(
                    "DRA driver failed to start (attempt %d, next in %gs): %s",
                    backoff.attempts,
                    backoff.delay,
                    why,
                    extra=fields(driver=driver.name, reason="plugin-start"),
                )
            return False
        driver.error = None
        backoff.succeeded()
        return True

    async def stop(self) -> None:
        """Stop the driver, once; never raises."""
        if self._stopped:
            return
        self._stopped = True
        try:
            await self.driver.stop()
        except Exception:
            log.exception("stopping the DRA driver failed")


class DraFrontend:
    """One ``api: dra`` class's view of the shared driver."""

    def __init__(self, shared: DraFrontends, config: ClassConfig) -> None:
        self.shared = shared
        self.config = config

    def publish(
        self, devices: Sequence[AdvertisedDevice], discovered: Mapping[str, DiscoveredDevice]
    ) -> bool:
        return self.shared.driver.publish(self.config, devices, discovered)

    async def withdrawn(self) -> None:
        # Out of the ResourceSlice before out of the spec, as out of ListAndWatch.
        await self.shared.driver.withdrawn()

    async def start(self) -> None:
        await self.shared.start()

    async def stop(self) -> None:
        await self.shared.stop()

    def waiting(self) -> str | None:
        return self.shared.driver.waiting()
