"""Device plugin speed: Allocate latency and throughput against floors of the gRPC stack,
and how long a one-device change takes to reach a ListAndWatch client.

The servers run side by side in one run, each in its own process on a unix socket, with the
same thread pool size (see ``_allocate_servers.py``):

* the latency floor: a bare grpcio unary server, bytes in and bytes out;
* the throughput floor: a bare protobuf ``v1beta1.DevicePlugin`` Allocate with no checks;
* cdi-gen's device plugin, advertising 1,000 devices and checking every Allocate against a
  real spec folder, configured as the agent runs it.

The floors run as grpcio comes, which is what the targets are set against. The agent also
turns a grpc experiment off (``cdi_gen.kubelet.GRPC_EXPERIMENTS``); for transparency each
floor is run a second time with the same setting, and the ratio to it is shown as well.

The client (this process) sends the same serialized AllocateRequest bytes to every server, so
the client's own work is identical and a ratio shows only what the server side adds. Latency
batches alternate between floors and plugin so that noise from other processes hits all
alike. Throughput is 8 concurrent clients, each on its own channel; as the clients are
Python too, each server's own CPU time is also read, and calls per server CPU second are the
figure that tells servers apart even when the clients are the limit.

    python benchmarks/bench_allocate.py [--quick]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
from _allocate_servers import ADVERTISED, CLASS, KIND, VENDOR
from _serverproc import ServerProcess
from _table import Row, percentile, print_table, timed

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

HERE = Path(__file__).resolve().parent
CLIENTS = 8
LATENCY_TARGET = 1.10
THROUGHPUT_TARGET = 0.95
LAG_TARGET_MS = 1.0
ALLOCATE = "/v1beta1.DevicePlugin/Allocate"
PLUGIN_SOCKET = f"{VENDOR}-{CLASS}.sock"


def grpc_experiments() -> str:
    """The ``GRPC_EXPERIMENTS`` value cdi-gen's kubelet plugins run with ("" if none)."""
    try:
        from cdi_gen.kubelet import GRPC_EXPERIMENTS
    except ImportError:
        return os.environ.get("GRPC_EXPERIMENTS", "")
    return GRPC_EXPERIMENTS


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


def _allocate_bytes(count: int) -> bytes:
    ids = [f"dev{i * 7 + 1}" for i in range(count)]
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
    )
    return request.SerializeToString()


async def _throughput(socket: Path, method: str, payload: bytes, n: int) -> tuple[float, int]:
    channels = [grpc.aio.insecure_channel(f"unix://{socket}") for _ in range(CLIENTS)]
    try:
        calls = [
            c.unary_unary(method, request_serializer=None, response_deserializer=None)
            for c in channels
        ]
        for call in calls:  # connect every channel before the clock starts
            await call(payload)

        async def client(call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]) -> None:
            for _ in range(n):
                await call(payload)

        start = time.perf_counter()
        await asyncio.gather(*(client(c) for c in calls))
        return CLIENTS * n / (time.perf_counter() - start), CLIENTS * n
    finally:
        for c in channels:
            await c.close(None)


def _lag(plugin: ServerProcess, socket: Path, updates: int) -> list[float]:
    """From just before ``board.publish`` (in the plugin's process) to the full list decoded
    by a streaming client here; CLOCK_MONOTONIC is the same clock in both processes."""
    lag = []
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stream = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty())
        messages: Iterator[api_pb2.ListAndWatchResponse] = iter(stream)
        assert len(next(messages).devices) == ADVERTISED
        try:
            for _ in range(updates):
                plugin.send("publish")
                message = next(messages)
                arrived = time.monotonic_ns()
                lag.append((arrived - int(plugin.read())) / 1e9)
                assert len(message.devices) == ADVERTISED
        finally:
            stream.cancel()
    return lag


def _latencies(folder: Path, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Round trips to the bytes floors and to Allocate (1 and 8 devices), batches alternating."""
    one, eight = _allocate_bytes(1), _allocate_bytes(8)
    channels = [
        grpc.insecure_channel(f"unix://{folder / name}")
        for name in ("floor-bytes.sock", "floor-bytes-x.sock", PLUGIN_SOCKET)
    ]
    try:
        echo, echo_x = (
            c.unary_unary("/floor.Floor/Echo", request_serializer=None, response_deserializer=None)
            for c in channels[:2]
        )
        allocate = channels[2].unary_unary(
            ALLOCATE, request_serializer=None, response_deserializer=None
        )
        probe = api_pb2.AllocateResponse.FromString(allocate(eight))
        assert len(probe.container_responses[0].cdi_devices) == 8, probe
        calls: dict[str, Callable[[], object]] = {
            "floor": lambda: echo(one),
            "floor-x": lambda: echo_x(one),
            "one": lambda: allocate(one),
            "eight": lambda: allocate(eight),
        }
        for call in calls.values():  # warm up connections and code paths
            timed(call, 200)
        samples: dict[str, list[float]] = {key: [] for key in calls}
        for _ in range(rounds):
            for key, call in calls.items():
                samples[key] += timed(call, per_round)
        return samples
    finally:
        for c in channels:
            c.close()


def _throughputs(
    folder: Path, servers: dict[str, ServerProcess], turns: int, per_client: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Median calls per wall second and per server CPU second of each server, in turns."""
    one = _allocate_bytes(1)
    sockets = {
        "bare": folder / "floor-protobuf.sock",
        "bare-x": folder / "floor-protobuf-x.sock",
        "plugin": folder / PLUGIN_SOCKET,
    }
    rates: dict[str, list[float]] = {key: [] for key in sockets}
    capacity: dict[str, list[float]] = {key: [] for key in sockets}
    for _ in range(turns):
        for key, socket in sockets.items():
            cpu = servers[key].cpu_seconds()
            rate, done = asyncio.run(_throughput(socket, ALLOCATE, one, per_client))
            rates[key].append(rate)
            capacity[key].append(done / max(servers[key].cpu_seconds() - cpu, 1e-3))
    return (
        {key: statistics.median(values) for key, values in rates.items()},
        {key: statistics.median(values) for key, values in capacity.items()},
    )


def _bench(quick: bool) -> list[Row]:
    rounds, per_round = (5, 100) if quick else (20, 250)
    per_client = 150 if quick else 600
    turns = 3 if quick else 5
    updates = 30 if quick else 200
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="cg"))
    experiments = grpc_experiments()
    bare_env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    ours_env = {**bare_env, "GRPC_EXPERIMENTS": experiments}
    servers: dict[str, ServerProcess] = {}
    try:
        _write_spec(folder / "cdi")
        for key, mode, name, env in (
            ("floor", "floor-bytes", "floor-bytes", bare_env),
            ("floor-x", "floor-bytes", "floor-bytes-x", ours_env),
            ("bare", "floor-protobuf", "floor-protobuf", bare_env),
            ("bare-x", "floor-protobuf", "floor-protobuf-x", ours_env),
            ("plugin", "plugin", "plugin", ours_env),
        ):
            servers[key] = ServerProcess(
                name,
                HERE / "_allocate_servers.py",
                [mode, str(folder), name],
                folder / f"{name}.log",
                env,
            )
        samples = _latencies(folder, rounds, per_round)
        rate, cap = _throughputs(folder, servers, turns, per_client)
        lag = _lag(servers["plugin"], folder / PLUGIN_SOCKET, updates)
    except Exception:
        for server in servers.values():
            print(f"--- {server.name} stderr:\n{server.errors()}", file=sys.stderr)
        raise
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return _rows(samples, rate, cap, lag, experiments)


def _rows(
    samples: dict[str, list[float]],
    rate: dict[str, float],
    cap: dict[str, float],
    lag: list[float],
    experiments: str,
) -> list[Row]:
    p50 = {key: percentile(values, 50) for key, values in samples.items()}

    def ms(value: float) -> str:
        return f"{value * 1e3:.3f} ms"

    def vs_floor(key: str) -> str:
        return f"{ms(p50[key])} ({p50[key] / p50['floor']:.2f}x floor)"

    def per_s(value: float, floor: float | None = None) -> str:
        text = f"{value:,.0f} calls/s"
        return text if floor is None else f"{text} ({value / floor:.2f}x floor)"

    flag = f"GRPC_EXPERIMENTS={experiments}"
    latency = f"<= {LATENCY_TARGET:.2f}x floor"
    throughput = f">= {THROUGHPUT_TARGET:.2f}x floor"
    return [
        ("floor: bare grpcio unary p50, own process", ms(p50["floor"]), "-"),
        ("floor: bare grpcio unary p99", ms(percentile(samples["floor"], 99)), "-"),
        (f"Allocate p50, 1 device ({ADVERTISED:,} advertised)", vs_floor("one"), latency),
        ("Allocate p99, 1 device", ms(percentile(samples["one"], 99)), "-"),
        ("Allocate p50, 8 devices", vs_floor("eight"), latency),
        ("Allocate p99, 8 devices", ms(percentile(samples["eight"], 99)), "-"),
        (
            f"  floor run with {flag}: p50 / Allocate 1 device vs it",
            f"{ms(p50['floor-x'])} / {p50['one'] / p50['floor-x']:.2f}x",
            "informative",
        ),
        (f"floor: bare protobuf Allocate, {CLIENTS} clients", per_s(rate["bare"]), "-"),
        (
            f"Allocate throughput, {CLIENTS} clients, 1 device",
            per_s(rate["plugin"], rate["bare"]),
            throughput,
        ),
        ("floor: bare protobuf Allocate, calls per server CPU s", per_s(cap["bare"]), "-"),
        ("Allocate, calls per server CPU s", per_s(cap["plugin"], cap["bare"]), throughput),
        (
            f"  protobuf floor run with {flag}: Allocate vs it (wall / CPU)",
            f"{rate['plugin'] / rate['bare-x']:.2f}x / {cap['plugin'] / cap['bare-x']:.2f}x",
            "informative",
        ),
        (
            f"ListAndWatch publish -> client p50 ({ADVERTISED:,} devices, one changed)",
            ms(percentile(lag, 50)),
            f"<= {LAG_TARGET_MS:g} ms",
        ),
        ("ListAndWatch publish -> client p99", ms(percentile(lag, 99)), "-"),
    ]


def run(quick: bool = False) -> list[Row]:
    """Measure; return rows of (metric, measured value, target)."""
    return _bench(quick)


if __name__ == "__main__":
    print_table("allocate", run(quick="--quick" in sys.argv[1:]))
