"""Classes cannot stall each other: each class applies its changes on a task of its own.

The real :class:`~cdi_gen.agent.agent.Agent` with a DRA class and a device-plugin class on recorded
devices, against the stand-in API server. A DRA device's removal waits (up to 5 s) for the API
server to take the device out of the ResourceSlice before its spec entry goes; with the API
server hanging, a device-plugin class's hotplug must still be applied at once, not after that
wait.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import orjson
import pytest

from cdi_gen.agent.agent import Agent
from cdi_gen.config.loader import parse_config
from cdi_gen.config.settings import Settings
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.source import PipeSource
from tests.waiting import until

pytestmark = pytest.mark.timeout(60)

NODE = "node-1"
CONFIG = {
    "vendor": "example.com",
    "classes": [
        {"name": "dra", "match": {"subsystem": "block", "kernel": "loop[0-1]"}, "api": "dra"},
        {"name": "dp", "match": {"subsystem": "block", "kernel": "loop[2-3]"}},
    ],
}


def _spec_devices(spec_dir: Path, cls: str) -> set[str]:
    try:
        doc = orjson.loads((spec_dir / f"example.com-{cls}.json").read_bytes())
    except FileNotFoundError:
        return set()
    return {d["name"] for d in doc["devices"]}


async def test_a_hanging_api_server_does_not_delay_another_classes_hotplug(
    short_dir: Path,
) -> None:
    source = PipeSource.from_data("export-db-vm.txt", only={"loop0", "loop1", "loop2", "loop3"})
    by_name = {r.sys_name: r for r in source.initial}
    spec_dir = short_dir / "cdi"
    async with FakeApiServer() as api:
        api.nodes[NODE] = str(uuid.uuid4())
        settings = Settings(
            spec_dir=spec_dir,
            device_plugin_dir=short_dir / "dp",
            plugins_registry_dir=short_dir / "reg",
            kubelet_plugins_dir=short_dir / "plugins",
            state_dir=short_dir / "state",
            kubeconfig=api.kubeconfig(short_dir),
            node_name=NODE,
            metrics_address=None,
        )
        agent = Agent(parse_config(CONFIG, "test.yaml"), settings, source=source)
        task = asyncio.create_task(agent.run())
        try:
            await asyncio.wait_for(agent.started.wait(), 10)
            offered = lambda: {  # noqa: E731
                d["name"] for s in api.slices.values() for d in s["spec"].get("devices") or []
            }
            await api.until(lambda: offered() == {"dra-loop0", "dra-loop1"})
            assert _spec_devices(spec_dir, "dp") == {"loop2", "loop3"}

            # The API server hangs: the DRA class's withdrawal waits for it.
            api.hold_writes = asyncio.Event()
            writes = len([r for r in api.requests if r[0] != "GET"])
            source.remove(by_name["loop0"])
            await api.until(lambda: len([r for r in api.requests if r[0] != "GET"]) > writes)

            # Meanwhile the device-plugin class's removal is applied in full, while the DRA
            # class still waits with loop0 in its spec.
            source.remove(by_name["loop2"])
            await until(lambda: _spec_devices(spec_dir, "dp") == {"loop3"}, "loop2 removed")
            assert "loop2" not in agent.runners["dp"].board.devices
            assert _spec_devices(spec_dir, "dra") == {"loop0", "loop1"}

            # Once the API server answers, the DRA class finishes its own change.
            api.hold_writes.set()
            await until(lambda: _spec_devices(spec_dir, "dra") == {"loop1"}, "loop0 removed")
            await api.until(lambda: offered() == {"dra-loop1"})
        finally:
            agent.stop()
            if api.hold_writes is not None:
                api.hold_writes.set()
            await asyncio.wait_for(task, 10)
            source.release()
