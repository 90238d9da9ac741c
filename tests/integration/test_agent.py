"""The node agent end to end on this machine: real loop devices and kernel uevents, real spec
files, real gRPC to a fake kubelet; the ordering invariant checked at every message."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import orjson
import pytest

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2
from cdi_gen.agent.agent import Agent
from cdi_gen.config.settings import Settings
from tests.agentrun import running_agent
from tests.fakes.kubelet import ConnectedPlugin, FakeKubelet
from tests.loopdev import LoopDevices
from tests.waiting import until

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(60)]

LOW, HIGH = 300, 399  # kept apart from the 200-299 range other tests use


def _config() -> dict[str, object]:
    return {
        "vendor": "example.com",
        "classes": [
            {
                "name": "loop",
                "match": {"subsystem": "block", "kernel": "loop3[0-9][0-9]"},
                "deviceName": "{kernel}",
                "containerEdits": {"env": ["LOOP_DEVICE={name}"]},
            }
        ],
    }


def _spec_names(spec_dir: Path) -> set[str]:
    try:
        doc = orjson.loads((spec_dir / "example.com-loop.json").read_bytes())
    except FileNotFoundError:
        return set()
    return {d["name"] for d in doc["devices"]}


@pytest.fixture
def loops() -> LoopDevices:
    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        pytest.fail("these tests need root and /dev/loop-control (CI runs as root)")
    devices = LoopDevices(low=LOW, high=HIGH)
    yield devices
    devices.cleanup()


async def _next_checked(plugin: ConnectedPlugin, spec_dir: Path) -> set[str]:
    """Next ListAndWatch list; every advertised healthy ID must already be in the spec."""
    devices = await plugin.next_devices(within=5)
    healthy = {i for i, d in devices.items() if d.health == "Healthy"}
    on_disk = _spec_names(spec_dir)
    assert healthy <= on_disk, f"advertised before written: {healthy - on_disk}"
    return set(devices)


async def _until_advertised(
    plugin: ConnectedPlugin, spec_dir: Path, want: set[str], mine: set[str]
) -> None:
    for _ in range(50):
        if (await _next_checked(plugin, spec_dir)) & mine == want:
            return
    raise AssertionError(f"never advertised {want}")


async def test_agent_follows_hotplug_in_order(short_dir: Path, loops: LoopDevices) -> None:
    first = loops.add()
    spec_dir = short_dir / "cdi"
    async with (
        FakeKubelet(short_dir / "dp") as kubelet,
        running_agent(short_dir, _config()) as (agent, _),
    ):
        plugin = await kubelet.next_registration(within=10)
        assert plugin.request.resource_name == "example.com/loop"
        assert plugin.request.endpoint == "example.com-loop.sock"
        ids = await _next_checked(plugin, spec_dir)
        assert first.name in ids

        second = loops.add()
        mine = {first.name, second.name}
        await _until_advertised(plugin, spec_dir, mine, mine)
        assert second.name in _spec_names(spec_dir)

        response = await plugin.stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=[second.name, first.name])
                ]
            )
        )
        (container,) = response.container_responses
        assert [d.name for d in container.cdi_devices] == [
            f"example.com/loop={second.name}",
            f"example.com/loop={first.name}",
        ]
        assert not container.envs and not container.devices and not container.mounts

        # Removal: withdrawn from ListAndWatch first, then from the spec.
        loops.remove(second)
        await _until_advertised(plugin, spec_dir, {first.name}, mine)
        await until(lambda: second.name not in _spec_names(spec_dir), "the device out of the spec")

        # A device that comes back goes through the same steps.
        loops.add(second)
        await _until_advertised(plugin, spec_dir, mine, mine)

        # Kubelet restart: the plugin re-creates its socket and registers again.
        await kubelet.restart()
        again = await kubelet.next_registration(within=5)
        assert again.request.resource_name == "example.com/loop"
        assert {first.name, second.name} <= await _next_checked(again, spec_dir)

        host, port = agent._http.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        body = (await reader.read()).decode()
        writer.close()
        assert 'cdi_gen_devices{health="Healthy",resource="example.com/loop"}' in body
        assert "cdi_gen_allocations_total" in body
        sock = short_dir / "dp" / "example.com-loop.sock"
        assert sock.exists()
    # Shutdown: socket removed, spec kept for running pods.
    assert not sock.exists()
    assert first.name in _spec_names(spec_dir)


async def test_cleanup_on_exit_and_stale_specs(short_dir: Path, loops: LoopDevices) -> None:
    from cdi_gen.cdi import writer
    from cdi_gen.cdi.builder import assemble, build_entry
    from cdi_gen.cdi.codec import dump_document

    spec_dir = short_dir / "cdi"
    stale = dump_document(assemble("example.com/gone", [build_entry("x0", {"env": ["A=1"]})]))
    writer.write_bytes(spec_dir, "example.com", "gone", stale)
    (spec_dir / "foreign.json").write_text("{}")
    first = loops.add()
    async with running_agent(short_dir, _config(), cleanup_on_exit=True, no_kubelet=True):
        assert first.name in _spec_names(spec_dir)
        assert not (spec_dir / "example.com-gone.json").exists()
    assert not (spec_dir / "example.com-loop.json").exists()
    assert (spec_dir / "foreign.json").read_text() == "{}"


async def test_the_specs_of_other_instances_survive_the_start(short_dir: Path) -> None:
    # Two DaemonSets (two teams, two vendors, a chart installed twice) share /var/run/cdi: at
    # start each removes its own stale specs, never the other's.
    from cdi_gen.cdi import writer
    from cdi_gen.cdi.builder import assemble, build_entry
    from cdi_gen.cdi.codec import dump_document

    spec_dir = short_dir / "cdi"
    entry = [build_entry("x0", {"env": ["A=1"]})]
    # `cdi-gen write --config b.yaml`: vendor b.example.com, its default instance.
    nul = dump_document(assemble("b.example.com/nul", entry))
    writer.write_bytes(spec_dir, "b.example.com", "nul", nul)
    # Another agent of our vendor, named team-b.
    team_b = dump_document(assemble("example.com/fpga", entry))
    writer.write_bytes(spec_dir, "example.com", "fpga", team_b, instance="team-b")
    # Ours, from a run whose config still had the class.
    gone = dump_document(assemble("example.com/gone", entry))
    writer.write_bytes(spec_dir, "example.com", "gone", gone)
    async with running_agent(short_dir, _config(), no_kubelet=True):
        present = sorted(p.name for p in spec_dir.glob("*.json"))
    assert present == ["b.example.com-nul.json", "example.com-fpga.json"]


async def test_an_instance_removes_only_its_own_stale_specs(short_dir: Path) -> None:
    from cdi_gen.cdi import writer
    from cdi_gen.cdi.builder import assemble, build_entry
    from cdi_gen.cdi.codec import dump_document

    spec_dir = short_dir / "cdi"
    data = dump_document(assemble("example.com/gone", [build_entry("x0", {"env": ["A=1"]})]))
    writer.write_bytes(spec_dir, "example.com", "gone", data, instance="team-a")
    async with running_agent(short_dir, _config(), no_kubelet=True, instance="team-b"):
        assert (spec_dir / "example.com-gone.json").exists()
    async with running_agent(short_dir, _config(), no_kubelet=True, instance="team-a"):
        assert not (spec_dir / "example.com-gone.json").exists()


async def test_unwritable_spec_folder_is_retried_not_advertised(
    short_dir: Path, loops: LoopDevices
) -> None:
    spec_dir = short_dir / "cdi"
    spec_dir.write_text("not a folder")  # every write fails until this is fixed
    first = loops.add()
    async with (
        FakeKubelet(short_dir / "dp") as kubelet,
        running_agent(short_dir, _config()) as (agent, _),
    ):
        plugin = await kubelet.next_registration(within=10)
        assert first.name not in await plugin.next_devices(within=5)
        assert agent.ready()[0] is False
        spec_dir.unlink()
        await _until_advertised(plugin, spec_dir, {first.name}, {first.name})
        assert first.name in _spec_names(spec_dir)


async def test_shared_device_slots_follow_the_device(short_dir: Path, loops: LoopDevices) -> None:
    """replicas: 3 → three IDs per loop device; removal withdraws all of them before the
    spec entries go; preferred allocation spreads or packs by the class policy."""
    from cdi_gen.config.loader import parse_config as parse

    config = _config()
    config["classes"][0]["sharing"] = {"replicas": 3, "policy": "spread"}  # type: ignore[index]
    first, second = loops.add(), loops.add()
    slots = {f"{d.name}-{i}" for d in (first, second) for i in range(3)}
    spec_dir = short_dir / "cdi"
    agent = Agent(
        parse(config, "test.yaml"),
        Settings(
            spec_dir=spec_dir,
            device_plugin_dir=short_dir / "dp",
            udev_source="kernel",
            metrics_address=None,
        ),
    )
    async with FakeKubelet(short_dir / "dp") as kubelet:
        task = asyncio.create_task(agent.run())
        try:
            plugin = await kubelet.next_registration(within=10)
            ids = await _next_checked(plugin, spec_dir)
            assert slots <= ids
            assert slots <= _spec_names(spec_dir)

            # Two slots of one device in one container: valid, distinct CDI names.
            response = await plugin.stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[
                        api_pb2.ContainerAllocateRequest(
                            devices_ids=[f"{first.name}-0", f"{first.name}-2"]
                        )
                    ]
                )
            )
            names = [d.name for d in response.container_responses[0].cdi_devices]
            assert names == [f"example.com/loop={first.name}-0", f"example.com/loop={first.name}-2"]

            # spread: three slots land on different physical devices where possible.
            preferred = await plugin.stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=sorted(slots), allocation_size=2
                        )
                    ]
                )
            )
            picked = list(preferred.container_responses[0].deviceIDs)
            assert {p.rsplit("-", 1)[0] for p in picked} == {first.name, second.name}

            loops.remove(second)
            gone = {f"{second.name}-{i}" for i in range(3)}
            for _ in range(50):
                ids = await _next_checked(plugin, spec_dir)
                if not ids & gone:
                    break
            assert not ids & gone
            assert {f"{first.name}-{i}" for i in range(3)} <= ids
            await until(lambda: not _spec_names(spec_dir) & gone, "the shares out of the spec")
        finally:
            agent.stop()
            await asyncio.wait_for(task, 10)
