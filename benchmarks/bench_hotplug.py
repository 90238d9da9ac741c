"""Hotplug latency with the real kernel, and discovery cost on 1,000 recorded devices.

    python benchmarks/bench_hotplug.py [--quick]

Hotplug: a brand-new loop device is created with LOOP_CTL_ADD; the clock runs from the ioctl
returning to the spec file on disk (written atomically and fsynced) containing the device, and
from LOOP_CTL_REMOVE returning to the entry gone. The pipeline is the agent's: the kernel
netlink monitor, :class:`~cdi_gen.discovery.inventory.Discovery`, the writer. A second loop
device stays present throughout so that a removal rewrites the spec rather than deleting the
file. The
ioctls run on the event loop, as a blocking call would: the uevent waits in the socket until
it returns, so nothing before the clock starts is hidden.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _table import Row, best_ms, percentile, print_table

from cdi_gen.cdi.codec import dump_document
from cdi_gen.cdi.specnames import spec_filename
from cdi_gen.cdi.writer import sync_spec
from cdi_gen.config.loader import load_config, parse_config
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.model import DeviceRecord
from cdi_gen.sources.records import record_from_json, records_from_export_db
from cdi_gen.sources.udev import UdevWatcher, enumerate_records
from tests.loopdev import add_loop, free_loop_numbers, remove_loop

HERE = Path(__file__).resolve().parent

DATA = HERE.parent / "tests" / "data" / "udev"


# Complexity exception (C901, PLR0915): one measured scenario, read top to bottom; split up,
# what runs inside the timed window would no longer be visible.
async def _hotplug(cycles: int) -> list[Row]:  # noqa: C901, PLR0915
    keep, probe = free_loop_numbers(2)
    config = parse_config(
        {
            "vendor": "example.com",
            "classes": [
                {
                    "name": "loop",
                    "match": {"subsystem": "block", "kernel": f"loop{keep}|loop{probe}"},
                }
            ],
        },
        "bench",
    )
    spec_dir = Path(tempfile.mkdtemp(prefix="cg-bench-"))
    spec_path = spec_dir / spec_filename("example.com", "loop")
    probe_name = f"loop{probe}"
    discovery = Discovery(config)
    watcher = UdevWatcher(
        source="kernel",
        subsystems=discovery.subsystems,
        interest=discovery.interest,
        wants=discovery.wants,
    )
    written = asyncio.Event()
    fd = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    created: set[int] = set()

    async def follow() -> None:
        async for batch in watcher.batches():
            changes = (discovery.replace if batch.full else discovery.apply)(batch.records)
            if changes:
                write()
                written.set()

    def write() -> None:
        doc = discovery.class_spec("loop").document
        data = None if doc is None else dump_document(doc)
        sync_spec(spec_dir, "example.com", "loop", data)

    def names_on_disk() -> list[str]:
        return [d["name"] for d in json.loads(spec_path.read_bytes())["devices"]]

    adds: list[float] = []
    removes: list[float] = []
    remove_ioctl: list[float] = []
    task: asyncio.Task[None] | None = None
    try:
        add_loop(keep, fd)
        created.add(keep)
        discovery.replace(watcher.start())
        write()
        task = asyncio.create_task(follow())
        await asyncio.sleep(0)
        for _ in range(cycles):
            written.clear()
            add_loop(probe, fd)
            start = time.perf_counter()
            created.add(probe)
            while True:
                await asyncio.wait_for(written.wait(), 5)
                written.clear()
                if probe_name in names_on_disk():
                    break
            adds.append((time.perf_counter() - start) * 1e3)
            before = time.perf_counter()
            remove_loop(probe, fd)
            start = time.perf_counter()
            remove_ioctl.append((start - before) * 1e3)
            created.discard(probe)
            while True:
                await asyncio.wait_for(written.wait(), 5)
                written.clear()
                if probe_name not in names_on_disk():
                    break
            removes.append((time.perf_counter() - start) * 1e3)
    finally:
        watcher.close()
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 5)
        for n in created:
            with contextlib.suppress(OSError):
                remove_loop(n, fd)
        os.close(fd)
        shutil.rmtree(spec_dir, ignore_errors=True)
    label = f"{cycles} cycles"
    return [
        (f"hotplug add → spec on disk p50 ({label})", f"{percentile(adds, 50):.2f} ms", ""),
        (f"hotplug add → spec on disk p99 ({label})", f"{percentile(adds, 99):.2f} ms", "≤ 50 ms"),
        (f"hotplug remove → entry gone p50 ({label})", f"{percentile(removes, 50):.2f} ms", ""),
        (
            f"hotplug remove → entry gone p99 ({label})",
            f"{percentile(removes, 99):.2f} ms",
            "≤ 50 ms",
        ),
        (
            "LOOP_CTL_REMOVE ioctl itself p50 (kernel)",
            f"{percentile(remove_ioctl, 50):.1f} ms",
            "info",
        ),
    ]


def _thousand_records() -> list[DeviceRecord]:
    """1,000 records shaped like the recorded ones: this VM's and the hardware fixture."""
    base = records_from_export_db((DATA / "export-db-vm.txt").read_text())
    base += [record_from_json(r) for r in json.loads((DATA / "hardware.json").read_text())]
    out: list[DeviceRecord] = []
    i = 0
    while len(out) < 1000:
        for r in base:
            if len(out) == 1000:
                break
            suffix = f"x{i}"
            out.append(
                dataclasses.replace(
                    r, sys_path=f"{r.sys_path}{suffix}", sys_name=f"{r.sys_name}{suffix}"
                )
                if i
                else r
            )
        i += 1
    return out


def _discovery_cost(quick: bool) -> list[Row]:
    repeat = 3 if quick else 10
    records = _thousand_records()
    catalogue = load_config(None)

    def full() -> None:
        d = Discovery(catalogue)
        d.replace(records)
        for cls in d.class_names:
            d.class_spec(cls)

    loops = [
        DeviceRecord(
            sys_path=f"/sys/devices/virtual/block/loop{n}",
            subsystem="block",
            sys_name=f"loop{n}",
            sys_number=str(n),
            devnode=f"/dev/loop{n}",
            devtype="disk",
            major=7,
            minor=n,
            properties={"DEVTYPE": "disk"},
        )
        for n in range(1000)
    ]
    big = Discovery(catalogue, ["loop"])
    big.replace(loops)
    counter = iter(range(10_000, 1_000_000))

    def one_event() -> None:
        n = next(counter)
        big.apply([dataclasses.replace(loops[0], sys_path=f"/x/loop{n}", sys_name=f"loop{n}")])

    machine = best_ms(enumerate_records, repeat)
    count = len(enumerate_records())
    narrow = Discovery(catalogue)

    def for_catalogue() -> None:
        enumerate_records(
            subsystems=narrow.subsystems, interest=narrow.interest, wants=narrow.wants
        )

    return [
        (
            "match + name + spec, 1,000 recorded devices, catalogue",
            f"{best_ms(full, repeat):.1f} ms",
            "≤ 100 ms",
        ),
        (
            "one event in a class of 1,000 devices",
            f"{best_ms(one_event, repeat):.2f} ms",
            "≤ 20 ms",
        ),
        (f"enumerate this machine ({count} devices with a node)", f"{machine:.1f} ms", "info"),
        (
            "enumerate this machine, catalogue subsystems only",
            f"{best_ms(for_catalogue, repeat):.1f} ms",
            "info",
        ),
    ]


def run(quick: bool = False) -> list[Row]:
    """Measure; return rows of (metric, measured value, target)."""
    rows = _discovery_cost(quick)
    if os.geteuid() != 0 or not os.path.exists("/dev/loop-control"):
        return [*rows, ("hotplug latency", "skipped: needs root and /dev/loop-control", "")]
    return asyncio.run(_hotplug(20 if quick else 100)) + rows


if __name__ == "__main__":
    print_table("hotplug", run(quick="--quick" in sys.argv[1:]))
