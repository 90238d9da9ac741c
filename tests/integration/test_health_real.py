"""The health seam on real sysfs: a loop device is healthy only while a file backs it.

A class's ``health: {attributes: {size: "[1-9]*"}}`` reads the real ``size`` attribute; the
kernel sends a ``change`` uevent when a backing file is attached or cleared, so the device
turns healthy and back without a resync.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from cdi_gen.config.loader import parse_config
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.sources.udev import UdevWatcher, enumerate_records
from tests.loopdev import LoopDevices

pytestmark = pytest.mark.kernel

TIMEOUT = 5.0


def _discovery(number: int) -> Discovery:
    config = parse_config(
        {
            "vendor": "example.com",
            "classes": [
                {
                    "name": "loop",
                    "match": {"subsystem": "block", "kernel": f"loop{number}"},
                    "health": {"attributes": {"size": "[1-9]*"}},
                }
            ],
        },
        "test.yaml",
    )
    return Discovery(config)


def _health(discovery: Discovery) -> list[bool]:
    return [d.healthy for d in discovery.devices("loop")]


def test_enumeration_reads_the_health_attribute(loops: LoopDevices, tmp_path: Path) -> None:
    dev = loops.add()
    discovery = _discovery(dev.number)
    wants, interest = discovery.wants, discovery.interest
    discovery.replace(enumerate_records(subsystems={"block"}, interest=interest, wants=wants))
    assert _health(discovery) == [False], "an unattached loop device has size 0"
    backing = tmp_path / "backing"
    backing.write_bytes(b"\0" * (1 << 20))
    loops.attach(dev, backing)
    discovery.replace(enumerate_records(subsystems={"block"}, interest=interest, wants=wants))
    assert _health(discovery) == [True]


async def _until_health(discovery: Discovery, watcher: UdevWatcher, want: list[bool]) -> None:
    batches = watcher.batches()
    deadline = time.monotonic() + TIMEOUT
    while _health(discovery) != want:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"health stayed {_health(discovery)}, expected {want}")
        batch = await asyncio.wait_for(anext(batches), left)
        feed = discovery.replace if batch.full else discovery.apply
        feed(batch.records)
    await batches.aclose()


async def test_change_uevent_flips_health(loops: LoopDevices, tmp_path: Path) -> None:
    dev = loops.add()
    discovery = _discovery(dev.number)
    watcher = UdevWatcher(
        source="kernel",
        subsystems=discovery.subsystems,
        interest=discovery.interest,
        wants=discovery.wants,
    )
    discovery.replace(watcher.start())
    try:
        assert _health(discovery) == [False]
        backing = tmp_path / "backing"
        backing.write_bytes(b"\0" * (1 << 20))
        loops.attach(dev, backing)
        await _until_health(discovery, watcher, [True])
        loops.detach(dev)
        await _until_health(discovery, watcher, [False])
    finally:
        watcher.close()
