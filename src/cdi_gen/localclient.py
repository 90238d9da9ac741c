"""A short-lived gRPC client of a node-local unix socket (the kubelet's pod-resources socket,
the runtime's CRI socket): the socket checked first, one attempt per call, every call under
one deadline, and each failure as one line.

The agent asks these sockets while a device is coming back, so nothing here may wait longer
than the caller's bound: a socket that accepts and never answers costs the bound, no more.
"""

from __future__ import annotations

import contextlib
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import grpc

from cdi_gen.errors import quote

__all__ = [
    "MAX_ANSWER_BYTES",
    "Deadline",
    "LocalCallError",
    "call_failure",
    "check_socket",
    "local_channel",
]

#: The largest answer taken from a local socket. A node's pod resources (110 pods) or one
#: container's verbose status (its OCI spec) are tens of kilobytes; a bigger answer is refused
#: by grpc with RESOURCE_EXHAUSTED instead of being read into memory.
MAX_ANSWER_BYTES = 4 * 1024 * 1024


class LocalCallError(Exception):
    """One line: the socket and why it gave no answer."""


class Deadline:
    """One bound shared by the several calls of a lookup."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left, never below a millisecond (grpc then fails the call at once)."""
        return max(self._end - time.monotonic(), 0.001)


def check_socket(socket: Path, what: str) -> None:
    """Raise :class:`LocalCallError` unless ``socket`` is a unix socket: grpc would otherwise
    retry a missing path until the deadline and then say only that it timed out."""
    try:
        mode = socket.stat().st_mode
    except FileNotFoundError:
        raise LocalCallError(f"{what} socket {socket}: no such socket") from None
    except OSError as exc:
        raise LocalCallError(f"{what} socket {socket}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(mode):
        raise LocalCallError(f"{what} socket {socket}: not a socket")


@contextlib.contextmanager
def local_channel(socket: Path, what: str) -> Iterator[grpc.Channel]:
    """A channel to ``socket``, checked first; closed on exit."""
    check_socket(socket, what)
    # No proxy and one attempt: a local socket answers now or is not the service.
    options = [
        ("grpc.enable_http_proxy", 0),
        ("grpc.enable_retries", 0),
        ("grpc.max_receive_message_length", MAX_ANSWER_BYTES),
    ]
    with grpc.insecure_channel(f"unix://{socket}", options=options) as channel:
        yield channel


def call_failure(socket: Path, what: str, method: str, exc: grpc.RpcError, timeout: float) -> str:
    """The one line for a failed call: the socket, the method, the status and its details."""
    code = exc.code() if isinstance(exc, grpc.Call) else None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        why = f"no answer to {method} within {timeout:g} s"
    else:
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        name = code.name if code is not None else "error"
        why = f"{method} failed: {name}: {quote(details or '')}"
    return f"{what} socket {socket}: {why}"
