"""The generic lifecycle of a DRA driver's slices, without a driver: the pool offered only
while the plugin serves, a publisher that fails started over, its metrics read live."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from cdi_gen.dra.plugin import offering as offering_module
from cdi_gen.dra.plugin.offering import Offering
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.metrics import Metrics
from cdi_gen.model import PoolDevice
from cdi_gen.retry import Tools

FPGA0 = PoolDevice("fpga-fpga0", "example.com/fpga=fpga0", "fpga", "/sys/x")


def _unrun(work: Coroutine[Any, Any, None], name: str) -> None:
    work.close()


def _offering() -> Offering:
    return Offering(DevicePool(), Tools(Metrics(), 0.1, _unrun), driver="example.com", node="n1")


def test_the_slices_offer_the_pool_only_while_the_plugin_serves() -> None:
    """The pool always holds the devices (NodePrepareResources answers from it); what the
    publisher follows is empty until the plugin serves and whenever it stops serving."""
    offering = _offering()
    offering.publish("fpga", [FPGA0])
    assert list(offering.pool.devices) == ["fpga-fpga0"]
    assert not offering.offered.devices
    assert not offering.publish("fpga", [FPGA0])  # nothing to withdraw

    offering._serving_changed(True, "")
    assert list(offering.offered.devices) == ["fpga-fpga0"]
    offering._serving_changed(False, "cannot serve on 'x': gone")
    assert not offering.offered.devices
    assert list(offering.pool.devices) == ["fpga-fpga0"]

    offering.offered.close()  # stopping: the slices stay as they are
    offering._serving_changed(True, "")
    assert not offering.offered.devices


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
    monkeypatch.setattr(offering_module, "RESTART_SECONDS", 0.0)
    offering = _offering()
    flaky = _Flaky()
    asyncio.run(offering._publish(flaky, asyncio.Event()))  # type: ignore[arg-type]
    assert flaky.runs == 2
    assert offering.metrics.failures.labels("example.com", "internal")._value.get() == 1
    # A wait of 0 is raised to the floor of every backoff.
    assert "publishing ResourceSlices failed (attempt 1); starting over in 0.1s" in caplog.text


class _Published:
    generation = 7
    published_version = 0


def test_pool_metrics_are_read_from_the_publisher_at_scrape_time() -> None:
    offering = _offering()
    publisher = _Published()
    offering._export(publisher)  # type: ignore[arg-type]
    text = offering.metrics.exposition().decode()
    assert 'cdi_gen_dra_pool_generation{driver="example.com"} 7.0' in text
    assert 'cdi_gen_dra_pool_published{driver="example.com"} 1.0' in text
    offering.publish("fpga", [FPGA0])  # pool version 1
    text = offering.metrics.exposition().decode()
    assert 'cdi_gen_dra_pool_published{driver="example.com"} 0.0' in text
