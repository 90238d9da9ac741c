"""The device plugin serves from gRPC's own threads: Allocate does not need the event loop,
and ListAndWatch streams are capped so that they cannot take every thread."""

from __future__ import annotations

import concurrent.futures
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from test_plugin import Rig, make_rig

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from cdi_gen.deviceplugin.server import MAX_STREAMS
from tests.waiting import until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def rig(short_dir: Path) -> AsyncIterator[Rig]:
    async for r in make_rig(short_dir):
        yield r


def _allocate_blocking(socket: Path) -> api_pb2.AllocateResponse:
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["loop200"])]
        )
        response: api_pb2.AllocateResponse = api_pb2_grpc.DevicePluginStub(channel).Allocate(
            request, timeout=5
        )
        return response


async def test_allocate_is_answered_while_the_event_loop_is_blocked(rig: Rig) -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # .result() without await: the loop stays blocked until the answer is in.
        response = pool.submit(_allocate_blocking, rig.plugin.socket_path).result(timeout=10)
    assert response.container_responses[0].cdi_devices[0].name == "example.com/loop=loop200"


async def test_list_and_watch_streams_are_capped(rig: Rig) -> None:
    await rig.connection.next_devices()  # the kubelet's stream
    streams = [rig.stub.ListAndWatch(api_pb2.Empty()) for _ in range(MAX_STREAMS - 1)]
    for stream in streams:
        assert len((await stream.read()).devices) > 0
    extra = rig.stub.ListAndWatch(api_pb2.Empty())
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await extra.read()
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = caught.value.details() or ""
    assert f"resource {rig.plugin.resource_name}: already {MAX_STREAMS} streams open" in details
    # Allocate still finds a thread, and a stream that ends frees its place.
    assert (await rig.allocate("loop200")).container_responses
    streams[0].cancel()

    async def a_new_stream() -> (
        grpc.aio.UnaryStreamCall[api_pb2.Empty, api_pb2.ListAndWatchResponse] | None
    ):
        stream = rig.stub.ListAndWatch(api_pb2.Empty())
        try:
            assert len((await stream.read()).devices) > 0
        except grpc.aio.AioRpcError:
            return None  # the cancelled stream still holds its place
        return stream

    again = await until(a_new_stream, "a cancelled stream's place freed", every=0.05)
    for stream in [*streams[1:], again]:
        stream.cancel()
