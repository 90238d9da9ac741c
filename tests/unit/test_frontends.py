"""Each class is served to the kubelet through one Frontend, built in its own module: a
device plugin of its own, or the node's DRA driver shared by every DRA class. The runners
and frontends are given what they need and never reach back into the agent (the layers of
`.importlinter` forbid the import; this shows no object of theirs leads to the agent)."""

from __future__ import annotations

import asyncio
import gc
import types
from pathlib import Path
from typing import TYPE_CHECKING, cast

from cdi_gen.agent.agent import Agent
from cdi_gen.config.loader import parse_config
from cdi_gen.config.settings import load_settings
from cdi_gen.deviceplugin.frontend import DevicePluginFrontend
from cdi_gen.dra.node import DraDriver

if TYPE_CHECKING:
    from cdi_gen.apiserver.client import ApiClient

CONFIG = parse_config(
    {
        "vendor": "example.com",
        "classes": [
            {"name": "plain", "match": {"subsystem": "block", "kernel": "loop[0-1]"}},
            {"name": "fpga", "match": {"subsystem": "block", "kernel": "loop[2-3]"}, "api": "dra"},
            {"name": "gpu", "match": {"subsystem": "block", "kernel": "loop[4-5]"}, "api": "dra"},
        ],
    },
    "test.yaml",
)


def _agent() -> Agent:
    return Agent(CONFIG, load_settings({"node_name": "node-1"}))


def _reaches(start: object, target: object) -> bool:
    """Whether ``target`` is reachable from ``start`` through object references, not
    counting functions (their globals lead to every module) or modules and classes."""
    seen = {id(start)}
    todo = [start]
    while todo:
        for ref in gc.get_referents(todo.pop()):
            if ref is target:
                return True
            if id(ref) in seen or isinstance(
                ref, types.ModuleType | type | types.FunctionType | types.CodeType
            ):
                continue
            seen.add(id(ref))
            todo.append(ref)
    return False


def test_each_class_has_the_frontend_of_its_api() -> None:
    agent = _agent()
    plain, fpga, gpu = (agent.runners[n].frontend for n in ("plain", "fpga", "gpu"))
    assert isinstance(plain, DevicePluginFrontend)
    assert plain.board is agent.runners["plain"].board
    assert isinstance(fpga, DraDriver) and isinstance(gpu, DraDriver)
    assert fpga is gpu
    assert fpga is agent.dra


def test_no_runner_or_frontend_leads_back_to_the_agent() -> None:
    agent = _agent()
    for name, runner in agent.runners.items():
        assert not _reaches(runner, agent), f"the runner of {name} reaches the agent"


def test_host_mode_has_no_frontend() -> None:
    agent = Agent(CONFIG, load_settings({"node_name": "node-1", "no_kubelet": True}))
    assert all(r.frontend is None for r in agent.runners.values())
    assert agent.dra is None


def test_readiness_names_the_shared_driver_once() -> None:
    agent = _agent()
    agent.started.set()
    for runner in agent.runners.values():
        runner.spec_ok = True
    ready, why = agent.ready()
    assert not ready
    assert why.count("DRA driver example.com") == 1, why


def test_a_dra_class_has_no_board_and_publishes_into_the_driver_pool() -> None:
    """The board is the device plugin's: a DRA class publishes once, into the pool."""
    agent = _agent()
    for name in ("fpga", "gpu"):
        runner = agent.runners[name]
        assert runner.board is None
        assert runner.sink is agent.dra
    assert agent.runners["plain"].sink is None
    assert agent.runners["plain"].board is not None


def test_registration_is_bounded_by_the_retry_setting(short_dir: Path) -> None:
    """CDI_GEN_RETRY_MAX_SECONDS bounds the kubelet registration's retries too (they were
    held at a hard-coded 2 s), for a device plugin and the DRA driver alike."""
    settings = load_settings(
        {
            "node_name": "node-1",
            "retry_max_seconds": 7,
            "device_plugin_dir": short_dir / "dp",
            "kubelet_plugins_dir": short_dir / "plugins",
            "plugins_registry_dir": short_dir / "registry",
            "state_dir": short_dir / "state",
        }
    )
    agent = Agent(CONFIG, settings)
    plain = agent.runners["plain"].frontend
    assert isinstance(plain, DevicePluginFrontend)
    assert plain._make_plugin().retrying.backoff.maximum == 7
    assert agent.dra is not None
    dra = agent.dra

    async def make() -> float:
        return dra._make_plugin(cast("ApiClient", object())).retrying.backoff.maximum

    assert asyncio.run(make()) == 7
