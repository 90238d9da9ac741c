"""Unix socket files and the synchronous gRPC server every kubelet plugin serves on.

A kubelet plugin serves on a socket file in a folder the kubelet owns and wipes when it
starts. :class:`UnixServer` creates the file (mode 0600 whatever the umask, replacing only a
stale socket, never another kind of file), serves a fresh ``grpc.server`` on it each time it
is started and removes the file on stop unless something newer took the name. Its identity
(:class:`~cdi_gen.files.FileId`) tells the supervisor whether the file is still the one it created.

A name is served by one process at a time: :class:`NameLock`, an ``flock`` on
``.<socket name>.lock`` beside the socket (a dot file: the plugin watcher ignores it), held
from the first start to the last stop, says who may bind and unlink it. A socket whose lock
another process holds, or on which one listens (:func:`listening`), is never unlinked: two
processes that took each other's name traded it dozens of times a second. The holder writes
its instance (the pod's UID) into the lock: a second copy of the same instance is refused
with :class:`~cdi_gen.errors.SocketInUseError` (the agent exits); any other holder (an agent
this one replaces, still stopping) with a :class:`~cdi_gen.errors.RegistrationError` that the
plugin retries until the name is free.

The server is grpc's synchronous one on a thread pool: a unary call runs on a pool thread
straight from the transport, where grpc.aio would hand it to the event loop and back (about
45 µs and 7 system calls per call). Handlers therefore run on pool threads, never on the
agent's event loop, and must not touch asyncio objects.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import logging
import os
import socket
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

from cdi_gen.errors import ConfigError, RegistrationError, SocketInUseError, quote
from cdi_gen.files import FileId, file_id
from cdi_gen.kubelet.boundary import wait_for_thread
from cdi_gen.modes import SOCKET_MODE, umask

__all__ = [
    "MAX_SOCKET_PATH",
    "WORKERS",
    "NameLock",
    "UnixServer",
    "check_socket_path",
    "listening",
]

log = logging.getLogger(__name__)

#: sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107
#: Pool threads of one server. Each open stream holds one for its lifetime, so plugins cap
#: their streams well below this and unary calls always find a thread.
WORKERS = 16

#: The most of a lock file read for its holder's instance (a pod UID is at most 128).
_HOLDER_BYTES = 256


def listening(path: Path) -> bool:
    """Whether a server accepts connections on unix socket ``path`` (a full backlog counts:
    someone listens). Non-blocking, so the look never waits for a busy server."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(os.fsencode(path))
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return True


def check_socket_path(path: Path) -> None:
    """Raise :class:`ConfigError` when ``path`` cannot be a unix socket address."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ConfigError(f"unix socket path {str(path)!r} is longer than {MAX_SOCKET_PATH} bytes")


class NameLock:
    """The right to bind and unlink the socket ``path``: an exclusive ``flock`` on
    ``.<name>.lock`` beside it, which the kernel drops when its process ends, however it
    ends. ``instance`` (the pod's UID, "" when there is none) is written into the lock, so
    that another process finding it held can tell a second copy of itself from an agent it
    replaces."""

    def __init__(self, path: Path, instance: str = "") -> None:
        self.socket = path
        self.path = path.parent / f".{path.name}.lock"
        self.instance = instance
        self._fd: int | None = None

    def held(self) -> bool:
        """Whether we hold the lock of the file now at the lock's path (a kubelet start
        wipes its folder, the lock file with it: then a new one must be taken)."""
        if self._fd is None:
            return False
        try:
            ours = FileId.of(os.fstat(self._fd))
        except OSError:
            return False
        # The inode alone: we write into the lock, and its name is the question, not its bytes.
        return ours.same_inode(file_id(self.path))

    def acquire(self) -> None:
        """Hold the lock (kept if held). Raises :class:`~cdi_gen.errors.SocketInUseError`
        when another copy of this instance holds it, else
        :class:`~cdi_gen.errors.RegistrationError` when another process holds it or the
        lock file cannot be used."""
        if self.held():
            return
        # A holder letting go unlinks the file it holds before unlocking it: whoever locked
        # that file meanwhile sees it is no longer at the path and tries the new one.
        for _ in range(8):
            fd = self._open()
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise self._taken(os.pread(fd, _HOLDER_BYTES, 0)) from None
                if FileId.of(os.fstat(fd)).same_inode(file_id(self.path)):
                    # Written before cut to length: a reader never sees it empty.
                    data = self.instance.encode()
                    os.pwrite(fd, data, 0)
                    os.ftruncate(fd, len(data))
                    old, self._fd = self._fd, fd
                    if old is not None:
                        os.close(old)
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        raise RegistrationError(f"the lock {str(self.path)!r} keeps being replaced")

    def release(self) -> None:
        """Let go: the lock file is removed first if it is still ours. Never raises."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if FileId.of(os.fstat(fd)).same_inode(file_id(self.path)):
                self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot remove the lock %s: %s", self.path, exc)
        finally:
            os.close(fd)

    def refuse(self, holder: str | None) -> RegistrationError | SocketInUseError:
        """The error for a name served by another process: ``holder`` its instance as its
        lock says, None when it serves without our lock (another program, an older
        release)."""
        path = str(self.socket)
        if holder is not None and self.instance and holder == self.instance:
            return SocketInUseError(
                f"{path!r} is served by another running copy of this instance "
                f"(pod UID {quote(holder)}): one instance per pod serves its sockets, "
                "and a name another process serves is never taken"
            )
        who = "a process that holds no lock" if holder is None else f"instance {quote(holder)}"
        return RegistrationError(
            f"{path!r} is served by another running process ({who}): a name another process "
            "serves is never taken; served once it lets go"
        )

    def _taken(self, data: bytes) -> RegistrationError | SocketInUseError:
        return self.refuse(data.decode(errors="replace"))

    def _open(self) -> int:
        try:
            # No link followed, no FIFO waited on: the folder is the kubelet's.
            fd = os.open(
                self.path,
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                0o600,
            )
        except OSError as exc:
            raise RegistrationError(
                f"cannot serve on {str(self.socket)!r}: its lock {str(self.path)!r}: {exc}"
            ) from exc
        st = os.fstat(fd)
        # Written into once locked: never a file that is also somewhere else (a hard link).
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            os.close(fd)
            raise RegistrationError(
                f"{str(self.path)!r} exists and is not a regular file of its own; refusing "
                "to lock it"
            )
        return fd


class UnixServer:
    """A synchronous gRPC server on one unix socket file, restartable.

    ``services`` gives the method handlers of each new server generation by service name
    (``v1beta1.DevicePlugin``); ``on_stop`` is
    called before a generation stops, so that the plugin can end its streams cleanly (a
    stream still open when grace runs out ends with CANCELLED instead of OK). ``instance``
    (the pod's UID, "" without one) is what its :class:`NameLock` says holds the name.
    """

    def __init__(
        self,
        path: Path,
        services: Callable[[], Mapping[str, Mapping[str, grpc.RpcMethodHandler[Any, Any]]]],
        *,
        on_stop: Callable[[], None] | None = None,
        instance: str = "",
    ) -> None:
        check_socket_path(path)
        self.path = path
        self.lock = NameLock(path, instance)
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
        path holds something that is not a socket, is served by another process (see the
        module docstring: :class:`~cdi_gen.errors.SocketInUseError` for another copy of this
        instance) or cannot be bound."""
        path = self.path
        self.lock.acquire()
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
            # Left by an earlier run that died, or by the generation we replace; never one a
            # live process serves without the lock (an older release, another program).
            if listening(path):
                raise self.lock.refuse(None)
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

    async def stop(self, grace: float, *, release: bool = True) -> None:
        """Stop the current generation (in-flight calls get ``grace`` seconds) and remove
        the socket file if it is still ours; then let go of the name unless ``release`` is
        False (serving again at once). Never raises for a stopped server."""
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
        if release:
            self.lock.release()
