"""The HTTPS server of the claim admission check (``cdi-gen admission``).

The API server calls a webhook only over TLS, with a certificate it trusts (the
ValidatingWebhookConfiguration's ``caBundle``). :func:`serve_admission` serves, with the
standard library's ``ssl`` on asyncio and the context of a
:class:`~cdi_gen.dra.driver.servingcert.ServingCertificate` (which takes up renewed files),
``POST`` :data:`PATH` (an ``AdmissionReview``, answered by
:func:`~cdi_gen.dra.driver.admission.review`) and ``GET /healthz`` for the probes. One request
per connection, bounded as the metrics server is: a request line and headers of limited size, a
body of at most :data:`MAX_BODY` (the API server's own limit of a request), all within a
deadline, so that a slow or hostile client holds nothing long.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from typing import Final

from cdi_gen.dra.driver.admission import ReviewError, review

__all__ = ["MAX_BODY", "PATH", "serve_admission"]

#: Where the ValidatingWebhookConfiguration sends reviews.
PATH: Final = "/validate-resource-claim-parameters"
#: The API server refuses objects over 3 MiB; a review carries the object and its old one.
MAX_BODY: Final = 8 * 1024 * 1024
_MAX_LINE: Final = 8192
_MAX_HEADERS: Final = 100
#: A whole request, TLS handshake included; the API server's own timeout is the webhook's
#: timeoutSeconds (5 s as shipped).
_DEADLINE: Final = 10.0

_Answer = tuple[str, str, bytes]


class _RefusedError(Exception):
    def __init__(self, status: str, why: str) -> None:
        super().__init__(status, why)
        self.status, self.why = status, why


async def _read(reader: asyncio.StreamReader) -> tuple[str, str, bytes]:
    """Method, path and body of one request; raises _RefusedError for one we do not take."""
    try:
        line = (await reader.readuntil(b"\n")).decode("latin-1").split()
        length = 0
        for _ in range(_MAX_HEADERS + 1):
            header = await reader.readuntil(b"\n")
            if header in (b"\r\n", b"\n"):
                break
            name, _, value = header.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        else:
            raise _RefusedError("431 Request Header Fields Too Large", "too many headers")
    except asyncio.LimitOverrunError:
        raise _RefusedError("431 Request Header Fields Too Large", "line too long") from None
    except ValueError:
        raise _RefusedError("400 Bad Request", "bad Content-Length") from None
    if len(line) < 2:
        raise _RefusedError("400 Bad Request", "bad request line")
    if length < 0:
        raise _RefusedError("400 Bad Request", "bad Content-Length")
    if length > MAX_BODY:
        raise _RefusedError("413 Content Too Large", f"body over {MAX_BODY} bytes")
    body = await reader.readexactly(length) if length else b""
    return line[0], line[1].split("?")[0], body


def _route(method: str, path: str, body: bytes, driver: str) -> _Answer:
    if path == "/healthz" and method == "GET":
        return "200 OK", "text/plain", b"ok\n"
    if path != PATH:
        return "404 Not Found", "text/plain", b"not found\n"
    if method != "POST":
        return "405 Method Not Allowed", "text/plain", b"POST an AdmissionReview\n"
    try:
        answer = review(json.loads(body), driver)
    except (ValueError, RecursionError) as exc:  # ReviewError, JSON that does not decode
        why = str(exc) if isinstance(exc, ReviewError) else "body is not JSON"
        return "400 Bad Request", "text/plain", (why + "\n").encode()
    return "200 OK", "application/json", json.dumps(answer).encode()


async def serve_admission(
    host: str,
    port: int,
    context: ssl.SSLContext,
    driver: str,
) -> asyncio.Server:
    """Start serving reviews for DRA driver ``driver`` on ``host:port`` (port 0 picks one)
    over TLS with ``context``; return the server."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_DEADLINE):
                try:
                    status, ctype, out = _route(*await _read(reader), driver)
                except _RefusedError as refused:
                    status, ctype, out = refused.status, "text/plain", (refused.why + "\n").encode()
                head = (
                    f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(out)}\r\nConnection: close\r\n\r\n"
                )
                writer.write(head.encode() + out)
                await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the client left, stalled or failed its handshake: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError, ssl.SSLError):
                await asyncio.wait_for(writer.wait_closed(), 1)

    return await asyncio.start_server(
        handle, host, port, ssl=context, limit=_MAX_LINE, ssl_handshake_timeout=_DEADLINE
    )
