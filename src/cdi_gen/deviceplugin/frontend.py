"""A class served as a kubelet device plugin (:class:`~cdi_gen.deviceplugin.server.DevicePlugin`).

The plugin advertises the class's :class:`~cdi_gen.deviceplugin.board.DeviceBoard`, which the
class runner publishes (once per change): nothing is waited for, ListAndWatch sends a
withdrawal as soon as the board has it. Starting and registering are retried through
:class:`~cdi_gen.retry.Retry`, bounded by ``retry_max_seconds``.
grpc loads when the plugin is built, at the first start, and only when a kubelet is used.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from cdi_gen.config.models import ClassConfig
from cdi_gen.config.settings import Settings
from cdi_gen.deviceplugin.board import DeviceBoard
from cdi_gen.errors import CdiGenError, SocketInUseError
from cdi_gen.logs import fields
from cdi_gen.modes import make_folder
from cdi_gen.retry import Failures, Retry, Tools, describe

if TYPE_CHECKING:
    from cdi_gen.cdi.resolution import SpecResolver
    from cdi_gen.deviceplugin.server import DevicePlugin

__all__ = ["DevicePluginFrontend"]

log = logging.getLogger("cdi_gen.agent.agent")


class DevicePluginFrontend:
    """The device plugin of ``vendor/<config.name>``, serving ``board``.

    ``resolver`` (the runtime's view of the spec folders) checks every name Allocate
    answers. A plugin that cannot be built (a socket path too long) is not ready for good;
    one that cannot serve is retried with backoff, each failure counted and logged through
    ``failures``.
    """

    def __init__(
        self,
        vendor: str,
        config: ClassConfig,
        board: DeviceBoard,
        *,
        resolver: SpecResolver,
        settings: Settings,
        tools: Tools,
        failures: Failures,
    ) -> None:
        self.vendor = vendor
        self.config = config
        self.board = board
        self.resolver = resolver
        self.settings = settings
        self.tools = tools
        self.fail = failures
        self.resource = failures.resource
        self.plugin: DevicePlugin | None = None
        #: The start's retry loop (made at the first start).
        self.retrying: Retry | None = None
        #: Why the plugin is not serving, or None.
        self.error: str | None = None

    async def start(self) -> None:
        try:
            self.plugin = self._make_plugin()
        except CdiGenError as exc:
            # Nothing a retry could change (a socket path too long): not ready for good.
            self.error = describe(exc)
            self.fail("plugin-start", "device plugin cannot be created: %s", self.error)
            return
        self.retrying = Retry(self.tools.backoff(), failures=self.fail, reason="plugin-start")
        if not await self._attempt():
            self.tools.spawn(self.retrying.until(self._attempt), f"start {self.resource}")

    def _make_plugin(self) -> DevicePlugin:
        # grpc loads here, with the device plugin, and only when a kubelet is used.
        from cdi_gen.deviceplugin.allocation import AllocationRefusal
        from cdi_gen.deviceplugin.server import DevicePlugin

        metrics, settings, resource = self.tools.metrics, self.settings, self.resource
        registered = {
            ok: metrics.registrations.labels(resource, "ok" if ok else "error")
            for ok in (True, False)
        }

        def on_register(ok: bool, error: str) -> None:
            registered[ok].inc()

        return DevicePlugin(
            self.vendor,
            self.config.name,
            self.board,
            self.resolver,
            plugin_dir=settings.kubelet.device_plugin_dir,
            kubelet_socket=settings.kubelet.socket,
            cdi_annotations=settings.kubelet.cdi_annotations,
            physical_policy=self.config.sharing.policy,
            one_slot_per_device=self.config.sharing.fail_requests_greater_than_one,
            on_allocate=metrics.allocate_hook(resource, [*AllocationRefusal, "internal"]),
            on_register=on_register,
            max_backoff=settings.retry.max_seconds,
            pod_uid=settings.dra.pod_uid,
        )

    async def _attempt(self) -> bool:
        """One attempt to serve the plugin; False (counted, and logged as its retry says)
        if it failed."""
        plugin, retrying = self.plugin, self.retrying
        assert plugin is not None and retrying is not None
        try:
            make_folder(self.settings.kubelet.device_plugin_dir)
            await plugin.start()
        except SocketInUseError:
            # A second copy of this agent: no retry will change that, and the agent exits.
            with contextlib.suppress(Exception):
                await plugin.stop(grace=0)
            raise
        except Exception as exc:
            # One class failing to serve must not stop the others; /readyz names it.
            self.error = describe(exc)
            retrying.failed(
                self.error,
                "device plugin failed to start (attempt %(attempt)d, next in %(delay)gs): %(why)s",
            )
            with contextlib.suppress(Exception):
                await plugin.stop(grace=0)
            return False
        if self.error is not None:
            log.info("device plugin started", extra=fields(resource=self.resource))
        self.error = None
        retrying.succeeded()
        return True

    async def stop(self) -> None:
        if self.plugin is None:
            return
        try:
            await self.plugin.stop(grace=1.0)
        except Exception:
            log.exception("stopping the device plugin of %s failed", self.resource)

    def waiting(self) -> str | None:
        if self.error is not None:
            return f"{self.resource} (device plugin not serving: {self.error})"
        if self.plugin is not None and self.plugin.registrations == 0:
            return f"{self.resource} (not registered with the kubelet)"
        return None
