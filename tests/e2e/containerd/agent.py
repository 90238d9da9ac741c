"""``cdi-gen run`` as a DaemonSet would run it, with a fake kubelet in its plugin folder.

The agent is a real subprocess of this checkout (``python -m cdi_gen run``) with a test config
for one loop class, the daemon's spec folder and a private device-plugin folder in which
``tests/fakes/kubelet.py`` serves Registration. Stopped by PID with SIGTERM, as the kubelet's
pod lifecycle would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from fakes.kubelet import ConnectedPlugin, FakeKubelet
from processes import terminate

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2

VENDOR = "example.com"
CLASS = "loop"
RESOURCE = f"{VENDOR}/{CLASS}"


def agent_config(kernels: Sequence[str]) -> str:
    """One class of whole loop disks with exactly these kernel names (or globs).

    Exact names keep other suites' loop devices (same number range, same time) out of our
    spec and ListAndWatch. The env shows the class and which node was injected. JSON is YAML.
    """
    cls = {
        "name": CLASS,
        "match": [
            {"subsystem": "block", "kernel": k, "properties": {"DEVTYPE": "disk"}} for k in kernels
        ],
        "deviceName": "{kernel}",
        "containerEdits": {"env": ["CDI_GEN_CLASS={class}", "CDI_GEN_DEVNODE={devnode}"]},
    }
    return json.dumps({"vendor": VENDOR, "classes": [cls]}, indent=2) + "\n"


@dataclass
class RunningAgent:
    process: subprocess.Popen[bytes]
    log_path: Path
    spec_dir: Path
    kubelet: FakeKubelet
    connection: ConnectedPlugin

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait_for_devices(
        self, present: Sequence[str] = (), absent: Sequence[str] = (), within: float = 10.0
    ) -> dict[str, api_pb2.Device]:
        """Read ListAndWatch until ``present`` are all in it and ``absent`` all out of it."""
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"ListAndWatch never had {present} without {absent}")
            devices = await self.connection.next_devices(within=left)
            if all(p in devices for p in present) and not any(a in devices for a in absent):
                return devices

    async def allocate(self, *ids: str) -> api_pb2.ContainerAllocateResponse:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        )
        reply = await self.connection.stub.Allocate(request, timeout=10)
        return reply.container_responses[0]


def spawn_agent(
    config: Path,
    spec_dirs: Sequence[Path],
    plugin_dir: Path,
    log_path: Path,
    extra_args: Sequence[str],
) -> subprocess.Popen[bytes]:
    # Allocate checks names against exactly the folders containerd reads; no metrics port,
    # so parallel agents (other suites, the benchmark) never collide on :9400.
    runtime_dirs = [arg for d in spec_dirs for arg in ("--runtime-spec-dir", str(d))]
    # Appended: an agent restarted on the same log keeps what its first run said.
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [
                sys.executable, "-m", "cdi_gen", "run",
                "--config", str(config),
                "--spec-dir", str(spec_dirs[-1]),
                *runtime_dirs,
                "--device-plugin-dir", str(plugin_dir),
                "--metrics-address", "",
                "--udev-source", "kernel",
                "--log-level", "debug",
                *extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip


@contextlib.asynccontextmanager
async def run_agent(
    work: Path, spec_dirs: Sequence[Path], kernels: Sequence[str], *extra_args: str
) -> AsyncIterator[RunningAgent]:
    """Start the fake kubelet, then ``cdi-gen run`` writing into the last of ``spec_dirs``
    (the runtime's folders, lowest priority first); wait for its registration."""
    plugin_dir = work / "dp"
    config = work / "agent.yaml"
    config.write_text(agent_config(kernels))
    log_path = work / "agent.log"
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    process = None
    try:
        process = spawn_agent(config, spec_dirs, plugin_dir, log_path, extra_args)
        try:
            connection = await kubelet.next_registration(within=15)
        except TimeoutError:
            raise AssertionError(
                f"cdi-gen run did not register within 15 s (exit {process.poll()}):\n"
                + log_path.read_text(errors="replace")
            ) from None
        yield RunningAgent(process, log_path, spec_dirs[-1], kubelet, connection)
    finally:
        if process is not None:
            await asyncio.to_thread(terminate, process)
        await kubelet.stop()
