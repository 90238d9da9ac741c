"""A fake container runtime's CRI socket: ``runtime.v1.RuntimeService/Version`` served over a
real unix socket by a real gRPC server, answering what containerd or CRI-O answers (or what
a test makes it answer). Every request it got lands in ``requests``.

Use it as ``with FakeCri(socket, "containerd", "v2.3.7") as cri:``.
"""

from __future__ import annotations

import contextlib
import queue
import socket as socketlib
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import TracebackType

import grpc

from cdi_gen._proto.cri.v1 import api_pb2, api_pb2_grpc


class _Runtime(api_pb2_grpc.RuntimeServiceServicer):
    def __init__(self, fake: FakeCri) -> None:
        self.fake = fake

    def Version(
        self, request: api_pb2.VersionRequest, context: grpc.ServicerContext
    ) -> api_pb2.VersionResponse:
        self.fake.requests.put(request)
        return api_pb2.VersionResponse(
            version="0.1.0",
            runtime_name=self.fake.name,
            runtime_version=self.fake.version,
            runtime_api_version="v1",
        )


class FakeCri:
    """A runtime named ``name`` at ``version`` answering on ``socket``."""

    def __init__(self, socket: Path, name: str, version: str) -> None:
        self.socket = socket
        self.name = name
        self.version = version
        self.requests: queue.Queue[api_pb2.VersionRequest] = queue.Queue()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_RuntimeServiceServicer_to_server(_Runtime(self), self._server)
        self._server.add_insecure_port(f"unix://{socket}")

    def __enter__(self) -> FakeCri:
        self._server.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.stop(None).wait()


@contextlib.contextmanager
def silent_socket(path: Path) -> Iterator[Path]:
    """A unix socket that accepts connections and never says a word (a hung runtime)."""
    listener = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    try:
        listener.bind(str(path))
        listener.listen(8)
        yield path
    finally:
        listener.close()


@contextlib.contextmanager
def garbage_socket(path: Path) -> Iterator[Path]:
    """A unix socket whose every connection gets bytes that are no HTTP/2, then a close."""
    listener = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the listener was closed: the test is over
            with conn:
                conn.sendall(b"HTTP/1.0 418 I am a teapot\r\n\r\n\x00\xff garbage")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        # shutdown wakes the blocked accept(); close alone may not.
        with contextlib.suppress(OSError):
            listener.shutdown(socketlib.SHUT_RDWR)
        listener.close()
        thread.join(5)
