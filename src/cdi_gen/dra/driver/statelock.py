"""The lock two instances of one DRA driver take around every change of their shared state.

During a rolling update two agents of one driver serve one node side by side, and the kubelet
may send a claim's prepare to one and its unprepare to the other: what a claim is prepared
with (the checkpoint file, which names its own specs) must be read from the file, not from
memory, whenever the other instance may have changed it. :class:`StateLock` is an
exclusive ``flock`` on ``<state dir>/dra-<driver>.lock`` (one per driver, beside its
checkpoint), shared by every instance on the node, and the file's content says whether
anything changed since this instance last looked: each change writes a new token into it, so
an instance whose token is still there skips the reload (one read of a few bytes instead of
the checkpoint), and a reader that only answers from memory looks at
the token without the lock (:meth:`StateLock.fresh`).

Threads of one process share the descriptor, and a ``flock`` held through it is held for all
of them: a mutex in front of it makes the lock exclusive between threads too. Taking it is
bounded: a caller past its timeout gets :class:`StateLockError` (the kubelet retries).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cdi_gen.dra.driver.checkpoint import CheckpointError
from cdi_gen.modes import make_folder

__all__ = ["StateLock", "StateLockError", "lock_path"]

#: Between two tries of a lock the other instance holds (it holds it for a record's write).
_POLL_SECONDS = 0.002
_TOKEN_BYTES = 16


class StateLockError(CheckpointError):
    """The state lock cannot be taken: another instance (or thread) held it for longer than
    the caller could wait, or its file cannot be opened. A checkpoint error: the claim's
    state cannot be read or changed now."""


def lock_path(state_dir: Path, driver: str) -> Path:
    """The lock file of ``driver`` (a DNS subdomain, so a safe file name) in ``state_dir``."""
    return Path(state_dir) / f"dra-{driver}.lock"


class StateLock:
    """The cross-instance lock of one driver's state at ``path`` (made on first use, mode 0600,
    with its folder).

    ``with lock.held(timeout) as stale:`` holds it for the block; ``stale`` says whether
    another instance changed the state since this one last held it (the caller reloads).
    :meth:`changed` inside the block marks a change of ours, for the other instances.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._mutex = threading.Lock()
        self._fd = -1
        #: The token this instance last read or wrote; None: never looked (reload).
        self._seen: bytes | None = None
        self._changed = False

    def _open(self) -> int:
        if self._fd < 0:
            # The state folder, as the checkpoint's first write would make it.
            make_folder(self.path.parent)
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            self._fd = os.open(self.path, flags, 0o600)
        return self._fd

    @contextmanager
    def held(self, timeout: float) -> Iterator[bool]:
        """Hold the lock for the block (see the class docstring); raise
        :class:`StateLockError` after ``timeout`` seconds of waiting, or when the lock file
        cannot be opened."""
        deadline = time.monotonic() + max(timeout, 0)
        if not self._mutex.acquire(timeout=max(timeout, 0)):
            raise StateLockError(f"{self.path}: another call held the DRA state lock")
        try:
            try:
                fd = self._open()
            except OSError as exc:
                raise StateLockError(f"{self.path}: cannot open the DRA state lock: {exc}") from exc
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StateLockError(
                            f"{self.path}: another instance of the driver held the DRA state "
                            f"lock for over {timeout:.3g}s"
                        ) from None
                    time.sleep(_POLL_SECONDS)
            try:
                token = os.pread(fd, _TOKEN_BYTES, 0)
                stale = self._seen is None or token != self._seen
                self._seen = token
                self._changed = False
                yield stale
            finally:
                # Also after a failure: a change half made (a spec written, its record
                # refused) is one the others must read.
                try:
                    if self._changed:
                        token = os.urandom(_TOKEN_BYTES)
                        self._seen = None  # unsure what the file holds until written
                        os.pwrite(fd, token, 0)
                        self._seen = token
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._mutex.release()

    def fresh(self) -> bool:
        """Whether no other instance changed the state since this one last held the lock:
        one read of the token, without the lock (a token being written reads as a change;
        a change the other instance has not finished counts as after this look)."""
        fd, seen = self._fd, self._seen
        if fd < 0 or seen is None:
            return False
        try:
            return os.pread(fd, _TOKEN_BYTES, 0) == seen
        except OSError:
            return False

    def changed(self) -> None:
        """Inside :meth:`held`: this block changed the state (the others reload)."""
        self._changed = True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
