"""The whole node path: kernel hotplug -> ``cdi-gen run`` -> fake kubelet -> containerd 1.7.

Loop devices are created after the agent is up, so it learns of them from real kernel uevents;
it writes the spec into containerd's spec folder and advertises the device over ListAndWatch;
Allocate through the fake kubelet returns CDI names, which go unchanged into CreateContainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from loopdev import LoopDevice, LoopDevices

from tests.waiting import until

from .agent import RESOURCE, RunningAgent, run_agent
from .conftest import Pods, SpecFolders
from .image import IMAGE_NAME
from .test_cdi_injection import LIST_SCRIPT, nodes

pytestmark = pytest.mark.e2e


@pytest.fixture
def agent_work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="cgag"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def agent_for(
    work: Path, spec_folders: SpecFolders, devices: list[LoopDevice], *args: str
) -> AsyncIterator[RunningAgent]:
    """``cdi-gen run`` whose class is exactly these (not yet created) devices."""
    folders = [spec_folders.etc, spec_folders.run]
    async with run_agent(work, folders, [d.name for d in devices], *args) as running:
        yield running


def reserve(loops: LoopDevices, count: int) -> list[LoopDevice]:
    """Distinct free loop numbers, not created yet (the agent must see them arrive)."""
    devices: list[LoopDevice] = []
    while len(devices) < count:
        dev = loops.reserve()
        if dev not in devices:
            devices.append(dev)
    return devices


def qualified(dev: LoopDevice) -> str:
    return f"{RESOURCE}={dev.name}"


async def test_a_hotplugged_device_reaches_a_container(
    agent_work: Path, spec_folders: SpecFolders, pods: Pods, loops: LoopDevices
) -> None:
    [dev] = reserve(loops, 1)
    async with agent_for(agent_work, spec_folders, [dev]) as agent:
        loops.add(dev)  # after the agent is up: it learns of it from the kernel's uevent
        await agent.wait_for_devices(present=[dev.name])

        response = await agent.allocate(dev.name)
        assert [d.name for d in response.cdi_devices] == [qualified(dev)]

        result = await pods.start_allocated("hotplugged", response, LIST_SCRIPT)
    assert result.exit_code == 0, result
    assert nodes(result) == {str(dev.path): ("block special file", *dev.rdev())}
    assert result.env["CDI_GEN_CLASS"] == "loop"
    assert result.env["CDI_GEN_DEVNODE"] == str(dev.path)


async def test_two_allocated_devices_in_one_container(
    agent_work: Path, spec_folders: SpecFolders, pods: Pods, loops: LoopDevices
) -> None:
    a, b = reserve(loops, 2)
    async with agent_for(agent_work, spec_folders, [a, b]) as agent:
        loops.add(a)
        loops.add(b)
        await agent.wait_for_devices(present=[a.name, b.name])

        response = await agent.allocate(a.name, b.name)
        assert sorted(d.name for d in response.cdi_devices) == sorted([qualified(a), qualified(b)])

        result = await pods.start_allocated("two", response, LIST_SCRIPT)
    assert result.exit_code == 0, result
    assert nodes(result) == {
        str(a.path): ("block special file", *a.rdev()),
        str(b.path): ("block special file", *b.rdev()),
    }


async def test_an_unplugged_device_becomes_unresolvable_not_stale(
    agent_work: Path, spec_folders: SpecFolders, pods: Pods, loops: LoopDevices
) -> None:
    [dev] = reserve(loops, 1)
    async with agent_for(agent_work, spec_folders, [dev]) as agent:
        loops.add(dev)
        await agent.wait_for_devices(present=[dev.name])
        response = await agent.allocate(dev.name)  # allocated while it was there

        loops.remove(dev)
        await agent.wait_for_devices(absent=[dev.name])
        # Withdrawn from ListAndWatch first, then from the spec (the agent's ordering rule).
        await wait_until_withdrawn(spec_folders.run, dev)

        # A pod admitted just before the unplug reaches containerd with the old name: the
        # agent withdrew the entry, so containerd refuses it instead of a missing node.
        pod = await asyncio.to_thread(pods.new, "unplugged")
        with pytest.raises(grpc.RpcError) as err:
            await asyncio.to_thread(
                pods.cri.create_container,
                pod,
                "consumer",
                IMAGE_NAME,
                ["/bin/true"],
                cdi_devices=[d.name for d in response.cdi_devices],
            )
    assert "unresolvable CDI devices" in str(err.value.details())
    assert qualified(dev) in str(err.value.details())


async def test_annotation_mode_reaches_a_container_through_annotations_alone(
    agent_work: Path, spec_folders: SpecFolders, pods: Pods, loops: LoopDevices
) -> None:
    [dev] = reserve(loops, 1)
    async with agent_for(agent_work, spec_folders, [dev], "--cdi-annotations") as agent:
        loops.add(dev)
        await agent.wait_for_devices(present=[dev.name])
        response = await agent.allocate(dev.name)
        assert any(k.startswith("cdi.k8s.io/") for k in response.annotations), response

        # What a runtime that reads only annotations (containerd 1.7.0/1.7.1) gets.
        result = await pods.start_allocated("annotated", response, LIST_SCRIPT, use_field=False)
    assert result.exit_code == 0, result
    assert nodes(result) == {str(dev.path): ("block special file", *dev.rdev())}


async def test_specs_outlive_the_agent_so_pods_still_start(
    agent_work: Path, spec_folders: SpecFolders, pods: Pods, loops: LoopDevices
) -> None:
    # A DaemonSet rolling update (maxSurge 0) stops the agent while pods keep (re)starting:
    # without --cleanup-on-exit the spec stays and containerd still resolves the name.
    [dev] = reserve(loops, 1)
    async with agent_for(agent_work, spec_folders, [dev]) as agent:
        loops.add(dev)
        await agent.wait_for_devices(present=[dev.name])
        response = await agent.allocate(dev.name)
    assert agent.process.returncode == 0, agent.log()

    result = await pods.start_allocated("after-agent", response, LIST_SCRIPT)
    assert result.exit_code == 0, result
    assert nodes(result) == {str(dev.path): ("block special file", *dev.rdev())}


def named_in_specs(spec_dir: Path, name: str) -> bool:
    return any(
        f'"{name}"' in p.read_text() or f"name: {name}" in p.read_text()
        for p in spec_dir.iterdir()
        if p.suffix in (".json", ".yaml")
    )


async def wait_until_withdrawn(spec_dir: Path, dev: LoopDevice, within: float = 5.0) -> None:
    await until(
        lambda: not named_in_specs(spec_dir, dev.name), f"{dev.name} out of every spec", within
    )
