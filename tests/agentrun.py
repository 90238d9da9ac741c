"""The real agent in the test's own event loop, on a test's private folders.

Shared by the integration tests that drive :class:`~cdi_gen.agent.agent.Agent` directly (with real
loop devices and the fake kubelet), so that each starts and stops it the same way: kernel
uevents, an ephemeral metrics port, and a stop that must finish within a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from cdi_gen.agent.agent import Agent
from cdi_gen.config.loader import parse_config
from cdi_gen.config.settings import Settings


@contextlib.asynccontextmanager
async def running_agent(
    short_dir: Path, config: dict[str, Any], **options: Any
) -> AsyncIterator[tuple[Agent, asyncio.Task[None]]]:
    """The agent started on ``config`` with specs in ``short_dir/cdi`` and plugins in
    ``short_dir/dp``, and the task running it; stopped (within 10 s) on exit."""
    agent = Agent(
        parse_config(config, "test.yaml"),
        Settings(
            spec_dir=short_dir / "cdi",
            device_plugin_dir=short_dir / "dp",
            udev_source="kernel",
            metrics_address="127.0.0.1:0",
            **options,
        ),
    )
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.started.wait(), 10)
        yield agent, task
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)


def dra_settings(short_dir: Path, kubeconfig: Path, node: str, **options: Any) -> dict[str, Any]:
    """The flat settings of a DRA agent on ``short_dir``'s private folders (specs, device
    plugins, plugin registry, kubelet plugins, state) that talks to the API server of
    ``kubeconfig`` as node ``node``; ``options`` added or replaced. Flat, so a test can pass
    them to :class:`~cdi_gen.config.settings.Settings` or as ``CDI_GEN_*`` variables."""
    return {
        "spec_dir": short_dir / "cdi",
        "device_plugin_dir": short_dir / "dp",
        "plugins_registry_dir": short_dir / "reg",
        "kubelet_plugins_dir": short_dir / "plugins",
        "state_dir": short_dir / "state",
        "kubeconfig": kubeconfig,
        "node_name": node,
        "metrics_address": "127.0.0.1:0",
        "retry_max_seconds": 1.0,
        **options,
    }
