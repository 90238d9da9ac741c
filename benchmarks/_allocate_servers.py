"""The servers bench_allocate.py measures, each run in a process of its own.

    python benchmarks/_allocate_servers.py MODE FOLDER [NAME]

``MODE`` is one of

* ``floor-bytes``: a bare grpcio unary server (bytes in, bytes out, no protobuf, no logic):
  the floor of the gRPC stack for Allocate latency;
* ``floor-protobuf``: a bare ``v1beta1.DevicePlugin`` Allocate that parses the request and
  answers the CDI names with the generated protobuf code, no checks: the floor for throughput;
* ``plugin``: cdi-gen's device plugin with a board of ``ADVERTISED`` devices, checking every
  Allocate against the real spec folder ``FOLDER/cdi`` (written by the benchmark).

A floor serves ``FOLDER/<NAME or MODE>.sock``, the plugin ``FOLDER/example.com-bench.sock``,
each on a unix socket with the same thread pool size as the plugin's.
Each prints ``ready`` once it serves, then reads commands on stdin: ``publish`` (plugin only)
flips the health of one device, publishes the board and prints the ``CLOCK_MONOTONIC``
nanoseconds taken just before publishing; ``quit`` (or end of input) stops it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import time
from pathlib import Path
from typing import Any

from _serverproc import commands, ready, wait_for_quit

VENDOR, CLASS = "example.com", "bench"
KIND = f"{VENDOR}/{CLASS}"
ADVERTISED = 1000
#: Thread pool of the floors: the same size as the plugin's own.
WORKERS = 16  # cdi_gen.kubelet.transport.WORKERS


def devices(flip: bool = False) -> list[Any]:
    from cdi_gen.model import AdvertisedDevice

    return [
        AdvertisedDevice(f"dev{i}", healthy=not (flip and i == 0), numa_node=i % 2)
        for i in range(ADVERTISED)
    ]


def _serve_floor(mode: str, socket: Path) -> None:
    import grpc

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(WORKERS))
    if mode == "floor-bytes":

        def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
            return request

        handler = grpc.method_handlers_generic_handler(
            "floor.Floor", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
        )
        server.add_generic_rpc_handlers((handler,))
    else:
        from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

        class Bare(api_pb2_grpc.DevicePluginServicer):
            def Allocate(  # noqa: N802 (the gRPC method name)
                self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
            ) -> api_pb2.AllocateResponse:
                response = api_pb2.AllocateResponse()
                for container in request.container_requests:
                    answer = response.container_responses.add()
                    answer.cdi_devices.extend(
                        api_pb2.CDIDevice(name=f"{KIND}={i}") for i in container.devices_ids
                    )
                return response

        api_pb2_grpc.add_DevicePluginServicer_to_server(Bare(), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    ready()
    wait_for_quit()
    server.stop(0)


async def _serve_plugin(folder: Path) -> None:
    from cdi_gen.cdi.registry import SpecCache
    from cdi_gen.deviceplugin.board import DeviceBoard
    from cdi_gen.deviceplugin.server import DevicePlugin

    board = DeviceBoard(devices())
    plugin = DevicePlugin(
        VENDOR,
        CLASS,
        board,
        SpecCache([folder / "cdi"]),
        plugin_dir=folder,
        kubelet_socket=folder / "absent.sock",
    )
    await plugin.start()
    queue = commands(asyncio.get_running_loop())
    ready()
    flipped = False
    try:
        while (command := await queue.get()) != "quit":
            if command == "publish":
                flipped = not flipped
                new = devices(flip=flipped)
                start = time.monotonic_ns()
                board.publish(new)
                sys.stdout.write(f"{start}\n")
                sys.stdout.flush()
    finally:
        await plugin.stop(grace=0)


def main() -> None:
    mode, folder = sys.argv[1], Path(sys.argv[2])
    name = sys.argv[3] if len(sys.argv) > 3 else mode
    if mode == "plugin":
        from cdi_gen.kubelet import apply_grpc_experiments

        apply_grpc_experiments()  # as `cdi-gen run` does, before grpc loads
        asyncio.run(_serve_plugin(folder))
    elif mode in ("floor-bytes", "floor-protobuf"):
        _serve_floor(mode, folder / f"{name}.sock")
    else:
        sys.exit(f"unknown mode {mode!r}: floor-bytes, floor-protobuf or plugin")


if __name__ == "__main__":
    main()
