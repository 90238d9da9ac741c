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
from collections.abc import Sequence
from pathlib import Path

import grpc

from cdi_gen._proto.cri.v1 import api_pb2, api_pb2_grpc
from cdi_gen.cdi.runtimes import Lookup, Runtime, from_cri
from cdi_gen.errors import ConfigError
from cdi_gen.localclient import LocalCallError, call_failure, local_channel

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
        with local_channel(socket, "CRI") as channel:
            stub = api_pb2_grpc.RuntimeServiceStub(channel)
            answer = stub.Version(api_pb2.VersionRequest(version=CRI_API_VERSION), timeout=timeout)
    except LocalCallError as exc:
        raise CriError(str(exc)) from None
    except grpc.RpcError as exc:
        why = call_failure(socket, "CRI", "RuntimeService/Version", exc, timeout)
        raise CriError(why) from None
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
