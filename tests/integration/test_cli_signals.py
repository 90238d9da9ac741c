"""`cdi-gen run` as a process under a hostile launcher: any umask, and SIGHUP.

The umask must not change what cdi-gen creates (spec folder 0755, spec files 0644, plugin
sockets 0600), and SIGHUP stops the agent as cleanly as SIGTERM: sockets removed, specs
removed with --cleanup-on-exit, exit 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
from pathlib import Path

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.ports import free_port
from tests.waiting import until

pytestmark = pytest.mark.timeout(90)

CONFIG = """
vendor: example.com
classes:
  - name: loop
    match: {subsystem: block, kernel: "loop[0-7]"}
"""


async def _ready(port: int) -> bool:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
    data = await reader.read()
    writer.close()
    return data.startswith(b"HTTP/1.1 200")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("mask", [0o000, 0o077])
async def test_modes_ignore_the_umask_and_sighup_stops_cleanly(short_dir: Path, mask: int) -> None:
    config = short_dir / "config.yaml"
    config.write_text(CONFIG)
    port = free_port()
    spec_root = short_dir / "run"  # neither it nor cdi/ exists: the agent creates both
    spec_dir = spec_root / "cdi"
    plugin_dir = short_dir / "dp"
    env = {
        **os.environ,
        "CDI_GEN_CONFIG": str(config),
        "CDI_GEN_SPEC_DIR": str(spec_dir),
        "CDI_GEN_DEVICE_PLUGIN_DIR": str(plugin_dir),
        "CDI_GEN_UDEV_SOURCE": "kernel",
        "CDI_GEN_METRICS_ADDRESS": f"127.0.0.1:{port}",
        "CDI_GEN_CLEANUP_ON_EXIT": "1",
    }
    sock = plugin_dir / "example.com-loop.sock"
    spec = spec_dir / "example.com-loop.json"
    async with FakeKubelet(plugin_dir) as kubelet:
        # The umask is set by the child itself, then it becomes the agent: a preexec_fn runs
        # Python between fork and exec while this process's gRPC threads hold locks, which
        # once aborted the child (SIGABRT) before it could exec.
        umask_then_run = (
            f"import os, sys; os.umask({mask}); "
            "os.execv(sys.executable, [sys.executable, '-m', 'cdi_gen', 'run'])"
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            umask_then_run,
            env=env,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await kubelet.next_registration(within=20)
            await until(lambda: _ready(port), "/readyz answering 200", within=20)
            assert _mode(spec_root) == 0o755
            assert _mode(spec_dir) == 0o755
            assert _mode(spec) == 0o644
            assert stat.S_ISSOCK(os.lstat(sock).st_mode)
            assert _mode(sock) == 0o600
        finally:
            proc.send_signal(signal.SIGHUP)
            _, stderr = await asyncio.wait_for(proc.communicate(), 20)
    text = stderr.decode()
    assert proc.returncode == 0, text
    assert "Traceback" not in text
    assert not sock.exists()
    assert not spec.exists()
    assert "spec removed on exit" in text
    assert "stopped" in text
