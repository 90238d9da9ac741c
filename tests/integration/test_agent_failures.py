"""Failures the agent must contain, on this machine: real loop devices and kernel uevents,
real spec files, real gRPC to a fake kubelet, /metrics and /readyz over real HTTP.

One bad device or one class that cannot serve is logged, counted in
``cdi_gen_failures_total{resource, reason}`` and skipped; every other device and class goes
on, and the agent keeps running.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from cdi_gen.agent.agent import Agent
from cdi_gen.config.loader import parse_config
from cdi_gen.config.settings import Settings
from cdi_gen.model import DeviceRecord
from tests.agentrun import running_agent
from tests.fakes.kubelet import ConnectedPlugin, FakeKubelet
from tests.loopdev import LoopDevices
from tests.waiting import until

pytestmark = pytest.mark.timeout(60)

# Kept apart from the ranges of the other suites (200-299, 300-399).
PINNED = (600, 649)
PLAIN = (650, 699)


def _names(spec_dir: Path, cls: str) -> set[str]:
    try:
        doc = orjson.loads((spec_dir / f"example.com-{cls}.json").read_bytes())
    except FileNotFoundError:
        return set()
    return {d["name"] for d in doc["devices"]}


def _loops(low: int, high: int) -> LoopDevices:
    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        pytest.fail("these tests need root and /dev/loop-control (CI runs as root)")
    return LoopDevices(low=low, high=high)


@pytest.fixture
def pinned_loops() -> LoopDevices:
    devices = _loops(*PINNED)
    yield devices
    devices.cleanup()


@pytest.fixture
def plain_loops() -> LoopDevices:
    devices = _loops(*PLAIN)
    yield devices
    devices.cleanup()


async def _http(agent: Agent, path: str) -> tuple[int, str]:
    host, port = agent._http.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = (await asyncio.wait_for(reader.read(), 5)).decode()
    writer.close()
    head, _, body = data.partition("\r\n\r\n")
    return int(head.split()[1]), body


async def _failures(agent: Agent, resource: str, reason: str) -> float:
    _, body = await _http(agent, "/metrics")
    pattern = (
        rf'^cdi_gen_failures_total\{{reason="{re.escape(reason)}",'
        rf'resource="{re.escape(resource)}"\}} (\S+)$'
    )
    match = re.search(pattern, body, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def _until_listed(plugin: ConnectedPlugin, wanted: str, within: float = 5.0) -> set[str]:
    async with asyncio.timeout(within):
        while True:
            ids = set(await plugin.next_devices(within=within))
            if wanted in ids:
                return ids


# --- defect: one device stops the whole agent ---------------------------------------------------


def _two_classes() -> dict[str, Any]:
    return {
        "vendor": "example.com",
        "classes": [
            {
                # A runtime stuck at 0.3.0 cannot read a device name that starts with a digit.
                "name": "pinned",
                "match": {"subsystem": "block", "kernel": "loop6[0-4][0-9]"},
                "deviceName": "{number}",
                "cdiVersion": "0.3.0",
            },
            {
                "name": "plain",
                "match": {"subsystem": "block", "kernel": "loop6[5-9][0-9]"},
                "deviceName": "{kernel}",
            },
        ],
    }


@pytest.mark.kernel
async def test_a_device_the_pinned_version_cannot_express_stops_at_its_class(
    short_dir: Path, pinned_loops: LoopDevices, plain_loops: LoopDevices
) -> None:
    spec_dir = short_dir / "cdi"
    first = plain_loops.add()
    async with (
        FakeKubelet(short_dir / "dp") as kubelet,
        running_agent(short_dir, _two_classes()) as (agent, task),
    ):
        plugins = {}
        for _ in range(2):
            p = await kubelet.next_registration(within=10)
            plugins[p.request.resource_name] = p
        await _until_listed(plugins["example.com/plain"], first.name)

        # Hot-plugged: its name needs cdiVersion 0.5.0, the class is pinned to 0.3.0.
        bad = pinned_loops.add()
        await until(
            lambda: _failures(agent, "example.com/pinned", "version"), "a pinned-version failure"
        )
        assert await _failures(agent, "example.com/pinned", "version") == 1
        assert not task.done(), "the agent stopped"
        assert str(bad.number) not in _names(spec_dir, "pinned")

        # Everything else goes on: a new device of the other class is written and listed.
        second = plain_loops.add()
        ids = await _until_listed(plugins["example.com/plain"], second.name)
        assert {first.name, second.name} <= ids
        assert {first.name, second.name} <= _names(spec_dir, "plain")
        assert not task.done()
        # One device of the pinned class failing does not make the node unready.
        assert (await _http(agent, "/readyz"))[0] == 200
        # Counted once, not once per rewrite of the class's spec.
        assert await _failures(agent, "example.com/pinned", "version") == 1


async def test_only_the_offending_device_of_a_class_is_skipped(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Within one class: ``9xyz`` needs 0.5.0, ``loop1`` does not; loop1 is written and
    published, 9xyz is logged, counted and left out of both."""
    config = parse_config(
        {
            "vendor": "example.com",
            "classes": [
                {
                    "name": "disk",
                    "match": {"subsystem": "block"},
                    "deviceName": "{kernel}",
                    "cdiVersion": "0.3.0",
                }
            ],
        },
        "test.yaml",
    )
    agent = Agent(
        config, Settings(spec_dir=short_dir / "cdi", no_kubelet=True, metrics_address=None)
    )

    def disk(name: str) -> DeviceRecord:
        return DeviceRecord(
            sys_path=f"/sys/devices/virtual/block/{name}",
            subsystem="block",
            sys_name=name,
            devnode=f"/dev/{name}",
        )

    runner = agent.runners["disk"]
    with caplog.at_level(logging.WARNING, logger="cdi_gen.agent.agent"):
        for change in agent.discovery.replace([disk("loop1"), disk("9xyz")]):
            await runner.apply(change, None)
    assert _names(short_dir / "cdi", "disk") == {"loop1"}
    assert set(runner.board.devices) == {"loop1"}
    assert agent.metrics.failures.labels("example.com/disk", "version")._value.get() == 1
    (record,) = [r for r in caplog.records if "9xyz" in r.getMessage()]
    assert "0.3.0" in record.getMessage() and "starts with digit" in record.getMessage()
    # A rewrite of the class (another device arrives) neither logs nor counts it again.
    caplog.clear()
    for change in agent.discovery.apply([dataclasses.replace(disk("loop2"), action="add")]):
        await runner.apply(change, None)
    assert _names(short_dir / "cdi", "disk") == {"loop1", "loop2"}
    assert set(runner.board.devices) == {"loop1", "loop2"}
    assert agent.metrics.failures.labels("example.com/disk", "version")._value.get() == 1
    assert not [r for r in caplog.records if "9xyz" in r.getMessage()]


# --- defect: udev values reach paths and env unchecked (through the agent) -----------------------


@pytest.mark.kernel
async def test_a_backing_file_name_with_a_newline_skips_only_its_device(
    short_dir: Path, plain_loops: LoopDevices, caplog: pytest.LogCaptureFixture
) -> None:
    config = {
        "vendor": "example.com",
        "classes": [
            {
                "name": "plain",
                "match": {"subsystem": "block", "kernel": "loop6[5-9][0-9]"},
                "deviceName": "{kernel}",
                "containerEdits": {"env": ["BACKING={attribute[loop/backing_file]}"]},
            }
        ],
    }
    files = short_dir / "img"
    files.mkdir()
    good_file = files / "good.img"
    evil_file = files / "evil\nLD_PRELOAD=x.so"
    for f in (good_file, evil_file):
        f.write_bytes(b"\0" * 4096)
    spec_dir = short_dir / "cdi"
    with caplog.at_level(logging.WARNING, logger="cdi_gen.agent.agent"):
        async with (
            FakeKubelet(short_dir / "dp") as kubelet,
            running_agent(short_dir, config) as (agent, task),
        ):
            plugin = await kubelet.next_registration(within=10)
            good, evil = plain_loops.add(), plain_loops.add()
            plain_loops.attach(evil, evil_file)
            plain_loops.attach(good, good_file)
            ids = await _until_listed(plugin, good.name)
            assert evil.name not in ids
            assert _names(spec_dir, "plain") >= {good.name}
            assert evil.name not in _names(spec_dir, "plain")
            doc = orjson.loads((spec_dir / "example.com-plain.json").read_bytes())
            (entry,) = [d for d in doc["devices"] if d["name"] == good.name]
            assert entry["containerEdits"]["env"] == [f"BACKING={good_file}"]
            assert await _failures(agent, "example.com/plain", "device-skipped") >= 1
            assert not task.done()
    lines = [r.getMessage() + str(getattr(r, "fields", "")) for r in caplog.records]
    hits = [line for line in lines if "control character" in line]
    assert hits, lines
    assert any(evil.name in line and "{attribute[loop/backing_file]}" in line for line in hits)
    # The value is quoted escaped: the log line stays one line.
    assert all("\n" not in line for line in hits)


# --- defect: /readyz says ready while a class's plugin failed to start ---------------------------


async def test_a_class_whose_plugin_cannot_start_is_not_ready_and_retried(short_dir: Path) -> None:
    config = {
        "vendor": "example.com",
        "classes": [
            {"name": "plain", "match": {"subsystem": "block", "kernel": "loop6[5-9][0-9]"}},
            {"name": "other", "match": {"subsystem": "block", "kernel": "loop6[0-4][0-9]"}},
        ],
    }
    folder = short_dir / "dp"
    folder.mkdir()
    planted = folder / "example.com-plain.sock"
    planted.write_text("not a socket")
    async with (
        FakeKubelet(folder) as kubelet,
        running_agent(short_dir, config, retry_max_seconds=1.0) as (agent, task),
    ):
        # The other class serves and registers at once.
        first = await kubelet.next_registration(within=10)
        assert first.request.resource_name == "example.com/other"

        async def other_ready() -> tuple[int, str] | None:
            status, body = await _http(agent, "/readyz")
            return None if "example.com/other" in body else (status, body)

        # The fake records Register before the plugin sees its answer.
        status, body = await until(other_ready, "/readyz no longer naming the other class")
        assert status == 503
        assert "example.com/plain" in body and "not a socket" in body
        assert "example.com/other" not in body

        async def refusals() -> bool:
            return await _failures(agent, "example.com/plain", "plugin-start") >= 2

        await until(refusals, "two refused starts of the plain class's plugin")
        assert planted.read_text() == "not a socket"  # never replaced: not ours
        assert (await _http(agent, "/readyz"))[0] == 503

        planted.unlink()
        again = await kubelet.next_registration(within=5)
        assert again.request.resource_name == "example.com/plain"

        async def ready() -> tuple[int, str] | None:
            status, body = await _http(agent, "/readyz")
            return (status, body) if status == 200 else None

        status, body = await until(ready, "/readyz answering 200")
        assert body.strip() == "ready"
        assert not task.done()
