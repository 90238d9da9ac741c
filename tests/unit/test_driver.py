"""The DRA driver's wiring: the pool it publishes, what /readyz says, the publisher's bound.

The generic lifecycle it composes (what the slices offer, the publisher started over) is
tested in tests/unit/test_dra_offering.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any

import pytest

from cdi_gen.apiserver.client import ApiClient
from cdi_gen.config.loader import parse_config
from cdi_gen.config.settings import load_settings
from cdi_gen.dra.node import DraDriver
from cdi_gen.errors import ConfigError
from cdi_gen.metrics import Metrics
from cdi_gen.model import AdvertisedDevice
from cdi_gen.retry import Tools
from tests.fakes.apiserver import SLICES, Answer, FakeApiServer
from tests.unit.conftest import API_NODE

CONFIG = parse_config(
    {
        "vendor": "example.com",
        "classes": [{"name": "fpga", "match": {"subsystem": "block"}, "api": "dra"}],
    },
    "test.yaml",
)


def _unrun(work: Coroutine[Any, Any, None], name: str) -> None:
    work.close()


def _driver(**settings: object) -> DraDriver:
    loaded = load_settings({"node_name": "node-1", **settings})
    return DraDriver(CONFIG, loaded, Tools(Metrics(), loaded.retry.max_seconds, _unrun))


def test_publish_puts_the_class_into_the_pool() -> None:
    driver = _driver()
    cls = CONFIG.classes[0]
    driver.offering._serving_changed(True, "")
    assert driver.publish(cls, [AdvertisedDevice("fpga0", physical="/sys/x")], {})
    (device,) = driver.pool.devices.values()
    assert (device.name, device.cdi_name) == ("fpga-fpga0", "example.com/fpga=fpga0")
    assert driver.offering.offered.devices == driver.pool.devices
    assert not driver.publish(cls, [AdvertisedDevice("fpga0", physical="/sys/x")], {})
    assert (driver.name, driver.node) == ("example.com", "node-1")


def test_waiting_names_what_is_missing() -> None:
    driver = _driver()
    assert driver.waiting() == "DRA driver example.com (not registered with the kubelet)"
    driver.error = "no API server configuration"
    assert driver.waiting() == ("DRA driver example.com (not serving: no API server configuration)")


def test_a_start_that_fails_without_a_message_still_names_its_cause(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception whose str() is empty (an assert, a bare raise) is named in the log and
    in /readyz on every attempt, not "failed to start (attempt 2): " and "not serving: )"."""
    from cdi_gen.agent.agent import Agent

    agent = Agent(CONFIG, load_settings({"node_name": "node-1"}))
    assert agent.dra is not None

    async def serve() -> None:
        raise AssertionError

    monkeypatch.setattr(agent.dra, "_serve", serve)
    for _ in range(2):
        assert not asyncio.run(agent.dra.attempt())
        why = agent.dra.waiting()
        assert why == (
            "DRA driver example.com (not serving: AssertionError without a message: "
            "AssertionError())"
        )
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "DRA driver failed to start (attempt 1, next in 0.5s): AssertionError without a "
        "message: AssertionError()",
        "DRA driver failed to start (attempt 2, next in 1s): AssertionError without a "
        "message: AssertionError()",
    ]


async def test_the_publisher_is_bounded_by_the_retry_setting(
    api: FakeApiServer,
    client: ApiClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """CDI_GEN_RETRY_MAX_SECONDS bounds the slice publisher's retries (they were held at a
    hard-coded 0.5 to 30 s): with 0.1 s, every retry of a refused write waits 0.1 s."""
    from cdi_gen.apiserver import client as client_module

    async def open_client(kubeconfig: object) -> ApiClient:
        return client

    def no_plugin(api_client: object) -> None:
        raise ConfigError("socket path too long")

    refused = {"kind": "Status", "status": "Failure", "message": "etcd busy", "code": 500}
    api.answers[("POST", SLICES)] = Answer(500, json.dumps(refused).encode(), times=2)
    monkeypatch.setattr(client_module.ApiClient, "open", open_client)
    tasks: list[asyncio.Task[None]] = []

    def spawn(work: Coroutine[Any, Any, None], name: str) -> None:
        tasks.append(asyncio.create_task(work, name=name))

    loaded = load_settings({"node_name": API_NODE, "retry_max_seconds": 0.1})
    driver = DraDriver(CONFIG, loaded, Tools(Metrics(), loaded.retry.max_seconds, spawn))
    monkeypatch.setattr(driver, "_make_plugin", no_plugin)
    assert not await driver.attempt()  # the plugin failed; the publisher runs all the same
    publisher = driver.offering.publisher
    assert publisher is not None and publisher.retry_max == 0.1
    driver.offering._serving_changed(True, "")
    driver.publish(CONFIG.classes[0], [AdvertisedDevice("fpga0")], {})
    try:
        assert await publisher.published(driver.offering.offered.version, 10)
    finally:
        driver.offering.offered.close()
        await asyncio.gather(*tasks)
    lines = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(lines) == 2, lines
    assert all("retrying in 0.1s" in line for line in lines), lines
