"""Allocate through a (fake but real-gRPC) kubelet, then containerd 1.7 with what came back.

The device plugin is cdi-gen's own (``cdi_gen.deviceplugin.server.DevicePlugin``) on a real
unix socket, registered with ``tests/fakes/kubelet.py``; whatever its Allocate returns is handed to
CreateContainer without any change, as the kubelet does: ``cdi_devices`` names into
``CDI_devices``, response annotations into the container's annotations.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from fakes.kubelet import ConnectedPlugin, FakeKubelet
from loopdev import LoopDevices

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2
from cdi_gen.cdi.registry import SpecCache
from cdi_gen.deviceplugin.board import DeviceBoard
from cdi_gen.deviceplugin.server import DevicePlugin
from cdi_gen.model import AdvertisedDevice

from .conftest import Pods, SpecFolders
from .image import IMAGE_NAME
from .test_cdi_injection import LIST_SCRIPT, nodes, write_spec

pytestmark = pytest.mark.e2e

VENDOR, CLASS = "example.com", "loop"


@dataclass
class Node:
    """The kubelet's side of one class: the plugin it registered and the board behind it."""

    board: DeviceBoard
    plugin: DevicePlugin
    kubelet: FakeKubelet
    connection: ConnectedPlugin

    async def allocate(self, *ids: str) -> api_pb2.ContainerAllocateResponse:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        )
        reply = await self.connection.stub.Allocate(request, timeout=10)
        assert len(reply.container_responses) == 1
        return reply.container_responses[0]


@contextlib.asynccontextmanager
async def start_node(
    short_dir: Path, spec_folders: SpecFolders, *, cdi_annotations: bool = False
) -> AsyncIterator[Node]:
    board = DeviceBoard()
    kubelet = FakeKubelet(short_dir / "dp")
    await kubelet.start()
    plugin = DevicePlugin(
        VENDOR,
        CLASS,
        board,
        SpecCache([spec_folders.etc, spec_folders.run]),
        plugin_dir=short_dir / "dp",
        cdi_annotations=cdi_annotations,
    )
    await plugin.start()
    try:
        yield Node(board, plugin, kubelet, await kubelet.next_registration())
    finally:
        await plugin.stop()
        await kubelet.stop()


async def test_allocated_cdi_names_start_a_container_with_the_device(
    short_dir: Path, pods: Pods, spec_folders: SpecFolders, loops: LoopDevices
) -> None:
    dev = loops.add()
    write_spec(spec_folders.run, [dev])
    async with start_node(short_dir, spec_folders) as node:
        node.board.publish([AdvertisedDevice(dev.name)])
        advertised = await node.connection.next_devices()
        while dev.name not in advertised:
            advertised = await node.connection.next_devices()

        response = await node.allocate(dev.name)
        assert [d.name for d in response.cdi_devices] == [f"{VENDOR}/{CLASS}={dev.name}"]

        result = await pods.start_allocated("allocated", response, LIST_SCRIPT)
        assert result.exit_code == 0, result
        assert nodes(result) == {str(dev.path): ("block special file", *dev.rdev())}
        assert result.env["CDI_GEN_CLASS"] == "loop"


async def test_allocated_annotation_alone_starts_a_container_with_the_device(
    short_dir: Path, pods: Pods, spec_folders: SpecFolders, loops: LoopDevices
) -> None:
    dev = loops.add()
    write_spec(spec_folders.run, [dev])
    async with start_node(short_dir, spec_folders, cdi_annotations=True) as node:
        node.board.publish([AdvertisedDevice(dev.name)])
        response = await node.allocate(dev.name)
        assert any(k.startswith("cdi.k8s.io/") for k in response.annotations), response

        # A runtime that reads only annotations (containerd 1.7.0/1.7.1) sees just these.
        result = await pods.start_allocated("annotated", response, LIST_SCRIPT, use_field=False)
        assert result.exit_code == 0, result
        assert nodes(result) == {str(dev.path): ("block special file", *dev.rdev())}


async def test_allocate_refuses_a_device_whose_entry_was_withdrawn(
    short_dir: Path, pods: Pods, spec_folders: SpecFolders, loops: LoopDevices
) -> None:
    keep, gone = loops.add(), loops.add()
    write_spec(spec_folders.run, [keep, gone])
    async with start_node(short_dir, spec_folders) as node:
        node.board.publish([AdvertisedDevice(keep.name), AdvertisedDevice(gone.name)])
        loops.remove(gone)
        write_spec(spec_folders.run, [keep])
        node.board.publish([AdvertisedDevice(keep.name)])

        # The kubelet would not even ask for it any more; if it did, the plugin says why ...
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await node.allocate(gone.name)
        assert gone.name in str(err.value.details())
        # ... and containerd refuses the name rather than inject a stale node.
        pod = await asyncio.to_thread(pods.new, "stale")
        with pytest.raises(grpc.RpcError) as cri_err:
            await asyncio.to_thread(
                pods.cri.create_container,
                pod,
                "consumer",
                IMAGE_NAME,
                ["/bin/true"],
                cdi_devices=[f"{VENDOR}/{CLASS}={gone.name}"],
            )
        assert "unresolvable CDI devices" in str(cri_err.value.details())
