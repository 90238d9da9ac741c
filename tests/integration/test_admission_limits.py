"""The admission webhook's memory is bounded whatever its clients do: many clients posting
large bodies at once against the real ``cdi-gen admission`` process (its peak RSS from /proc,
under the Deployment's memory limit), and the bounds themselves (connections, bytes in flight,
headers, a slow client) read from the server's counters over real TLS on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from cdi_gen.admission.certificate import tls_context
from cdi_gen.admission.https import AdmissionLimits, AdmissionServer, serve_admission
from tests.admissionload import (
    DRIVER,
    MIB,
    PATH,
    admission_process,
    bomb_body,
    flood,
    keys_body,
    peak_rss,
    review_body,
)
from tests.pki import Authority

pytestmark = pytest.mark.timeout(180)

_REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    ca = Authority(tmp_path_factory.mktemp("pki"))
    pair = ca.issue(
        "webhook", "cdi-gen-admission", dns=("localhost",), ips=("127.0.0.1",), server=True
    )
    return ca.cert, pair.cert, pair.key


def _memory_limit() -> int:
    """The webhook container's memory limit, as kustomize and the chart ship it (the same)."""
    docs = yaml.safe_load_all((_REPO / "deploy/kubernetes/admission/admission.yaml").read_text())
    deployment = next(d for d in docs if d and d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    limit = container["resources"]["limits"]["memory"]
    chart = (_REPO / "deploy/helm/cdi-gen/templates/admission.yaml").read_text()
    assert f"limits: {{memory: {limit}}}" in chart, "the chart and kustomize disagree"
    match = re.fullmatch(r"(\d+)Mi", limit)
    assert match, limit
    return int(match[1]) * MIB


def test_many_clients_with_large_bodies_stay_under_the_deployments_memory_limit(
    tls: tuple[Path, Path, Path],
) -> None:
    """56 clients at once, each with a body at the limit: reviews (buffered whole before),
    JSON that decodes to 25 times its size, and the heaviest JSON still decoded. Before the
    bounds the process peaked at 212 MiB; the Deployment's limit is 128 MiB."""
    ca, cert, key = tls
    limits = AdmissionLimits()
    bodies = (
        [review_body(limits.max_body)] * 40
        + [bomb_body(limits.max_body)] * 8
        + [keys_body(limits.max_body_values - 1)] * 8
    )
    # What is measured is memory, not speed: on a loaded machine (make test's cluster tier
    # beside it) the queue of 3 MiB bodies can take longer than the 10 s a client gets by
    # default, and a client cut at its deadline would read as a lost answer. The deadline has
    # its own test (test_a_slow_client_is_cut_at_the_deadline_and_the_next_one_answered).
    with admission_process(cert, key, ca, "--request-timeout", "150") as (proc, port):
        idle = peak_rss(proc.pid)
        results = flood(port, ca, bodies)
        peak = peak_rss(proc.pid)
    # The memory first: before the bounds, everything was also answered.
    assert peak < _memory_limit() - 16 * MIB, f"peak {peak / MIB:.0f} MiB, idle {idle / MIB:.0f}"
    assert peak - idle < 64 * MIB, f"peak {peak / MIB:.0f} MiB, idle {idle / MIB:.0f}"
    # Every client answered: 200 the reviews, 413 the bombs, 400 the JSON that is no review.
    assert Counter(results) == {200: 40, 413: 8, 400: 8}, Counter(results)


@pytest.fixture
async def bounded(tls: tuple[Path, Path, Path]) -> AsyncIterator[tuple[AdmissionServer, int]]:
    _, cert, key = tls
    limits = AdmissionLimits(
        max_connections=3, max_body=256 << 10, in_flight_bytes=2 * (256 << 10), deadline=1.0
    )
    server = await serve_admission("127.0.0.1", 0, tls_context(cert, key), DRIVER, limits)
    async with server:
        yield server, server.sockets[0].getsockname()[1]


async def test_connections_and_bytes_in_flight_never_pass_their_bounds(
    tls: tuple[Path, Path, Path], bounded: tuple[AdmissionServer, int]
) -> None:
    """12 clients at once against 3 connections and two bodies' worth of budget: every one
    answered, the others waiting in the backlog or for the budget."""
    ca, _, _ = tls
    server, port = bounded
    results = await asyncio.to_thread(flood, port, ca, [review_body(256 << 10)] * 12)
    assert results == [200] * 12
    assert 1 <= server.peak_connections <= 3
    assert 0 < server.budget.peak <= 2 * (256 << 10)
    assert (server.connections, server.budget.used) == (0, 0)


def _exchange(port: int, ca: Path, raw: bytes) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as plain,
        context.wrap_socket(plain, server_hostname="localhost") as conn,
    ):
        conn.sendall(raw)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        # Headers each under the line limit, 80 KB together.
        (
            f"POST {PATH} HTTP/1.1\r\n".encode() + (b"X-A: " + b"a" * 4000 + b"\r\n") * 20,
            b"431",
        ),
        (f"POST {PATH} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".encode(), b"411"),
        (f"POST {PATH} HTTP/1.1\r\nContent-Length: 1_0\r\n\r\n".encode(), b"400"),
        (f"POST {PATH} HTTP/1.1\r\nContent-Length: +5\r\n\r\n".encode(), b"400"),
        (f"POST {PATH} HTTP/1.1\r\nContent-Length: 99999999999999\r\n\r\n".encode(), b"413"),
    ],
    ids=["header-bytes", "chunked", "underscore", "plus", "huge-length"],
)
async def test_requests_over_the_header_bounds_are_refused(
    tls: tuple[Path, Path, Path], bounded: tuple[AdmissionServer, int], raw: bytes, status: bytes
) -> None:
    ca, _, _ = tls
    answer = await asyncio.to_thread(_exchange, bounded[1], ca, raw)
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:80]


async def test_a_slow_client_is_cut_at_the_deadline_and_the_next_one_answered(
    tls: tuple[Path, Path, Path], bounded: tuple[AdmissionServer, int]
) -> None:
    """Three clients that never speak take every connection; a probe waits in the backlog and
    is answered once the deadline cut them."""
    ca, _, _ = tls
    server, port = bounded
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    try:
        probe = asyncio.create_task(
            asyncio.to_thread(_exchange, port, ca, b"GET /healthz HTTP/1.1\r\n\r\n")
        )
        # Each silent client is closed by the server: its read ends (EOF or reset).
        for conn in silent:
            conn.settimeout(30)
            with contextlib.suppress(ConnectionResetError):
                assert await asyncio.to_thread(conn.recv, 1) == b""
        answer = await probe
    finally:
        for conn in silent:
            conn.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
    assert server.peak_connections <= 3
