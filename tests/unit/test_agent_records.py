"""The agent on recorded devices: the record source protocol, fed through a real pipe.

No kernel, no udev database and no kubelet: a :class:`~tests.fakes.source.PipeSource` fed
from ``tests/data/udev`` stands in for udev, and everything downstream (discovery, the spec
folder, the boards, the task group) is the real agent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest

from cdi_gen.agent.agent import Agent
from cdi_gen.config.loader import parse_config
from cdi_gen.config.settings import Settings
from cdi_gen.errors import DiscoveryError
from cdi_gen.model import DeviceRecord
from tests.fakes.source import PipeSource
from tests.waiting import until

CONFIG = {
    "vendor": "example.com",
    "classes": [{"name": "loop", "match": {"subsystem": "block", "kernel": "loop[0-9]"}}],
}


@asynccontextmanager
async def running(source: PipeSource, spec_dir: Path) -> AsyncIterator[Agent]:
    settings = Settings(spec_dir=spec_dir, no_kubelet=True, metrics_address=None)
    agent = Agent(parse_config(CONFIG, "test.yaml"), settings, source=source)
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.started.wait(), 5)
        yield agent
    finally:
        agent.stop()
        await asyncio.wait_for(task, 5)
        source.release()


def _names(spec_dir: Path) -> list[str]:
    try:
        doc = orjson.loads((spec_dir / "example.com-loop.json").read_bytes())
    except FileNotFoundError:
        return []
    return [d["name"] for d in doc["devices"]]


async def test_recorded_devices_reach_the_spec_and_the_board(tmp_path: Path) -> None:
    source = PipeSource.from_data("export-db-vm.txt", only={"loop0", "loop1"})
    spec_dir = tmp_path / "cdi"
    async with running(source, spec_dir) as agent:
        board = agent.runners["loop"].board
        assert _names(spec_dir) == ["loop0", "loop1"]
        assert list(board.devices) == ["loop0", "loop1"]

        loop1: DeviceRecord = next(r for r in source.initial if r.sys_name == "loop1")
        source.remove(loop1)
        # Withdrawn from the board first, then from the spec.
        await until(lambda: list(board.devices) == ["loop0"], "loop1 withdrawn")
        await until(lambda: _names(spec_dir) == ["loop0"], "loop1 out of the spec")

        source.add(loop1)
        await until(lambda: list(board.devices) == ["loop0", "loop1"], "loop1 back")
        assert _names(spec_dir) == ["loop0", "loop1"]  # on disk before it is advertised

        # A full enumeration replaces the state: a device missing from it is gone.
        source.push(loop1, full=True)
        await until(lambda: list(board.devices) == ["loop1"], "loop0 gone")
        await until(lambda: _names(spec_dir) == ["loop1"], "loop0 out of the spec")
    # Stopped: the source was closed and the spec kept for running pods.
    assert _names(spec_dir) == ["loop1"]


class _FailingSource(PipeSource):
    """A source whose reading fails after the start, as a broken netlink socket would."""

    async def batches(self):  # type: ignore[override]
        raise DiscoveryError("netlink socket gone")
        yield  # pragma: no cover - makes this an async generator


async def test_a_failing_source_stops_the_agent_with_its_error(tmp_path: Path) -> None:
    source = _FailingSource.from_data("export-db-vm.txt", only={"loop0"})
    settings = Settings(spec_dir=tmp_path / "cdi", no_kubelet=True, metrics_address=None)
    agent = Agent(parse_config(CONFIG, "test.yaml"), settings, source=source)
    try:
        with pytest.raises(DiscoveryError, match="netlink socket gone"):
            await asyncio.wait_for(agent.run(), 5)
    finally:
        source.release()
    # The clean shutdown ran all the same: the board is closed for ListAndWatch.
    assert agent.runners["loop"].board.closed


class _EndlessSource(PipeSource):
    """A source whose batches never end, not even on close (a recorded stream)."""

    async def batches(self):  # type: ignore[override]
        await asyncio.Event().wait()
        yield  # pragma: no cover - makes this an async generator


async def test_stop_does_not_wait_for_a_source_that_never_ends(tmp_path: Path) -> None:
    source = _EndlessSource.from_data("export-db-vm.txt", only={"loop0"})
    async with running(source, tmp_path / "cdi") as agent:
        assert list(agent.runners["loop"].board.devices) == ["loop0"]
    # running() stopped the agent within its 5 s: the follower was cancelled, not awaited.
