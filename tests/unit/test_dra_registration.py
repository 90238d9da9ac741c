"""The plugin-watcher registrar: each kubelet notification is one registration, reported
once; the wait for one is bounded and says what is missing; the kubelet's error is quoted
and cut."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from cdi_gen._proto.pluginregistration.v1 import api_pb2
from cdi_gen.errors import QUOTE_LIMIT
from cdi_gen.kubelet.registration import PluginWatcherRegistrar, RegistrationService
from tests.waiting import until

NO_CONTEXT: Any = None


async def test_each_notification_counts_once() -> None:
    service = RegistrationService("cdi-gen.example.com", Path("/k/plugins/d/dra.sock"))
    registrar = PluginWatcherRegistrar(service, timeout=0.1)
    assert registrar.kubelet_id() is None  # no kubelet has called yet
    info = service.get_info(api_pb2.InfoRequest(), NO_CONTEXT)
    assert (info.type, info.endpoint) == ("DRAPlugin", "/k/plugins/d/dra.sock")
    assert registrar.kubelet_id() == 1
    silence = await registrar.register()
    assert silence is not None
    assert "no NotifyRegistrationStatus within 0.1s" in silence

    service.notify(api_pb2.RegistrationStatus(plugin_registered=True), NO_CONTEXT)
    assert await registrar.register() is None
    assert await registrar.register() is not None  # already reported

    # A restarted kubelet asks again: a new identity, and a new registration.
    service.get_info(api_pb2.InfoRequest(), NO_CONTEXT)
    assert registrar.kubelet_id() == 2
    service.notify(api_pb2.RegistrationStatus(error="bad driver"), NO_CONTEXT)
    refused = await registrar.register()
    assert refused == "the kubelet refused the registration: 'bad driver'"
    again = await registrar.register()
    assert again is not None
    assert "bad driver" in again
    assert "no new attempt within" in again


async def test_a_notification_from_another_thread_wakes_the_wait() -> None:
    service = RegistrationService("cdi-gen.example.com", Path("/k/dra.sock"))
    registrar = PluginWatcherRegistrar(service, timeout=5)
    service.get_info(api_pb2.InfoRequest(), NO_CONTEXT)
    loop = asyncio.get_running_loop()
    wait = asyncio.ensure_future(registrar.register())
    # Notify only once the registrar waits: otherwise it finds the notice without waking.
    await until(lambda: service._waiters, "the registrar waiting for a notification")
    await loop.run_in_executor(
        None, service.notify, api_pb2.RegistrationStatus(plugin_registered=True), NO_CONTEXT
    )
    assert await asyncio.wait_for(wait, 1) is None


async def test_a_huge_error_with_newlines_becomes_one_short_quoted_line() -> None:
    service = RegistrationService("cdi-gen.example.com", Path("/k/dra.sock"))
    registrar = PluginWatcherRegistrar(service, timeout=0.1)
    service.get_info(api_pb2.InfoRequest(), NO_CONTEXT)
    error = "refused\n2026-12-01 00:00:00 INFO cdi_gen forged line\n" + "x" * (2 << 20)
    service.notify(api_pb2.RegistrationStatus(error=error), NO_CONTEXT)
    for outcome in (await registrar.register(), await registrar.register()):
        assert outcome is not None
        assert outcome.isprintable(), outcome[:200]
        assert len(outcome) < QUOTE_LIMIT + 200, len(outcome)
        assert "'refused\\n2026-12-01 00:00:00" in outcome
        assert f"({len(error)} long)" in outcome
