"""The agent's retry loops on recorded devices: a spec write that keeps failing is retried
through the shared backoff (never faster than its floor) and logged once per doubling of its
attempts, while every attempt is counted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cdi_gen.agent.agent import Agent
from cdi_gen.config.loader import parse_config
from cdi_gen.config.settings import Settings
from tests.fakes.source import PipeSource
from tests.waiting import until

CONFIG = {
    "vendor": "example.com",
    "classes": [{"name": "loop", "match": {"subsystem": "block", "kernel": "loop[0-9]"}}],
}


async def test_a_failing_spec_write_is_logged_once_per_doubling(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec_dir = tmp_path / "cdi"
    spec_dir.write_text("a file where the spec folder should be")
    source = PipeSource.from_data("export-db-vm.txt", only={"loop0"})
    settings = Settings(
        spec_dir=spec_dir, no_kubelet=True, metrics_address=None, retry_max_seconds=0.1
    )
    agent = Agent(parse_config(CONFIG, "test.yaml"), settings, source=source)
    task = asyncio.create_task(agent.run())
    errors = agent.metrics.failures.labels("example.com/loop", "spec-write")
    try:
        await asyncio.wait_for(agent.started.wait(), 10)
        # Counted on every attempt, which signals nothing else.
        await until(lambda: errors._value.get() >= 9, "nine spec-write attempts", within=20)
    finally:
        agent.stop()
        await asyncio.wait_for(task, 5)
        source.release()
    lines = [r.getMessage() for r in caplog.records if "spec write failed" in r.getMessage()]
    attempts = [int(line.split("(attempt ")[1].split(")")[0]) for line in lines]
    assert errors._value.get() >= 9
    assert attempts[:4] == [1, 2, 4, 8], lines
    assert all("retrying in 0.1s" in line for line in lines), lines
