"""Device plugin speed: Allocate latency and throughput against the floor of the gRPC stack,
and how long a device change takes to reach a ListAndWatch client.

The floor is a bare grpc.aio unary call (bytes in, bytes out, no protobuf, no logic) on a unix
socket, served and called exactly like the plugin, in the same process and the same run, so the
ratio shows what cdi-gen adds on top of gRPC itself. Floor and plugin batches alternate so that
noise from other processes hits both alike.

    python benchmarks/bench_allocate.py [--quick]
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from _table import Row, percentile, print_table

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from cdi_gen.cdi.registry import SpecCache
from cdi_gen.kubelet.board import DeviceBoard
from cdi_gen.kubelet.deviceplugin import DevicePlugin
from cdi_gen.model import AdvertisedDevice

VENDOR, CLASS = "example.com", "bench"
KIND = f"{VENDOR}/{CLASS}"
ADVERTISED = 1000
CLIENTS = 8
TARGET_RATIO = 1.3


def _devices(flip: bool = False) -> list[AdvertisedDevice]:
    return [
        AdvertisedDevice(f"dev{i}", healthy=not (flip and i == 0), numa_node=i % 2)
        for i in range(ADVERTISED)
    ]


def _write_spec(spec_dir: Path) -> None:
    spec_dir.mkdir()
    doc = {
        "cdiVersion": "0.3.0",
        "kind": KIND,
        "devices": [
            {"name": f"dev{i}", "containerEdits": {"deviceNodes": [{"path": f"/dev/null{i}"}]}}
            for i in range(ADVERTISED)
        ],
    }
    (spec_dir / f"{VENDOR}-{CLASS}.json").write_text(json.dumps(doc))


async def _start_floor(path: Path) -> grpc.aio.Server:
    async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        "floor.Floor", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server


def _allocate_request(count: int) -> api_pb2.AllocateRequest:
    ids = [f"dev{i * 7 + 1}" for i in range(count)]
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
    )


async def _timed(call: Callable[[], Awaitable[object]], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


async def _throughput(make_call: Callable[[int], Callable[[], Awaitable[object]]], n: int) -> float:
    calls = [make_call(c) for c in range(CLIENTS)]

    async def client(call: Callable[[], Awaitable[object]]) -> None:
        for _ in range(n):
            await call()

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in calls))
    return CLIENTS * n / (time.perf_counter() - start)


async def _bench(quick: bool) -> list[Row]:
    rounds, per_round = (5, 100) if quick else (20, 250)
    per_client = 100 if quick else 400
    updates = 30 if quick else 200
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="cg"))
    try:
        spec_dir = folder / "cdi"
        _write_spec(spec_dir)
        board = DeviceBoard(_devices())
        plugin = DevicePlugin(
            VENDOR,
            CLASS,
            board,
            SpecCache([spec_dir]),
            plugin_dir=folder,
            kubelet_socket=folder / "absent.sock",
        )
        floor = await _start_floor(folder / "floor.sock")
        await plugin.start()
        channels = [
            grpc.aio.insecure_channel(f"unix://{plugin.socket_path}") for _ in range(CLIENTS)
        ]
        floor_channels = [
            grpc.aio.insecure_channel(f"unix://{folder / 'floor.sock'}") for _ in range(CLIENTS)
        ]
        try:
            stubs = [api_pb2_grpc.DevicePluginStub(c) for c in channels]
            echoes = [
                c.unary_unary(
                    "/floor.Floor/Echo", request_serializer=None, response_deserializer=None
                )
                for c in floor_channels
            ]
            one, eight = _allocate_request(1), _allocate_request(8)
            payload = one.SerializeToString()
            probe = await stubs[0].Allocate(eight)
            assert len(probe.container_responses[0].cdi_devices) == 8

            def floor_call(c: int = 0) -> Callable[[], Awaitable[object]]:
                return lambda: echoes[c](payload)

            def alloc_call(
                request: api_pb2.AllocateRequest, c: int = 0
            ) -> Callable[[], Awaitable[object]]:
                return lambda: stubs[c].Allocate(request)

            # Warm up connections and code paths before measuring.
            await _timed(floor_call(), 200)
            await _timed(alloc_call(one), 200)
            await _timed(alloc_call(eight), 200)
            floor_s: list[float] = []
            one_s: list[float] = []
            eight_s: list[float] = []
            for _ in range(rounds):
                floor_s += await _timed(floor_call(), per_round)
                one_s += await _timed(alloc_call(one), per_round)
                eight_s += await _timed(alloc_call(eight), per_round)

            floor_tps: list[float] = []
            alloc_tps: list[float] = []
            for _ in range(3):
                floor_tps.append(await _throughput(floor_call, per_client))
                alloc_tps.append(await _throughput(lambda c: alloc_call(one, c), per_client))
            floor_tp, alloc_tp = statistics.median(floor_tps), statistics.median(alloc_tps)

            lag = await _list_and_watch_lag(stubs[0], board, updates)
        finally:
            for c in (*channels, *floor_channels):
                await c.close(None)
            await plugin.stop()
            await floor.stop(0)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    floor50 = percentile(floor_s, 50)

    def ms(value: float) -> str:
        return f"{value * 1e3:.3f} ms"

    def vs_floor(samples: list[float]) -> str:
        p50 = percentile(samples, 50)
        return f"{ms(p50)} ({p50 / floor50:.2f}x floor)"

    return [
        ("floor: bare grpc.aio unary p50 (unix socket)", ms(floor50), "-"),
        ("floor: bare grpc.aio unary p99", ms(percentile(floor_s, 99)), "-"),
        (
            f"Allocate p50, 1 device ({ADVERTISED:,} advertised)",
            vs_floor(one_s),
            f"<= {TARGET_RATIO}x floor",
        ),
        ("Allocate p99, 1 device", ms(percentile(one_s, 99)), "-"),
        ("Allocate p50, 8 devices", vs_floor(eight_s), f"<= {TARGET_RATIO}x floor"),
        ("Allocate p99, 8 devices", ms(percentile(eight_s, 99)), "-"),
        (f"floor throughput, {CLIENTS} clients", f"{floor_tp:,.0f} calls/s", "-"),
        (
            f"Allocate throughput, {CLIENTS} clients, 1 device",
            f"{alloc_tp:,.0f} calls/s ({alloc_tp / floor_tp:.2f}x floor)",
            "-",
        ),
        (
            f"ListAndWatch publish -> client p50 ({ADVERTISED:,} devices)",
            ms(percentile(lag, 50)),
            "-",
        ),
        ("ListAndWatch publish -> client p99", ms(percentile(lag, 99)), "-"),
    ]


async def _list_and_watch_lag(
    stub: api_pb2_grpc.DevicePluginAsyncStub, board: DeviceBoard, updates: int
) -> list[float]:
    """Time from board.publish to the full list arriving at a streaming client."""
    stream = stub.ListAndWatch(api_pb2.Empty())
    messages = aiter(stream)
    await anext(messages)
    lag = []
    try:
        for n in range(updates):
            start = time.perf_counter()
            board.publish(_devices(flip=n % 2 == 0))
            message = await anext(messages)
            lag.append(time.perf_counter() - start)
            assert len(message.devices) == ADVERTISED
    finally:
        stream.cancel()
    return lag


def run(quick: bool = False) -> list[Row]:
    """Measure; return rows of (metric, measured value, target)."""
    return asyncio.run(_bench(quick))


if __name__ == "__main__":
    print_table("allocate", run(quick="--quick" in sys.argv[1:]))
