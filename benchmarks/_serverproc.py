"""Benchmark servers run in processes of their own, and the little protocol they speak.

A server script prints ``ready`` once it serves, then reads commands on stdin, one per line,
until ``quit`` or the end of its input. :class:`ServerProcess` is the benchmark's side: it
starts the script, waits for ``ready``, sends commands, reads answers, reads the server's CPU
time and stops it; :func:`ready`, :func:`wait_for_quit` and :func:`commands` are the
server's side. bench_allocate and bench_prepare both time their servers this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO


def ready() -> None:
    """Tell the benchmark the server accepts calls."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()


def wait_for_quit() -> None:
    """Block until ``quit`` or the end of input (a synchronous server's main thread)."""
    for line in sys.stdin:
        if line.strip() == "quit":
            break


def commands(loop: asyncio.AbstractEventLoop) -> asyncio.Queue[str]:
    """The commands read from stdin by a thread, delivered on ``loop``; ``quit`` after the
    end of input (an asyncio server's side)."""
    queue: asyncio.Queue[str] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(queue.put_nowait, line.strip())
        loop.call_soon_threadsafe(queue.put_nowait, "quit")

    threading.Thread(target=read, daemon=True).start()
    return queue


class ServerProcess:
    """One server script run as ``python SCRIPT ARGS...``; its stderr goes to ``log``."""

    def __init__(
        self,
        name: str,
        script: Path,
        args: Sequence[str],
        log: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self._log = log.open("w+")
        self.process = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
        )
        self._stdin: IO[str] = self.process.stdin  # type: ignore[assignment]
        self._stdout: IO[str] = self.process.stdout  # type: ignore[assignment]
        if self.read() != "ready":
            raise RuntimeError(f"{name} server did not start:\n{self.errors()}")

    def errors(self) -> str:
        self._log.seek(0)
        return self._log.read()[-4000:]

    def send(self, command: str) -> None:
        self._stdin.write(command + "\n")
        self._stdin.flush()

    def read(self) -> str:
        return self._stdout.readline().strip()

    def cpu_seconds(self) -> float:
        """CPU time the server process has used so far, all its threads together."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.send("quit")
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()
