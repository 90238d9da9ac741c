"""The HTTPS server of the claims' admission webhook (``cdi-gen admission``).

The API server calls a webhook only over TLS, with a certificate it trusts (the
ValidatingWebhookConfiguration's ``caBundle``). :func:`serve_admission` serves, with the
standard library's ``ssl`` on asyncio and the context of a
:class:`~cdi_gen.admission.certificate.ServingCertificate` (which takes up renewed files),
``POST`` :data:`PATH` (an ``AdmissionReview``, answered by
:func:`~cdi_gen.admission.review.review`) and ``GET /healthz`` for the probes. One request
per connection.

Anything that can reach the Service can call it, so its memory is bounded whatever the
clients do (:class:`AdmissionLimits`; the shipped Deployment's limit is 128 MiB):

- at most ``max_connections`` connections are accepted at once; the next ones wait in the
  kernel's accept backlog, not in this process (an open TLS connection costs about 0.6 MiB:
  asyncio's 256 KiB read buffer, the undecrypted bytes, OpenSSL's records), and each has a
  fixed kernel receive buffer (socket memory counts against the container's limit);
- a request line and headers of limited size and count; a body of at most ``max_body``
  (the API server's own limit of a request), refused by its ``Content-Length`` before a byte
  of it is read, and read in chunks into one buffer of that size;
- every body being read or checked holds its length from one budget of ``in_flight_bytes``:
  a body that does not fit waits for others to finish, its bytes left in the kernel;
- a body is decoded only if its JSON has at most ``max_body_values`` values (counted from its
  commas and brackets): decoding makes an object of every value, up to 25 times the body;
- everything within ``deadline`` from the accept, TLS handshake included, so a slow client
  (slowloris) holds its connection and its share of the budget for that long at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
from dataclasses import dataclass
from typing import Final

from cdi_gen.admission.review import ReviewError, review

__all__ = ["PATH", "AdmissionLimits", "AdmissionServer", "serve_admission"]

log = logging.getLogger(__name__)

#: Where the ValidatingWebhookConfiguration sends reviews.
PATH: Final = "/validate-resource-claim-parameters"

_Answer = tuple[str, str, bytes]


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """What one process of the webhook holds at most. With the defaults, 56 clients posting
    bodies at the limit at once (reviews, JSON that decodes to the most objects) peak it at
    about 90 MiB, 50 over its idle 40: the Deployment's limit is 128 MiB
    (benchmarks/bench_admission.py; before these bounds, 255 MiB)."""

    #: Connections open at once (TLS handshake to answer); the next wait in the backlog.
    max_connections: int = 16
    #: Connections the kernel queues for the next free slot (it caps it at somaxconn).
    backlog: int = 64
    #: The kernel's receive buffer of each connection: socket memory counts against the
    #: container's limit too, and unset it grows to megabytes under a fast sender.
    receive_buffer: int = 256 << 10
    #: Largest body: the API server refuses a request over 3 MiB. Over it: 413, unread.
    max_body: int = 3 << 20
    #: Bytes of bodies read and checked at once, over all connections (four whole bodies).
    in_flight_bytes: int = 12 << 20
    #: JSON values a body may hold (commas and brackets, those in strings too): decoded, each
    #: costs up to ~150 bytes (a distinct key and its slot), so at most ~20 MiB. A claim's
    #: review has a few thousand. Over it: 413.
    max_body_values: int = 1 << 17
    #: Seconds for a whole connection, TLS handshake and a wait for the budget included; the
    #: API server waits the webhook's timeoutSeconds (5 s as shipped).
    deadline: float = 10.0
    #: Longest request or header line, all header lines together, and their count.
    max_line: int = 8192
    max_header_bytes: int = 32768
    max_headers: int = 100

    def __post_init__(self) -> None:
        # A body the budget cannot hold would wait for it until its deadline.
        if self.max_body > self.in_flight_bytes:
            raise ValueError(
                f"max_body {self.max_body} is over in_flight_bytes {self.in_flight_bytes}"
            )


class _RefusedError(Exception):
    def __init__(self, status: str, why: str) -> None:
        super().__init__(status, why)
        self.status, self.why = status, why


class _Budget:
    """Bytes lent to bodies being read and checked; a loan that does not fit waits."""

    def __init__(self, total: int) -> None:
        self.total, self.used, self.peak = total, 0, 0
        self._waiters: list[asyncio.Future[None]] = []

    async def take(self, size: int) -> None:
        while self.used + size > self.total:
            woken = asyncio.get_running_loop().create_future()
            self._waiters.append(woken)
            try:
                await woken
            finally:
                self._waiters.remove(woken)
        self.used += size
        self.peak = max(self.peak, self.used)

    def give(self, size: int) -> None:
        # Synchronous, so that a cancelled holder (its deadline) returns its loan too.
        self.used -= size
        for woken in self._waiters:
            if not woken.done():
                woken.set_result(None)


async def _headers(reader: asyncio.StreamReader, limits: AdmissionLimits) -> dict[str, str]:
    """The request's headers by lower-case name, within the limits' count and size."""
    headers: dict[str, str] = {}
    size = 0
    for _ in range(limits.max_headers + 1):
        header = await reader.readuntil(b"\n")
        size += len(header)
        if header in (b"\r\n", b"\n"):
            return headers
        if size > limits.max_header_bytes:
            raise _RefusedError("431 Request Header Fields Too Large", "headers too large")
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raise _RefusedError("431 Request Header Fields Too Large", "too many headers")


async def _head(reader: asyncio.StreamReader, limits: AdmissionLimits) -> tuple[str, str, int]:
    """Method, path and body length of one request; raises _RefusedError for one we do not
    take."""
    try:
        line = (await reader.readuntil(b"\n")).decode("latin-1").split()
        headers = await _headers(reader, limits)
    except asyncio.LimitOverrunError:
        raise _RefusedError("431 Request Header Fields Too Large", "line too long") from None
    if len(line) < 2:
        raise _RefusedError("400 Bad Request", "bad request line")
    if "transfer-encoding" in headers:
        raise _RefusedError("411 Length Required", "send the body with Content-Length")
    declared = headers.get("content-length", "0")
    if not (declared.isascii() and declared.isdigit()):
        raise _RefusedError("400 Bad Request", "bad Content-Length")
    # Checked before a byte of the body is read or a buffer made for it.
    if len(declared) > 9 or int(declared) > limits.max_body:
        raise _RefusedError("413 Content Too Large", f"body over {limits.max_body} bytes")
    return line[0], line[1].split("?")[0], int(declared)


async def _body(reader: asyncio.StreamReader, length: int) -> bytearray:
    """``length`` bytes read in chunks into one buffer: no copy of the whole body is made."""
    body = bytearray(length)
    view, got = memoryview(body), 0
    while got < length:
        chunk = await reader.read(min(1 << 16, length - got))
        if not chunk:
            raise asyncio.IncompleteReadError(bytes(view[:got]), length)
        view[got : got + len(chunk)] = chunk
        got += len(chunk)
    return body


def _route(method: str, path: str, body: bytearray, driver: str, max_values: int) -> _Answer:
    if path == "/healthz" and method == "GET":
        return "200 OK", "text/plain", b"ok\n"
    if path != PATH:
        return "404 Not Found", "text/plain", b"not found\n"
    if method != "POST":
        return "405 Method Not Allowed", "text/plain", b"POST an AdmissionReview\n"
    # Every JSON value but the first of its array or object follows a comma, the first
    # follows its bracket: this bounds the objects decoding would make, in one fast pass.
    if body.count(b",") + body.count(b"[") + body.count(b"{") >= max_values:
        return "413 Content Too Large", "text/plain", f"over {max_values} JSON values\n".encode()
    try:
        answer = review(json.loads(body), driver)
    except (ValueError, RecursionError) as exc:  # ReviewError, JSON that does not decode
        why = str(exc) if isinstance(exc, ReviewError) else "body is not JSON"
        return "400 Bad Request", "text/plain", (why + "\n").encode()
    return "200 OK", "application/json", json.dumps(answer).encode()


class AdmissionServer:
    """The listening socket and its connections; :func:`serve_admission` starts one.
    ``async with`` it (or :meth:`close` and :meth:`wait_closed`) to stop."""

    def __init__(
        self, sock: socket.socket, context: ssl.SSLContext, driver: str, limits: AdmissionLimits
    ) -> None:
        self.sockets = (sock,)
        self.limits, self._context, self._driver = limits, context, driver
        self._slots = asyncio.Semaphore(limits.max_connections)
        self._handlers: set[asyncio.Task[None]] = set()
        #: Connections open now, and the most there ever were at once (what tests read).
        self.connections = self.peak_connections = 0
        #: The body bytes lent now and at most (``budget.used``, ``budget.peak``).
        self.budget = _Budget(limits.in_flight_bytes)
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    async def _accept(self) -> None:
        try:
            await self._accept_each()
        finally:
            self.sockets[0].close()

    async def _accept_each(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._slots.acquire()
            try:
                conn, _ = await loop.sock_accept(self.sockets[0])
            except OSError as exc:  # EMFILE, ENOBUFS: the connection stays in the backlog
                self._slots.release()
                log.warning("admission: cannot accept a connection: %s", exc)
                await asyncio.sleep(0.1)
                continue
            except BaseException:
                self._slots.release()
                raise
            handler = loop.create_task(self._serve(conn))
            self._handlers.add(handler)
            handler.add_done_callback(self._served)

    def _served(self, handler: asyncio.Task[None]) -> None:
        self._handlers.discard(handler)
        self._slots.release()

    async def _serve(self, conn: socket.socket) -> None:
        self.connections += 1
        self.peak_connections = max(self.peak_connections, self.connections)
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.limits.deadline):
                reader, writer = await self._open(conn)
                writer.write(await self._answer(reader))
                await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the client left, stalled or failed its handshake: nothing to answer
        except OSError as exc:
            log.debug("admission: a connection failed: %s", exc)
        finally:
            self.connections -= 1
            if writer is None:
                conn.close()
            else:
                writer.close()
                with contextlib.suppress(ConnectionError, TimeoutError, ssl.SSLError):
                    await asyncio.wait_for(writer.wait_closed(), 1)

    async def _open(self, conn: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        # The reader's limit is a line's: asyncio stops reading a socket whose unread data
        # passes twice that, so a client sending ahead of what is read fills its own kernel
        # buffers, not ours.
        reader = asyncio.StreamReader(limit=self.limits.max_line)
        protocol = asyncio.StreamReaderProtocol(reader)
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol, conn, ssl=self._context, ssl_handshake_timeout=self.limits.deadline
        )
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def _answer(self, reader: asyncio.StreamReader) -> bytes:
        try:
            method, path, length = await _head(reader, self.limits)
            await self.budget.take(length)
            try:
                body = await _body(reader, length)
                status, ctype, out = _route(
                    method, path, body, self._driver, self.limits.max_body_values
                )
                del body  # returned before the answer is written, not after
            finally:
                self.budget.give(length)
        except _RefusedError as refused:
            status, ctype, out = refused.status, "text/plain", (refused.why + "\n").encode()
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(out)}\r\nConnection: close\r\n\r\n"
        )
        return head.encode() + out

    def close(self) -> None:
        """Stop accepting (the socket is closed by the accept loop as it ends, so that it
        never waits on a closed descriptor); connections open go on to their answer."""
        self._accepting.cancel()

    async def wait_closed(self) -> None:
        """Wait until the accept loop has stopped and every open connection has ended."""
        # asyncio.wait, not await: this call's own cancellation must not be taken for the
        # accept loop's.
        await asyncio.wait({self._accepting})
        self.sockets[0].close()  # if the loop was cancelled before it began
        while self._handlers:
            await asyncio.wait(set(self._handlers))

    async def __aenter__(self) -> AdmissionServer:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.close()
        await self.wait_closed()


async def serve_admission(
    host: str,
    port: int,
    context: ssl.SSLContext,
    driver: str,
    limits: AdmissionLimits | None = None,
) -> AdmissionServer:
    """Start serving reviews for DRA driver ``driver`` on ``host:port`` (port 0 picks one)
    over TLS with ``context``, within ``limits`` (the defaults when None); return the
    server."""
    limits = limits or AdmissionLimits()
    loop = asyncio.get_running_loop()
    family, _, _, _, address = (
        await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    )[0]
    sock = socket.create_server(address, family=family, backlog=limits.backlog)
    # Accepted connections inherit it from the listening socket.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, limits.receive_buffer)
    sock.setblocking(False)
    return AdmissionServer(sock, context, driver, limits)
