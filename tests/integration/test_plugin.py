"""The device plugin against a fake kubelet, over real gRPC on real unix sockets.

Spec folders are real folders read by the real SpecCache; the board is the real DeviceBoard.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from fakes.kubelet import ConnectedPlugin, FakeKubelet

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from cdi_gen.cdi.registry import SpecCache
from cdi_gen.deviceplugin.board import DeviceBoard
from cdi_gen.deviceplugin.server import DevicePlugin
from cdi_gen.model import AdvertisedDevice
from tests.waiting import until

VENDOR, CLASS = "example.com", "loop"
KIND = f"{VENDOR}/{CLASS}"


def write_spec(folder: Path, names: Iterable[str], filename: str = "example.com-loop.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "cdiVersion": "0.3.0",
        "kind": KIND,
        "devices": [
            {"name": n, "containerEdits": {"deviceNodes": [{"path": f"/dev/{n}"}]}} for n in names
        ],
    }
    path = folder / filename
    path.write_text(json.dumps(doc))
    return path


def loops(*numbers: int, healthy: bool = True, numa: int | None = None) -> list[AdvertisedDevice]:
    return [AdvertisedDevice(f"loop{n}", healthy=healthy, numa_node=numa) for n in numbers]


@dataclass
class Rig:
    folder: Path
    spec_dir: Path
    board: DeviceBoard
    plugin: DevicePlugin
    kubelet: FakeKubelet
    connection: ConnectedPlugin

    @property
    def stub(self) -> api_pb2_grpc.DevicePluginAsyncStub:
        return self.connection.stub

    async def allocate(self, *ids: str) -> api_pb2.AllocateResponse:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        )
        return await self.stub.Allocate(request)


DEVICES = [
    *loops(200, 201, numa=0),
    *loops(202, 203, numa=1),
    AdvertisedDevice("loop204", healthy=False, numa_node=1),
    AdvertisedDevice("loop205"),
]


async def make_rig(short_dir: Path, **plugin_args: object) -> AsyncIterator[Rig]:
    folder = short_dir / "dp"
    spec_dir = short_dir / "cdi"
    write_spec(spec_dir, [d.id for d in DEVICES])
    board = DeviceBoard(DEVICES)
    kubelet = FakeKubelet(folder)
    await kubelet.start()
    plugin = DevicePlugin(
        VENDOR,
        CLASS,
        board,
        SpecCache([spec_dir]),
        plugin_dir=folder,
        watch_interval=0.05,
        **plugin_args,  # type: ignore[arg-type]
    )
    await plugin.start()
    try:
        connection = await kubelet.next_registration()
        # The fake records the request before the plugin sees Register return.
        await asyncio.wait_for(plugin.wait_registered(), 5)
        yield Rig(folder, spec_dir, board, plugin, kubelet, connection)
    finally:
        await plugin.stop()
        await kubelet.stop()


@pytest.fixture
async def rig(short_dir: Path) -> AsyncIterator[Rig]:
    async for r in make_rig(short_dir):
        yield r


async def test_plugin_registers_with_the_kubelets_fields(rig: Rig) -> None:
    request = rig.connection.request
    assert request.version == "v1beta1"
    assert request.endpoint == "example.com-loop.sock"
    assert request.resource_name == KIND
    expected = api_pb2.DevicePluginOptions(
        pre_start_required=False, get_preferred_allocation_available=True
    )
    assert request.options == expected
    assert rig.connection.options == expected
    assert (rig.folder / request.endpoint).exists()
    assert rig.plugin.registrations == 1


async def test_plugin_first_list_has_every_device_with_health_and_numa(rig: Rig) -> None:
    devices = await rig.connection.next_devices()
    assert list(devices) == [d.id for d in DEVICES]
    assert devices["loop200"] == api_pb2.Device(
        ID="loop200",
        health="Healthy",
        topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=0)]),
    )
    assert devices["loop204"].health == "Unhealthy"
    assert devices["loop204"].topology.nodes[0].ID == 1
    assert not devices["loop205"].HasField("topology")


async def test_plugin_change_reaches_every_open_stream(rig: Rig) -> None:
    first = rig.connection
    await first.next_devices()
    second: asyncio.Queue[api_pb2.ListAndWatchResponse] = asyncio.Queue()

    async def pipe() -> None:
        async for message in rig.stub.ListAndWatch(api_pb2.Empty()):
            await second.put(message)

    task = asyncio.create_task(pipe())
    try:
        assert len((await asyncio.wait_for(second.get(), 5)).devices) == len(DEVICES)
        rig.board.publish([*DEVICES[:2], AdvertisedDevice("loop202", healthy=False)])
        for message in (await first.updates.get(), await asyncio.wait_for(second.get(), 5)):
            assert [(d.ID, d.health) for d in message.devices] == [
                ("loop200", "Healthy"),
                ("loop201", "Healthy"),
                ("loop202", "Unhealthy"),
            ]
        # Nothing else arrives without a change: the next message is the next change's.
        rig.board.publish(DEVICES[:2])
        marker = await asyncio.wait_for(second.get(), 5)
        assert [d.ID for d in marker.devices] == ["loop200", "loop201"]
    finally:
        task.cancel()


async def test_plugin_allocate_answers_only_cdi_devices_in_request_order(rig: Rig) -> None:
    response = await rig.allocate("loop203", "loop200")
    expected = api_pb2.AllocateResponse(
        container_responses=[
            api_pb2.ContainerAllocateResponse(
                cdi_devices=[
                    api_pb2.CDIDevice(name="example.com/loop=loop203"),
                    api_pb2.CDIDevice(name="example.com/loop=loop200"),
                ]
            )
        ]
    )
    assert response == expected


@pytest.mark.parametrize(
    ("ids", "code", "message"),
    [
        (
            ("loop200", "loop9"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown device 'loop9' for resource example.com/loop",
        ),
        (
            ("loop204",),
            grpc.StatusCode.FAILED_PRECONDITION,
            "device 'loop204' of resource example.com/loop is unhealthy",
        ),
        (
            ("loop201", "loop202", "loop201"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "device 'loop201' requested more than once for resource example.com/loop",
        ),
    ],
    ids=["unknown", "unhealthy", "duplicate"],
)
async def test_plugin_allocate_refuses_bad_ids(
    rig: Rig, ids: tuple[str, ...], code: grpc.StatusCode, message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rig.allocate(*ids)
    assert caught.value.code() == code
    assert caught.value.details() == message


async def test_plugin_allocate_refuses_a_device_without_spec(rig: Rig) -> None:
    write_spec(rig.spec_dir, ["loop200"])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rig.allocate("loop201")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = caught.value.details() or ""
    assert details.startswith("CDI devices of resource example.com/loop do not resolve: ")
    assert "example.com/loop=loop201" in details
    assert (await rig.allocate("loop200")).container_responses[0].cdi_devices[0].name == (
        "example.com/loop=loop200"
    )


async def test_plugin_allocate_refuses_a_device_in_conflict(rig: Rig) -> None:
    write_spec(rig.spec_dir, ["loop202"], filename="other.json")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rig.allocate("loop202")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = caught.value.details() or ""
    assert "example.com/loop=loop202" in details
    assert "more than one spec file" in details
    assert "other.json" in details
    assert "example.com-loop.json" in details


async def test_plugin_preferred_allocation_keeps_must_include_and_packs_numa(rig: Rig) -> None:
    rig.board.publish([*loops(200, 201, numa=0), *loops(202, 203, 206, numa=1), *loops(207)])
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=["loop207", "loop206", "loop203", "loop202", "loop201"],
                must_include_deviceIDs=["loop201"],
                allocation_size=3,
            ),
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=["loop207", "loop206", "loop203", "loop202", "loop201"],
                allocation_size=3,
            ),
        ]
    )
    response = await rig.stub.GetPreferredAllocation(request)
    assert [list(r.deviceIDs) for r in response.container_responses] == [
        # loop201 sits alone on node 0; then node 1 is the only one holding the other two.
        ["loop201", "loop202", "loop203"],
        ["loop202", "loop203", "loop206"],
    ]


async def test_plugin_prestart_answers_empty(rig: Rig) -> None:
    response = await rig.stub.PreStartContainer(
        api_pb2.PreStartContainerRequest(devices_ids=["loop200"])
    )
    assert response == api_pb2.PreStartContainerResponse()


async def test_plugin_cdi_annotations_follow_the_runtime_rules(short_dir: Path) -> None:
    async for rig in make_rig(short_dir, cdi_annotations=True):
        response = await rig.allocate("loop200", "loop201")
        answer = response.container_responses[0]
        assert [d.name for d in answer.cdi_devices] == [
            "example.com/loop=loop200",
            "example.com/loop=loop201",
        ]
        [(key, value)] = answer.annotations.items()
        assert key.startswith("cdi.k8s.io/example.com.loop_")
        assert len(key.removeprefix("cdi.k8s.io/")) <= 63
        assert value == "example.com/loop=loop200,example.com/loop=loop201"
        # Same answer for the same request: Allocate stays idempotent.
        assert (await rig.allocate("loop200", "loop201")) == response


async def test_plugin_reregisters_after_a_kubelet_restart(rig: Rig) -> None:
    old = rig.connection
    await rig.kubelet.restart()
    assert not (rig.folder / "example.com-loop.sock").exists()
    again = await rig.kubelet.next_registration(within=5)
    assert again.request == old.request
    assert rig.kubelet.requests == [old.request, again.request]
    assert len(await again.next_devices()) == len(DEVICES)
    response = await again.stub.Allocate(
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["loop200"])]
        )
    )
    assert response.container_responses[0].cdi_devices[0].name == "example.com/loop=loop200"
    await asyncio.wait_for(rig.plugin.wait_registered(), 5)
    assert rig.plugin.registrations == 2


async def test_plugin_reregisters_when_only_its_socket_is_removed(rig: Rig) -> None:
    os.unlink(rig.folder / "example.com-loop.sock")
    again = await rig.kubelet.next_registration(within=5)
    assert len(await again.next_devices()) == len(DEVICES)
    assert (rig.folder / "example.com-loop.sock").exists()


async def test_plugin_serves_anew_when_only_kubelet_sock_is_recreated(rig: Rig) -> None:
    socket = rig.folder / "example.com-loop.sock"
    before = os.stat(socket)
    await rig.kubelet.stop()
    assert socket.exists()
    await rig.kubelet.start()
    again = await rig.kubelet.next_registration(within=5)
    assert len(await again.next_devices()) == len(DEVICES)
    after = os.stat(socket)
    assert (after.st_ino, after.st_ctime_ns) != (before.st_ino, before.st_ctime_ns)


class BrokenCache:
    def unresolved(self, qualified_names: Iterable[str]) -> list[str]:
        raise OSError("spec folder unreadable")


async def test_plugin_reports_unexpected_failures_as_internal(short_dir: Path) -> None:
    outcomes: list[tuple[str, str]] = []

    def on_allocate(outcome: str, reason: str) -> None:
        outcomes.append((outcome, reason))
        raise RuntimeError("a broken metrics hook must not break Allocate")

    async for rig in make_rig(short_dir, on_allocate=on_allocate):
        await rig.allocate("loop200")
        with pytest.raises(grpc.aio.AioRpcError):
            await rig.allocate("loop9")
        rig.plugin.spec_cache = BrokenCache()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await rig.allocate("loop200")
        assert caught.value.code() == grpc.StatusCode.INTERNAL
        assert caught.value.details() == (
            "allocate for resource example.com/loop failed: spec folder unreadable"
        )
        assert outcomes == [("ok", ""), ("error", "unknown"), ("error", "internal")]


async def test_plugin_waits_for_an_absent_kubelet(short_dir: Path) -> None:
    folder = short_dir / "dp"
    folder.mkdir()
    registrations: list[tuple[bool, str]] = []
    plugin = DevicePlugin(
        VENDOR,
        CLASS,
        DeviceBoard(DEVICES),
        SpecCache([short_dir / "cdi"]),
        plugin_dir=folder,
        watch_interval=0.05,
        on_register=lambda ok, error: registrations.append((ok, error)),
    )
    async with plugin:
        # A stale kubelet.sock with nobody behind it: registration fails and is retried.
        (folder / "kubelet.sock").touch()
        await until(lambda: len(registrations) >= 2, "a failed registration retried")
        assert not any(ok for ok, _ in registrations)
        async with FakeKubelet(folder) as kubelet:
            connection = await kubelet.next_registration(within=3)
            assert connection.request.resource_name == KIND
            await asyncio.wait_for(plugin.wait_registered(), 5)
        assert registrations[-1] == (True, "")


async def test_plugin_allocate_stays_right_while_devices_change(rig: Rig) -> None:
    stable = loops(200, 201, 202, 203)
    flapping = [f"loop{n}" for n in range(210, 214)]
    write_spec(rig.spec_dir, [d.id for d in stable] + flapping)
    rig.board.publish(stable)
    stop = asyncio.Event()
    rng = random.Random(4)

    async def churn() -> None:
        while not stop.is_set():
            present = [
                AdvertisedDevice(i, healthy=rng.random() < 0.5)
                for i in flapping
                if rng.random() < 0.7
            ]
            rig.board.publish([*stable, *present])
            await asyncio.sleep(0)

    async def call(n: int) -> None:
        ids = (
            [stable[n % 4].id, stable[(n + 1) % 4].id]
            if n % 2
            else [flapping[n % 4], stable[n % 4].id]
        )
        try:
            response = await rig.allocate(*ids)
        except grpc.aio.AioRpcError as exc:
            assert n % 2 == 0, f"stable request {ids} refused: {exc.details()}"
            assert (exc.code(), exc.details()) in {
                (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"unknown device {ids[0]!r} for resource {KIND}",
                ),
                (
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"device {ids[0]!r} of resource {KIND} is unhealthy",
                ),
            }
            return
        [answer] = response.container_responses
        assert [d.name for d in answer.cdi_devices] == [f"{KIND}={i}" for i in ids]
        assert not answer.envs
        assert not answer.mounts
        assert not answer.devices
        assert not answer.annotations

    churner = asyncio.create_task(churn())
    try:
        await asyncio.gather(*(call(n) for n in range(200)))
    finally:
        stop.set()
        await churner
    assert rig.board.version > 1


async def test_plugin_stop_ends_streams_and_removes_the_socket(rig: Rig) -> None:
    socket = rig.folder / "example.com-loop.sock"
    assert socket.exists()
    await rig.connection.next_devices()
    # With a minute of grace, a stop that returns at once shows the stream ended itself:
    # grpc cancels the calls still open only when the grace runs out.
    await asyncio.wait_for(rig.plugin.stop(grace=60), 10)
    assert not socket.exists()
    await asyncio.wait_for(rig.connection.stream_ended.wait(), 5)
    # grpc closes the connection as soon as the last call is done. A client writing a frame
    # at that moment (a ping, a window update) gets a broken pipe and reports UNAVAILABLE
    # before it reads the OK it was sent; any other error is ours.
    error = rig.connection.stream_error
    assert error is None or error.code() == grpc.StatusCode.UNAVAILABLE, error
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rig.allocate("loop200")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_plugin_stream_ends_when_the_board_closes(rig: Rig) -> None:
    await rig.connection.next_devices()
    rig.board.close()
    await asyncio.wait_for(rig.connection.stream_ended.wait(), 5)
    assert rig.connection.stream_error is None


async def test_plugin_refuses_to_replace_a_foreign_file(short_dir: Path) -> None:
    from cdi_gen.errors import RegistrationError

    folder = short_dir / "dp"
    folder.mkdir()
    (folder / "example.com-loop.sock").write_text("not ours")
    plugin = DevicePlugin(
        VENDOR, CLASS, DeviceBoard(), SpecCache([short_dir / "cdi"]), plugin_dir=folder
    )
    with pytest.raises(RegistrationError, match="is not a socket"):
        await plugin.start()
    assert (folder / "example.com-loop.sock").read_text() == "not ours"
