"""Unix socket files and the synchronous gRPC server every kubelet plugin serves on.

A kubelet plugin serves on a socket file in a folder the kubelet owns and wipes when it
starts. :class:`UnixServer` creates the file (mode 0600 whatever the umask, replacing only a
stale socket, never another kind of file), serves a fresh ``grpc.server`` on it each time it
is started and removes the file on stop unless something newer took the name. Its identity
(:func:`file_id`) tells the supervisor whether the file is still the one it created.

The server is grpc's synchronous one on a thread pool: a unary call runs on a pool thread
straight from the transport, where grpc.aio would hand it to the event loop and back (about
45 µs and 7 system calls per call). Handlers therefore run on pool threads, never on the
agent's event loop, and must not touch asyncio objects.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

from cdi_gen.errors import ConfigError, RegistrationError
from cdi_gen.kubelet.boundary import wait_for_thread
from cdi_gen.modes import SOCKET_MODE, umask

__all__ = ["MAX_SOCKET_PATH", "WORKERS", "FileId", "UnixServer", "check_socket_path", "file_id"]

log = logging.getLogger(__name__)

#: sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107
#: Pool threads of one server. Each open stream holds one for its lifetime, so plugins cap
#: their streams well below this and unary calls always find a thread.
WORKERS = 16

FileId = tuple[int, int, int]


def file_id(path: Path) -> FileId | None:
    """Identity of the file at ``path``; a re-created file differs even if its inode is reused."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def check_socket_path(path: Path) -> None:
    """Raise :class:`ConfigError` when ``path`` cannot be a unix socket address."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ConfigError(f"unix socket path {str(path)!r} is longer than {MAX_SOCKET_PATH} bytes")


class UnixServer:
    """A synchronous gRPC server on one unix socket file, restartable.

    ``services`` gives the method handlers of each new server generation by service name
    (``v1beta1.DevicePlugin``); ``on_stop`` is
    called before a generation stops, so that the plugin can end its streams cleanly (a
    stream still open when grace runs out ends with CANCELLED instead of OK).
    """

    def __init__(
        self,
        path: Path,
        services: Callable[[], Mapping[str, Mapping[str, grpc.RpcMethodHandler[Any, Any]]]],
        *,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        check_socket_path(path)
        self.path = path
        self._services = services
        self._on_stop = on_stop
        self._server: grpc.Server | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.socket_id: FileId | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    def gone(self) -> bool:
        """Whether our socket file was removed or replaced (a kubelet start wipes it)."""
        return self._server is None or file_id(self.path) != self.socket_id

    def start(self) -> None:
        """Serve a new generation on the socket. Raises :class:`RegistrationError` when the
        path holds something that is not a socket or cannot be bound."""
        path = self.path
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise RegistrationError(f"cannot serve on {str(path)!r}: {exc}") from exc
        else:
            if not stat.S_ISSOCK(st.st_mode):
                raise RegistrationError(
                    f"{str(path)!r} exists and is not a socket; refusing to replace it"
                )
            # Left by an earlier run, or by the generation we replace: the newest server
            # takes the name, as the kubelet keeps only the newest registration anyway.
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                raise RegistrationError(f"cannot remove stale {str(path)!r}: {exc}") from exc
        pool = concurrent.futures.ThreadPoolExecutor(
            WORKERS, thread_name_prefix=f"grpc {path.name}"
        )
        handlers = [
            grpc.method_handlers_generic_handler(name, dict(methods))
            for name, methods in self._services().items()
        ]
        server = grpc.server(pool, handlers=handlers)
        try:
            # Binding creates the socket file: with the umask the launcher gave us (000)
            # any local user could call Allocate.
            with umask(0o777 & ~SOCKET_MODE):
                server.add_insecure_port(f"unix://{path}")
        except RuntimeError as exc:
            pool.shutdown(wait=False)
            raise RegistrationError(f"cannot serve on {str(path)!r}: {exc}") from exc
        server.start()
        self._server, self._pool = server, pool
        self.socket_id = file_id(path)

    async def stop(self, grace: float) -> None:
        """Stop the current generation (in-flight calls get ``grace`` seconds) and remove
        the socket file if it is still ours. Never raises for a stopped server."""
        server, self._server = self._server, None
        pool, self._pool = self._pool, None
        if server is not None:
            if self._on_stop is not None:
                self._on_stop()
            done = server.stop(grace)
            await wait_for_thread(done)
        if pool is not None:
            pool.shutdown(wait=False)  # grpc leaves the pool it was given to its owner
        # grpc unlinks the socket itself; make sure, but never touch a newer file.
        if self.socket_id is not None and file_id(self.path) == self.socket_id:
            self.path.unlink(missing_ok=True)
        self.socket_id = None
