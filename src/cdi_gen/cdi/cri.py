"""The container runtime asked through its CRI socket: ``RuntimeService/Version``.

In a pod the runtime's binary is not visible, so ``--cdi-version runtime`` and the doctor
cannot ask ``containerd --version``; the runtime's CRI socket (the one the kubelet talks to,
mounted read-only into the pod) answers with its name and version instead, which
:func:`cdi_gen.cdi.runtimes.from_cri` maps onto the release table. Every failure is one line
naming the socket and why; the caller decides what it means (an error for the pin, a WARN for
the doctor).
"""

from __future__ import annotations

import functools
import stat
from collections.abc import Sequence
from pathlib import Path

import grpc

from cdi_gen._proto.cri.v1 import api_pb2, api_pb2_grpc
from cdi_gen.cdi.runtimes import Lookup, Runtime, from_cri
from cdi_gen.errors import ConfigError, quote

__all__ = ["CRI_API_VERSION", "TIMEOUT_SECONDS", "CriError", "ask", "lookup", "runtimes_at_sockets"]

#: The CRI API version we speak (the request names it; runtimes answer any).
CRI_API_VERSION = "v1"
#: How long one socket may take to answer: a runtime answers Version at once, and a socket
#: that does not must not hold up the agent's start.
TIMEOUT_SECONDS = 2.0


class CriError(Exception):
    """One line: the socket and why it gave no runtime."""


def ask(socket: Path, timeout: float = TIMEOUT_SECONDS) -> Runtime:
    """The runtime serving the CRI at ``socket``. Raises :class:`CriError`."""
    try:
        mode = socket.stat().st_mode
    except FileNotFoundError:
        raise CriError(f"CRI socket {socket}: no such socket") from None
    except OSError as exc:
        raise CriError(f"CRI socket {socket}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(mode):
        raise CriError(f"CRI socket {socket}: not a socket")
    # No proxy and one attempt: a local socket answers now or is not the runtime.
    options = [("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0)]
    try:
        with grpc.insecure_channel(f"unix://{socket}", options=options) as channel:
            stub = api_pb2_grpc.RuntimeServiceStub(channel)
            answer = stub.Version(api_pb2.VersionRequest(version=CRI_API_VERSION), timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            why = f"no answer to RuntimeService/Version within {timeout:g} s"
        else:
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            name = code.name if code is not None else "error"
            why = f"RuntimeService/Version failed: {name}: {quote(details or '')}"
        raise CriError(f"CRI socket {socket}: {why}") from None
    try:
        return from_cri(answer.runtime_name, answer.runtime_version, str(socket))
    except ConfigError as exc:
        raise CriError(f"CRI socket {socket}: RuntimeService/Version answered {exc}") from None


def runtimes_at_sockets(
    sockets: Sequence[Path], timeout: float = TIMEOUT_SECONDS
) -> tuple[list[Runtime], list[str]]:
    """The runtimes answering on ``sockets``, and one line per socket that gave none.

    A node runs one or two of the runtimes the default list names, so an absent socket is
    said only when none of them is there (then in one line for all).
    """
    found: list[Runtime] = []
    notes: list[str] = []
    present = [s for s in sockets if s.exists() or s.is_symlink()]
    if not present:
        listed = ", ".join(map(str, sockets)) or "none given"
        return [], [f"no CRI socket at {listed}"]
    for socket in present:
        try:
            found.append(ask(socket, timeout))
        except CriError as exc:
            notes.append(str(exc))
    return found, notes


def lookup(sockets: Sequence[Path], timeout: float = TIMEOUT_SECONDS) -> Lookup:
    """:func:`runtimes_at_sockets` of ``sockets``, asked only when called: the fallback the
    ``runtime`` pin and the doctor take when no runtime binary answers."""
    return functools.partial(runtimes_at_sockets, tuple(sockets), timeout)
