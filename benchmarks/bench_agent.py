"""The node agent as a whole: the end-to-end hotplug latency from the kernel event to the
ListAndWatch message. Its start-up, memory and idle CPU are bench_footprint's, against floors.

    python benchmarks/bench_agent.py [--quick]

Hotplug creates loop devices with LOOP_CTL_ADD and times the ioctl returning → the fake
kubelet receiving a ListAndWatch list that holds the device (spec written first, by the
agent's invariant).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _table import Row, percentile

from tests.loopdev import add_loop, free_loop_numbers, remove_loop

CONFIG = """
vendor: example.com
classes:
  - name: loop
    match: {subsystem: block, kernel: "loop[5-9][0-9][0-9]"}
"""


async def _hotplug(cycles: int) -> list[float]:
    import yaml

    from cdi_gen.agent.agent import Agent
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
