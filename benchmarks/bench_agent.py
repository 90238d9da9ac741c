"""The node agent as a whole: start to first Register, memory with 1,000 devices, and the
end-to-end hotplug latency from the kernel event to the ListAndWatch message.

    python benchmarks/bench_agent.py [--quick]

Start-up runs the real ``cdi-gen run`` process against a fake kubelet (a real Registration
gRPC server) and times process spawn → RegisterRequest received. Memory runs the agent in a
child process on 5 classes and 1,000 recorded devices (``_recorded.py``: udev replaced by the
records, all else real: specs written, 5 plugins serving) and reads its VmRSS/VmHWM. Hotplug
creates loop devices with LOOP_CTL_ADD and times the ioctl returning → the fake kubelet receiving a
ListAndWatch list that holds the device (spec written first, by the agent's invariant).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _table import Row, cli_env, percentile

from tests.loopdev import add_loop, free_loop_numbers, remove_loop

CONFIG = """
vendor: example.com
classes:
  - name: loop
    match: {subsystem: block, kernel: "loop[5-9][0-9][0-9]"}
"""


async def _startup(rounds: int) -> list[float]:
    from tests.fakes.kubelet import FakeKubelet

    samples = []
    for _ in range(rounds):
        tmp = Path(tempfile.mkdtemp(dir="/tmp", prefix="cgb"))
        try:
            (tmp / "config.yaml").write_text(CONFIG)
            async with FakeKubelet(tmp / "dp") as kubelet:
                start = time.perf_counter()
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "cdi_gen",
                    "run",
                    "--config",
                    str(tmp / "config.yaml"),
                    "--spec-dir",
                    str(tmp / "cdi"),
                    "--device-plugin-dir",
                    str(tmp / "dp"),
                    "--udev-source",
                    "kernel",
                    "--metrics-address",
                    "",
                    stderr=asyncio.subprocess.DEVNULL,
                    env=cli_env(),
                )
                try:
                    await kubelet.next_registration(within=20)
                    samples.append((time.perf_counter() - start) * 1e3)
                finally:
                    proc.terminate()
                    await proc.wait()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return samples


MEMORY_CHILD = r"""
import asyncio, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from _recorded import RecordedSource, config_data, records
from cdi_gen.agent import Agent
from cdi_gen.config.settings import Settings
from cdi_gen.config.loader import parse_config

config = parse_config(config_data(), "bench")
tmp = Path(tempfile.mkdtemp(dir="/tmp", prefix="cgm"))

async def main():
    settings = Settings(spec_dir=tmp / "cdi", device_plugin_dir=tmp / "dp", metrics_address=None)
    agent = Agent(config, settings, source=RecordedSource(records()))
    task = asyncio.create_task(agent.run())
    await agent.started.wait()
    await asyncio.sleep(0.5)
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    advertised = sum(len(r.board.devices) for r in agent.runners.values())
    print(status["VmRSS"].split()[0], status["VmHWM"].split()[0], advertised, flush=True)
    agent.stop()
    await task

asyncio.run(main())
"""


def _memory() -> tuple[float, float, int]:
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, str(Path(__file__).resolve().parent)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return int(out[0]) / 1024, int(out[1]) / 1024, int(out[2])


async def _hotplug(cycles: int) -> list[float]:
    import yaml

    from cdi_gen.agent import Agent
    from cdi_gen.config.loader import parse_config
    from cdi_gen.config.settings import Settings
    from tests.fakes.kubelet import FakeKubelet

    tmp = Path(tempfile.mkdtemp(dir="/tmp", prefix="cgh"))
    config = parse_config(yaml.safe_load(CONFIG), "bench")
    settings = Settings(
        spec_dir=tmp / "cdi",
        device_plugin_dir=tmp / "dp",
        udev_source="kernel",
        metrics_address=None,
    )
    agent = Agent(config, settings)
    samples: list[float] = []
    numbers = free_loop_numbers(cycles, 500, 999)
    try:
        async with FakeKubelet(tmp / "dp") as kubelet:
            task = asyncio.create_task(agent.run())
            plugin = await kubelet.next_registration(within=20)
            await plugin.next_devices()
            for n in numbers:
                name = f"loop{n}"
                start = time.perf_counter()
                add_loop(n)
                while name not in await plugin.next_devices(within=5):
                    pass
                samples.append((time.perf_counter() - start) * 1e3)
                remove_loop(n)
                while name in await plugin.next_devices(within=5):
                    pass
            agent.stop()
            await task
    finally:
        for n in numbers:
            with contextlib.suppress(OSError):
                remove_loop(n)
        shutil.rmtree(tmp, ignore_errors=True)
    return samples


def run(quick: bool = False) -> list[Row]:
    rows: list[Row] = []
    start = asyncio.run(_startup(2 if quick else 5))
    rows.append(
        (
            "start -> first Register (p50 / max)",
            f"{percentile(start, 50):.0f} / {max(start):.0f} ms",
            "<= 1000 ms",
        )
    )
    rss, hwm, advertised = _memory()
    rows.append(
        (
            f"resident memory, 5 classes, {advertised} devices",
            f"{rss:.1f} MiB (peak {hwm:.1f})",
            "<= 60 MiB",
        )
    )
    if os.geteuid() == 0 and Path("/dev/loop-control").exists():
        lat = asyncio.run(_hotplug(10 if quick else 50))
        rows.append(
            (
                f"kernel add -> ListAndWatch p50 / p99 ({len(lat)} cycles)",
                f"{percentile(lat, 50):.1f} / {percentile(lat, 99):.1f} ms",
                "p99 <= 50 ms",
            )
        )
    else:
        rows.append(("kernel add -> ListAndWatch", "needs root and /dev/loop-control", "-"))
    return rows


if __name__ == "__main__":
    from _table import print_table

    print_table("agent", run("--quick" in sys.argv))
