"""Prometheus metrics and the health endpoints of the agent.

``/metrics`` (Prometheus text format), ``/healthz`` (the event loop answers) and ``/readyz``
(every class has written its spec and its plugin is registered) are served by a tiny asyncio
HTTP server on the agent's own loop, so a stuck loop fails the liveness probe instead of being
hidden by a healthy side thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

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
        self.hotplug_latency = Histogram(
            "cdi_gen_hotplug_to_spec_seconds",
            "From a udev event's arrival to the spec on disk and the device list published",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=r,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


async def serve_http(
    host: str, port: int, metrics: Metrics, ready: Callable[[], tuple[bool, str]]
) -> asyncio.Server:
    """Start the endpoint server on ``host:port`` (port 0 picks one); return it."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request.decode("latin-1").split()
            path = parts[1] if len(parts) > 1 else "/"
            status, ctype, body = _route(path.split("?")[0], metrics, ready)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port)


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


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6) → (host, port); raise ValueError."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"invalid address {address!r}, should be HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)
