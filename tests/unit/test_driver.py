"""The DRA driver's wiring: the pool it publishes, what /readyz says, a publisher that fails."""

from __future__ import annotations

import asyncio

import pytest

from cdi_gen import driver as driver_module
from cdi_gen.config.loader import parse_config
from cdi_gen.config.settings import load_settings
from cdi_gen.driver import DraDriver
from cdi_gen.metrics import Metrics
from cdi_gen.model import AdvertisedDevice

CONFIG = parse_config(
    {
        "vendor": "example.com",
        "classes": [{"name": "fpga", "match": {"subsystem": "block"}, "api": "dra"}],
    },
    "test.yaml",
)


def _driver() -> DraDriver:
    return DraDriver(CONFIG, load_settings({"node_name": "node-1"}), Metrics())


def test_publish_puts_the_class_into_the_pool() -> None:
    driver = _driver()
    cls = CONFIG.classes[0]
    assert driver.publish(cls, [AdvertisedDevice("fpga0", physical="/sys/x")], {})
    (device,) = driver.pool.devices.values()
    assert (device.name, device.cdi_name) == ("fpga-fpga0", "example.com/fpga=fpga0")
    assert not driver.publish(cls, [AdvertisedDevice("fpga0", physical="/sys/x")], {})
    assert (driver.name, driver.node) == ("example.com", "node-1")


def test_waiting_names_what_is_missing() -> None:
    driver = _driver()
    assert driver.waiting() == "DRA driver example.com (not registered with the kubelet)"
    driver.error = "no API server configuration"
    assert driver.waiting() == ("DRA driver example.com (not serving: no API server configuration)")


class _Flaky:
    """A publisher whose first run fails the way a bug would."""

    def __init__(self) -> None:
        self.runs = 0

    async def run(self) -> None:
        self.runs += 1
        if self.runs == 1:
            raise RuntimeError("a bug")


def test_a_failing_publisher_is_started_over_not_fatal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(driver_module, "RESTART_SECONDS", 0.0)
    driver = _driver()
    flaky = _Flaky()
    asyncio.run(driver._publish(flaky))  # type: ignore[arg-type]
    assert flaky.runs == 2
    assert driver.metrics.failures.labels("example.com", "internal")._value.get() == 1
    assert "publishing ResourceSlices failed; starting over" in caplog.text


class _Published:
    generation = 7
    published_version = 0


def test_pool_metrics_are_read_from_the_publisher_at_scrape_time() -> None:
    driver = _driver()
    publisher = _Published()
    driver._export(publisher)  # type: ignore[arg-type]
    text = driver.metrics.exposition().decode()
    assert 'cdi_gen_dra_pool_generation{driver="example.com"} 7.0' in text
    assert 'cdi_gen_dra_pool_published{driver="example.com"} 1.0' in text
    driver.publish(CONFIG.classes[0], [AdvertisedDevice("fpga0")], {})  # pool version 1
    text = driver.metrics.exposition().decode()
    assert 'cdi_gen_dra_pool_published{driver="example.com"} 0.0' in text
