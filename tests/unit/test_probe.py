"""``cdi-gen probe`` against the agent's endpoints on a real unix socket: the answer and exit
code a kubelet's exec probe sees, nothing answering, an answer that is not HTTP, and the
socket's place, which the server takes only from a socket it may replace."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cdi_gen.metrics import Metrics, serve_http_unix


class _Readiness:
    """What the served ``/readyz`` says: changed by the test."""

    def __init__(self) -> None:
        self.answer = (False, "waiting for example.com/loop (not registered)")

    def __call__(self) -> tuple[bool, str]:
        return self.answer


@pytest.fixture
async def served(short_dir: Path) -> AsyncIterator[tuple[Path, _Readiness]]:
    path, readiness = short_dir / "probe.sock", _Readiness()
    server = await serve_http_unix(path, Metrics(), readiness)
    try:
        yield path, readiness
    finally:
        server.close()
        await server.wait_closed()


async def _probe(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a kubelet's exec probe runs it, in a process of its own."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "cdi_gen", "probe", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


async def test_it_exits_0_only_when_the_agent_is_ready(
    served: tuple[Path, _Readiness],
) -> None:
    path, readiness = served
    waiting = await _probe("--socket", str(path))
    assert (waiting.returncode, waiting.stdout) == (
        1,
        "waiting for example.com/loop (not registered)\n",
    )
    readiness.answer = (True, "ready")
    ready = await _probe("--socket", str(path))
    assert (ready.returncode, ready.stdout, ready.stderr) == (0, "ready\n", "")


async def test_live_asks_healthz_and_the_socket_comes_from_the_variable(
    served: tuple[Path, _Readiness],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, _ = served
    monkeypatch.setenv("CDI_GEN_PROBE_SOCKET", str(path))
    alive = await _probe("--live")
    assert (alive.returncode, alive.stdout) == (0, "ok\n")


async def test_nothing_answering_is_one_line_and_exit_1(short_dir: Path) -> None:
    path = short_dir / "none.sock"
    proc = await _probe("--socket", str(path))
    assert proc.returncode == 1
    assert proc.stderr == f"error: cannot ask the agent at {path}: No such file or directory\n"


async def test_an_answer_that_is_not_http_is_quoted(short_dir: Path) -> None:
    path = short_dir / "odd.sock"

    async def odd(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-something\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(odd, path)
    async with server:
        proc = await _probe("--socket", str(path))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: the agent at {path} answered /readyz with no HTTP: ")
    assert "SSH-2.0-something" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


async def test_a_socket_left_behind_is_replaced_anything_else_is_refused(short_dir: Path) -> None:
    # The pod's previous container left its socket in the emptyDir: the new agent takes
    # the place.
    stale = short_dir / "stale.sock"
    first = await serve_http_unix(stale, Metrics(), lambda: (True, "ready"))
    first.close()
    await first.wait_closed()
    assert stale.is_socket()
    second = await serve_http_unix(stale, Metrics(), lambda: (True, "ready"))
    async with second:
        proc = await _probe("--socket", str(stale))
    assert (proc.returncode, proc.stdout) == (0, "ready\n")

    kept = short_dir / "kept"
    kept.write_text("not ours")
    with pytest.raises(FileExistsError, match="exists and is not a socket"):
        await serve_http_unix(kept, Metrics(), lambda: (True, "ready"))
    assert kept.read_text() == "not ours"
