"""Prometheus metrics and the health endpoints of the agent.

``/metrics`` (Prometheus text format), ``/healthz`` (the event loop answers) and ``/readyz``
(every class has written its spec and its plugin is registered) are served by a tiny asyncio
HTTP server on the agent's own loop, so a stuck loop fails the liveness probe instead of being
hidden by a healthy side thread. The same server may also listen on a unix socket private to
the pod (``--probe-socket``, what ``cdi-gen probe`` asks): on the host's network, during a
rolling update, the address is the older agent's, and a probe of it says nothing of this one.
The server is bounded (:class:`HttpLimits`): oversize requests get 400/431, a request must
arrive within a deadline, and connections are capped with the slowest evicted first, so that
slow or hostile clients cannot starve the probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)


class Metrics:
    """Every metric the agent exports, in one private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.devices = Gauge(
            "cdi_gen_devices",
            "Devices advertised per class and health",
            ["resource", "health"],
            registry=r,
        )
        self.physical_devices = Gauge(
            "cdi_gen_physical_devices",
            "Physical devices discovered per class",
            ["resource"],
            registry=r,
        )
        self.allocations = Counter(
            "cdi_gen_allocations_total",
            "Allocate calls by outcome",
            ["resource", "outcome"],
            registry=r,
        )
        self.allocation_failures = Counter(
            "cdi_gen_allocation_failures_total",
            "Failed Allocate calls by reason",
            ["resource", "reason"],
            registry=r,
        )
        self.udev_events = Counter(
            "cdi_gen_udev_events_total", "udev events received by action", ["action"], registry=r
        )
        self.resyncs = Counter(
            "cdi_gen_resyncs_total", "Full re-enumerations by cause", ["cause"], registry=r
        )
        self.spec_writes = Counter(
            "cdi_gen_spec_writes_total",
            "Spec file writes and removals by result",
            ["resource", "result"],
            registry=r,
        )
        self.registrations = Counter(
            "cdi_gen_registrations_total",
            "Kubelet registrations by result",
            ["resource", "result"],
            registry=r,
        )
        self.failures = Counter(
            "cdi_gen_failures_total",
            "Failures contained at a class boundary, by class and reason (device-skipped, "
            "version, invalid-device, spec-write, plugin-start, internal; resource * for "
            "failures before classes are told apart)",
            ["resource", "reason"],
            registry=r,
        )
        self.pool_generation = Gauge(
            "cdi_gen_dra_pool_generation",
            "Generation of the node's ResourceSlice pool last published, per DRA driver",
            ["driver"],
            registry=r,
        )
        self.pool_published = Gauge(
            "cdi_gen_dra_pool_published",
            "1 when the DRA pool's current devices are in the API server, 0 while not",
            ["driver"],
            registry=r,
        )
        self.when_back = Counter(
            "cdi_gen_when_back_total",
            "Containers holding a device that came back with new numbers, by class, the "
            "whenBack applied and outcome (done, restarted, skipped, refused; per device: "
            "lookup-failed, timeout, error)",
            ["resource", "policy", "outcome"],
            registry=r,
        )
        self.hotplug_latency = Histogram(
            "cdi_gen_hotplug_to_spec_seconds",
            "From a udev event's arrival to the spec on disk and the device list published",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=r,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def allocate_hook(self, resource: str, reasons: Iterable[str]) -> Callable[[str, str], None]:
        """The device plugin's ``on_allocate`` for ``resource``: counts outcomes and reasons.

        Every series is made here, once: ``labels()`` hashes its arguments and takes a lock
        on each call, a cost Allocate would pay on every call otherwise. A reason not in
        ``reasons`` still counts (its series made when first seen).
        """
        ok = self.allocations.labels(resource, "ok")
        error = self.allocations.labels(resource, "error")
        failures = {r: self.allocation_failures.labels(resource, r) for r in reasons}

        def on_allocate(outcome: str, reason: str) -> None:
            if outcome == "ok":
                ok.inc()
                return
            error.inc()
            reason = reason or outcome
            counter = failures.get(reason)
            if counter is None:
                counter = failures[reason] = self.allocation_failures.labels(resource, reason)
            counter.inc()

        return on_allocate


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Bounds of the endpoint server: no client, slow or large, can take it away from the
    kubelet's probes."""

    #: Connections open at once. A connection over the cap evicts the oldest one still
    #: sending its request (a slow client); when all are answering, the newcomer is closed.
    max_connections: int = 64
    #: Seconds for the whole request line and headers (a deadline, not a per-line timeout:
    #: a client dripping a byte at a time is cut too). Also bounds writing the answer.
    header_deadline: float = 5.0
    #: Longest request line and header line (bytes); over it: 400 or 431.
    max_line: int = 8192
    #: Headers in total (bytes, count); over it: 431.
    max_header_bytes: int = 32768
    max_headers: int = 100


@dataclass(slots=True)
class _Connection:
    writer: asyncio.StreamWriter
    reading: bool = True


class _RefusedError(Exception):
    def __init__(self, status: str, why: str) -> None:
        super().__init__(status, why)
        self.status = status
        self.why = why


async def _read_request(reader: asyncio.StreamReader, limits: HttpLimits) -> str | None:
    """The request path, or None if the client left; raise _RefusedError for an oversize request."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise _RefusedError(
            "400 Bad Request", f"request line over {limits.max_line} bytes"
        ) from None
    except asyncio.IncompleteReadError:
        return None
    total = count = 0
    while True:
        try:
            header = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            raise _RefusedError(
                "431 Request Header Fields Too Large", f"header line over {limits.max_line} bytes"
            ) from None
        except asyncio.IncompleteReadError:
            break  # the client closed its side after the headers it had
        if header in (b"\r\n", b"\n"):
            break
        total += len(header)
        count += 1
        if total > limits.max_header_bytes or count > limits.max_headers:
            raise _RefusedError(
                "431 Request Header Fields Too Large",
                f"headers over {limits.max_header_bytes} bytes or {limits.max_headers} lines",
            )
    parts = line.decode("latin-1").split()
    return parts[1] if len(parts) > 1 else "/"


async def serve_http(
    host: str,
    port: int,
    metrics: Metrics,
    ready: Callable[[], tuple[bool, str]],
    limits: HttpLimits = HttpLimits(),
) -> asyncio.Server:
    """Start the endpoint server on ``host:port`` (port 0 picks one); return it."""
    handle = _handler(metrics, ready, limits)
    return await asyncio.start_server(handle, host, port, limit=limits.max_line)


async def serve_http_unix(
    path: Path,
    metrics: Metrics,
    ready: Callable[[], tuple[bool, str]],
    limits: HttpLimits = HttpLimits(),
) -> asyncio.Server:
    """The same endpoints on the unix socket ``path`` (what ``cdi-gen probe`` asks); a socket
    already there (the pod's previous container) is replaced. Raises OSError, and
    FileExistsError for a path that is anything but a socket: never removed."""
    _replace_socket(path)
    handle = _handler(metrics, ready, limits)
    return await asyncio.start_unix_server(handle, path, limit=limits.max_line)


def _replace_socket(path: Path) -> None:
    """Remove the socket at ``path``, if there is one; refuse anything else there."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise FileExistsError(f"{path} exists and is not a socket")
        path.unlink()


def _handler(
    metrics: Metrics, ready: Callable[[], tuple[bool, str]], limits: HttpLimits
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """One connection's handling, shared by the address and the socket."""
    # Insertion order: the first connection still reading is the oldest.
    connections: dict[asyncio.StreamWriter, _Connection] = {}

    def admit(writer: asyncio.StreamWriter) -> bool:
        if len(connections) < limits.max_connections:
            return True
        victim = next((c for c in connections.values() if c.reading), None)
        if victim is None:
            return False
        del connections[victim.writer]
        victim.writer.transport.abort()  # its handler sees EOF and ends
        return True

    async def answer(writer: asyncio.StreamWriter, status: str, ctype: str, body: bytes) -> None:
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not admit(writer):
            writer.transport.abort()
            return
        conn = connections[writer] = _Connection(writer)
        try:
            async with asyncio.timeout(limits.header_deadline):
                try:
                    path = await _read_request(reader, limits)
                except _RefusedError as refused:
                    conn.reading = False
                    why = (refused.why + "\n").encode()
                    await answer(writer, refused.status, "text/plain", why)
                    await _discard_rest(reader, writer)
                    return
                conn.reading = False
                if path is None or writer not in connections:  # gone, or evicted
                    return
                await answer(writer, *_route(path.split("?")[0], metrics, ready))
        except (TimeoutError, ConnectionError):
            pass
        finally:
            connections.pop(writer, None)
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1)

    return handle


async def _discard_rest(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read what the client still sends, briefly, so that closing does not reset the
    connection before it has read our answer (unread input makes the kernel send RST)."""
    writer.write_eof()
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(0.5):
            for _ in range(256):  # at most 256 reads of up to 64 KiB
                if not await reader.read(65536):
                    return


def _route(
    path: str, metrics: Metrics, ready: Callable[[], tuple[bool, str]]
) -> tuple[str, str, bytes]:
    if path == "/metrics":
        return "200 OK", CONTENT_TYPE_LATEST, metrics.exposition()
    if path == "/healthz":
        return "200 OK", "text/plain", b"ok\n"
    if path == "/readyz":
        ok, why = ready()
        return ("200 OK" if ok else "503 Service Unavailable"), "text/plain", (why + "\n").encode()
    return "404 Not Found", "text/plain", b"not found\n"
