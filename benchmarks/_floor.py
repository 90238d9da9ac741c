"""The footprint floor: a Python process that loads what the agent's design needs, serves as
the agent serves, and does nothing else. bench_footprint measures the agent against it.

    python benchmarks/_floor.py FOLDER [dra] [used]

It imports grpcio, protobuf, pydantic (its BaseModel), orjson, click, pyudev,
prometheus-client and the device plugin protos, serves five synchronous grpc servers on unix
sockets in FOLDER (each on its own 16-thread pool, as the agent's plugins) and an asyncio HTTP
server on 127.0.0.1 answering ``/metrics`` from a prometheus registry. With ``dra`` it also
loads what the DRA driver needs besides: the API server client (lightkube on httpx2) and the
DRA protos (dra v1 and v1beta1, the health stream, plugin registration). It sets the agent's
GRPC_EXPERIMENTS first, so that grpc runs as it does in the agent.

With ``used`` it also uses what it loaded, the least any user of it does: one pydantic model
built and validated (pydantic loads its schema machinery only then, about 3 MiB), and with
``dra`` an API server client made (lightkube's, as the agent makes it: httpx2 loads its
transport, httpcore2, h11 and anyio only then), for an HTTPS server whose CA is
``FOLDER/ca.crt``, as a pod's service account names one (bench_footprint writes it). The
benchmark shows the agent against both floors.

Prints ``ready`` once it serves, then serves until its standard input ends (or SIGTERM).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import sys
import threading
from pathlib import Path

SERVERS = 5


def _load(dra: bool) -> None:
    import click  # noqa: F401
    import orjson  # noqa: F401
    import pyudev  # noqa: F401

    # BaseModel, not the bare package: pydantic loads lazily, and a model is what it is for.
    from pydantic import BaseModel  # noqa: F401

    from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc  # noqa: F401

    if dra:
        import httpx2  # noqa: F401
        import lightkube.config.client_adapter
        import lightkube.config.kubeconfig  # noqa: F401

        from cdi_gen._proto.dra.v1 import api_pb2 as _v1  # noqa: F401
        from cdi_gen._proto.dra.v1 import api_pb2_grpc as _v1g  # noqa: F401
        from cdi_gen._proto.dra.v1beta1 import api_pb2 as _b1  # noqa: F401
        from cdi_gen._proto.dra.v1beta1 import api_pb2_grpc as _b1g  # noqa: F401
        from cdi_gen._proto.drahealth.v1alpha1 import api_pb2 as _h  # noqa: F401
        from cdi_gen._proto.drahealth.v1alpha1 import api_pb2_grpc as _hg  # noqa: F401
        from cdi_gen._proto.pluginregistration.v1 import api_pb2 as _r  # noqa: F401
        from cdi_gen._proto.pluginregistration.v1 import api_pb2_grpc as _rg  # noqa: F401


def _use(dra: bool, folder: Path) -> object:
    """What the loaded libraries need to be of use at all (see the module docstring)."""
    from pydantic import BaseModel

    class Floor(BaseModel):
        name: str

    kept: list[object] = [Floor(name="floor")]
    if dra:
        from lightkube import KubeConfig
        from lightkube.config import client_adapter

        config = KubeConfig.from_dict(
            {
                "clusters": [
                    {
                        "name": "f",
                        "cluster": {
                            "server": "https://127.0.0.1:1",
                            "certificate-authority": str(folder / "ca.crt"),
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "f", "user": "u"}}],
                "current-context": "c",
            }
        ).get()
        kept.append(client_adapter.AsyncClient(config, client_adapter.ConnectionParams()))
    return kept


async def _serve(folder: Path) -> None:
    import grpc
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    servers = []
    for i in range(SERVERS):
        pool = concurrent.futures.ThreadPoolExecutor(16)
        server = grpc.server(pool)
        server.add_insecure_port(f"unix://{folder / f'floor{i}.sock'}")
        server.start()
        servers.append(server)
    registry = CollectorRegistry()
    Gauge("floor_up", "the floor serves", registry=registry).set(1)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = generate_latest(registry)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()

    http = await asyncio.start_server(answer, "127.0.0.1", 0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def read() -> None:
        sys.stdin.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=read, daemon=True).start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await stop.wait()
    http.close()
    for server in servers:
        server.stop(None)


def main(argv: list[str]) -> None:
    from cdi_gen.kubelet import apply_grpc_experiments

    apply_grpc_experiments()
    dra = "dra" in argv[1:]
    _load(dra)
    used = _use(dra, Path(argv[0])) if "used" in argv[1:] else None
    asyncio.run(_serve(Path(argv[0])))
    del used


if __name__ == "__main__":
    main(sys.argv[1:])
