"""Hostile device IDs against the device plugin, over real gRPC on real unix sockets.

An ID longer than any CDI device name is refused with INVALID_ARGUMENT whatever its size;
what is echoed in the status and the log is truncated, so a 1 MB ID makes neither a 1 MB
status (which gRPC would turn into RESOURCE_EXHAUSTED) nor a 1 MB log line.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from test_plugin import Rig, make_rig

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2
from cdi_gen.names import MAX_SEGMENT_LEN

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def rig(short_dir: Path) -> AsyncIterator[Rig]:
    async for r in make_rig(short_dir):
        yield r


@pytest.mark.parametrize("size", [MAX_SEGMENT_LEN + 1, 16 * 1024, 1024 * 1024])
async def test_overlong_ids_are_refused_and_echoed_truncated(
    rig: Rig, size: int, caplog: pytest.LogCaptureFixture
) -> None:
    long_id = "x" * size
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await rig.allocate("loop200", long_id)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = caught.value.details() or ""
        assert f"longer than {MAX_SEGMENT_LEN}" in details
        assert f"is {size} characters long" in details
        assert len(details) < 400, len(details)

        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=["loop200", long_id], allocation_size=1
                )
            ]
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await rig.stub.GetPreferredAllocation(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(caught.value.details() or "") < 400
    lines = [r.getMessage() for r in caplog.records]
    assert lines, "the refusal is logged"
    assert all(len(line) < 1000 for line in lines), max(map(len, lines))
    # The plugin still serves.
    response = await rig.allocate("loop200")
    assert response.container_responses[0].cdi_devices[0].name == "example.com/loop=loop200"


async def test_an_unknown_id_of_valid_length_is_still_unknown(rig: Rig) -> None:
    unknown = "y" * MAX_SEGMENT_LEN
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rig.allocate(unknown)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == f"unknown device {unknown!r} for resource example.com/loop"
