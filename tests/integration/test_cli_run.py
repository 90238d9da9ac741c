"""`cdi-gen run` as a process: env-var flags, registration with a fake kubelet, readiness,
SIGTERM → sockets removed, exit 0; a bad config exits 2 without a traceback."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import orjson
import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.ports import free_port
from tests.waiting import until

pytestmark = pytest.mark.timeout(60)

CONFIG = """
vendor: example.com
classes:
  - name: loop
    match: {subsystem: block, kernel: "loop[0-7]"}
"""


async def _get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = (await reader.read()).decode()
    writer.close()
    return int(data.split()[1]), data.split("\r\n\r\n", 1)[1]


async def test_run_registers_reports_ready_and_stops_on_sigterm(short_dir: Path) -> None:
    config = short_dir / "config.yaml"
    config.write_text(CONFIG)
    port = free_port()
    env = {
        **os.environ,
        "CDI_GEN_CONFIG": str(config),
        "CDI_GEN_SPEC_DIR": str(short_dir / "cdi"),
        "CDI_GEN_DEVICE_PLUGIN_DIR": str(short_dir / "dp"),
        "CDI_GEN_UDEV_SOURCE": "kernel",
        "CDI_GEN_METRICS_ADDRESS": f"127.0.0.1:{port}",
        "CDI_GEN_LOG_FORMAT": "json",
    }
    async with FakeKubelet(short_dir / "dp") as kubelet:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cdi_gen", "run", env=env, stderr=asyncio.subprocess.PIPE
        )
        try:
            plugin = await kubelet.next_registration(within=20)
            assert plugin.request.resource_name == "example.com/loop"
            devices = await plugin.next_devices()
            assert {f"loop{i}" for i in range(8)} <= set(devices)

            async def ready() -> str | None:
                status, body = await _get(port, "/readyz")
                return body if status == 200 else None

            body = await until(ready, "/readyz answering 200")
            assert body.strip() == "ready"
            assert (await _get(port, "/healthz"))[0] == 200
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 0, stderr.decode()
    assert not (short_dir / "dp" / "example.com-loop.sock").exists()
    assert (short_dir / "cdi" / "example.com-loop.json").exists()
    lines = stderr.decode().splitlines()
    assert any('"msg":"spec written"' in line for line in lines), lines


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "vendor: example.com\nclasses:\n  - name: loop\n    match: {kernal: loop1}\n",
            "classes[0].match: unknown key 'kernal'",
        ),
        ("vendor: x\nclasses: []\n", "vendor"),
    ],
)
def test_run_bad_config_exits_2(short_dir: Path, text: str, message: str) -> None:
    import subprocess

    config = short_dir / "bad.yaml"
    config.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "cdi_gen", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{config}: {message}" in proc.stderr
    assert "Traceback" not in proc.stderr


RUNTIME_PIN_CONFIG = """
vendor: example.com
classes:
  - name: loop
    match: {subsystem: block, kernel: "loop[0-7]"}
  - name: gids
    match: {subsystem: block, kernel: "loop[0-7]"}
    containerEdits: {additionalGids: [44]}
"""


async def test_run_pins_the_runtime_limit_and_serves_the_classes_that_fit(
    short_dir: Path,
) -> None:
    """--cdi-version runtime with podman 4.3.1 (reads <= 0.5.0): loop's spec is written as
    0.5.0 and served; gids needs 0.7.0 (additionalGids), so it is refused with the field-level
    error and written nowhere, and the agent carries on."""
    config = short_dir / "config.yaml"
    config.write_text(RUNTIME_PIN_CONFIG)
    env = {
        **os.environ,
        "CDI_GEN_CONFIG": str(config),
        "CDI_GEN_SPEC_DIR": str(short_dir / "cdi"),
        "CDI_GEN_DEVICE_PLUGIN_DIR": str(short_dir / "dp"),
        "CDI_GEN_UDEV_SOURCE": "kernel",
        "CDI_GEN_METRICS_ADDRESS": f"127.0.0.1:{free_port()}",
        "CDI_GEN_CDI_VERSION": "runtime",
        "CDI_GEN_RUNTIME": "podman@4.3.1",
    }
    async with FakeKubelet(short_dir / "dp") as kubelet:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cdi_gen", "run", env=env, stderr=asyncio.subprocess.PIPE
        )
        try:
            plugins = {}
            while len(plugins) < 2:
                plugin = await kubelet.next_registration(within=20)
                plugins[plugin.request.resource_name] = plugin
            assert set(await plugins["example.com/loop"].next_devices()) >= {"loop0", "loop7"}
            # Every device of gids is refused, so it advertises none, and the agent runs on.
            assert await plugins["example.com/gids"].next_devices() == {}
            spec = orjson.loads((short_dir / "cdi" / "example.com-loop.json").read_bytes())
            assert spec["cdiVersion"] == "0.5.0"
            assert proc.returncode is None, "the agent stopped"
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 0, stderr.decode()
    assert not (short_dir / "cdi" / "example.com-gids.json").exists()
    text = stderr.decode()
    assert "additionalGids needs cdiVersion 0.7.0 or newer, the target is 0.5.0" in text, text


@pytest.mark.parametrize("value", ["1e-9", "0", "-1", "0.0999", "nan", "inf", "1e300"])
def test_run_refuses_a_retry_wait_that_would_storm_or_stall(short_dir: Path, value: str) -> None:
    """CDI_GEN_RETRY_MAX_SECONDS=1e-9 made 46,765 start attempts in 2 s: a bound outside
    0.1 s to an hour exits 2 before anything starts, naming the variable and the value."""
    import subprocess

    config = short_dir / "config.yaml"
    config.write_text(CONFIG)
    env = {**os.environ, "CDI_GEN_CONFIG": str(config), "CDI_GEN_RETRY_MAX_SECONDS": value}
    proc = subprocess.run(
        [sys.executable, "-m", "cdi_gen", "run", "--spec-dir", str(short_dir / "cdi")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "CDI_GEN_RETRY_MAX_SECONDS" in line]
    assert f"(got {value!r})" in line, line
    assert "Traceback" not in proc.stderr
    assert not (short_dir / "cdi").exists()


# Sets the host name in the new UTS namespace, then runs the real command line.
_WITH_HOST_NAME = (
    "import os, socket, sys; socket.sethostname(sys.argv[1]); "
    "os.execv(sys.executable, [sys.executable, '-m', 'cdi_gen', *sys.argv[2:]])"
)


def test_run_with_dra_on_a_host_name_that_is_no_node_name_exits_2(short_dir: Path) -> None:
    """Issue 38, item 10: on a host named Bad_Host.Example the DRA agent published slices the
    API server refused, for ever. In a UTS namespace of its own (a real host name, not a
    patched call) `run --api dra` exits 2 with one line before it writes anything."""
    import shutil
    import subprocess

    assert shutil.which("unshare"), "unshare is needed for this test (util-linux)"
    config = short_dir / "config.yaml"
    config.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDI_GEN_")}
    command = ["unshare", "--uts", sys.executable, "-c", _WITH_HOST_NAME, "Bad_Host.Example"]
    command += ["run", "--api", "dra", "--config", str(config)]
    command += ["--spec-dir", str(short_dir / "cdi"), "--state-dir", str(short_dir / "state")]
    proc = subprocess.run(
        [*command, "--metrics-address", ""],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: host name: 'Bad_Host.Example' (lower-cased and trimmed: 'bad_host.example') "
        "is not a Kubernetes Node name: a DNS subdomain: at most 253 characters of lower-case "
        "letters, digits, '-' and '.', each dot-separated part starting and ending with a "
        "letter or digit; give the Node's name with --node-name (CDI_GEN_NODE_NAME)"
    ], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (short_dir / "cdi").exists() and not (short_dir / "state").exists()
