"""udev discovery against the real kernel: brand-new loop devices, real uevents, real spec files.

Loop devices are created and removed through /dev/loop-control (numbers 300-999, clear of the
machine's loop0-7 and of the 200-299 range the e2e tests use), with the kernel netlink source
and with a udevd this test starts itself. Each test follows the events the way the agent does
(batches → Discovery → writer) and asserts the spec folder follows the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Literal

import orjson
import pytest
from loopdev import LoopDevices

from cdi_gen.cdi.codec import dump_document
from cdi_gen.cdi.specnames import spec_filename
from cdi_gen.cdi.writer import sync_spec
from cdi_gen.config.loader import parse_config
from cdi_gen.config.models import AgentConfig
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.sources import RecordBatch
from cdi_gen.sources.udev import UDEV_RUN_DIR, UdevWatcher, enumerate_records, udevd_running
from tests.waiting import until, until_sync

pytestmark = pytest.mark.kernel

UDEVD = Path("/lib/systemd/systemd-udevd")
TIMEOUT = 5.0


@pytest.fixture
def udevd() -> Iterator[None]:
    """A udevd for the test, started here unless one already runs; stopped if started here."""
    if udevd_running():
        yield
        return
    if not UDEVD.exists():
        pytest.fail(f"{UDEVD} is missing: install it with `apt-get install -y udev` (CI does)")
    had_run_dir = UDEV_RUN_DIR.exists()
    proc = subprocess.Popen([str(UDEVD)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def pinged() -> bool:
            ping = ["udevadm", "control", "--ping"]
            return subprocess.run(ping, capture_output=True, check=False).returncode == 0

        until_sync(lambda: proc.poll() is not None or pinged(), "systemd-udevd up", every=0.02)
        assert proc.poll() is None, f"systemd-udevd exited {proc.returncode}"
        yield
    finally:
        subprocess.run(["udevadm", "control", "--exit"], capture_output=True, check=False)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not had_run_dir:
            # /run/udev outlives udevd; leave the machine as we found it.
            shutil.rmtree(UDEV_RUN_DIR, ignore_errors=True)


def _config(numbers: list[int]) -> AgentConfig:
    kernel = "|".join(f"loop{n}" for n in numbers)
    return parse_config(
        {
            "vendor": "example.com",
            "classes": [
                {
                    "name": "loop",
                    "match": {"subsystem": "block", "kernel": kernel},
                    "containerEdits": {"env": ["LOOP={name}"]},
                }
            ],
        },
        "test",
    )


class Follower:
    """The agent's loop in miniature: udev batches → Discovery → spec folder."""

    def __init__(self, config: AgentConfig, spec_dir: Path, source: Literal["udev", "kernel"]):
        self.discovery = Discovery(config)
        self.spec_dir = spec_dir
        self.watcher = UdevWatcher(
            source=source,
            subsystems=self.discovery.subsystems,
            interest=self.discovery.interest,
            wants=self.discovery.wants,
        )
        self.batches: list[RecordBatch] = []
        self._task: asyncio.Task[None] | None = None

    def _sync(self) -> None:
        for cls in self.discovery.class_names:
            doc = self.discovery.class_spec(cls).document
            data = None if doc is None else dump_document(doc)
            sync_spec(self.spec_dir, self.discovery.config.vendor, cls, data)

    async def _run(self) -> None:
        async for batch in self.watcher.batches():
            self.batches.append(batch)
            if batch.full:
                changes = self.discovery.replace(batch.records)
            else:
                changes = self.discovery.apply(batch.records)
            if changes:
                self._sync()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Follower]:
        self.discovery.replace(self.watcher.start())
        self._sync()
        self._task = asyncio.create_task(self._run())
        try:
            yield self
        finally:
            self.watcher.close()
            await asyncio.wait_for(self._task, TIMEOUT)

    def spec_names(self) -> list[str]:
        path = self.spec_dir / spec_filename("example.com", "loop")
        try:
            doc = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return []
        return [d["name"] for d in doc["devices"]]


async def _follow_add_remove(
    loops: LoopDevices, tmp_path: Path, source: Literal["udev", "kernel"]
) -> Follower:
    a, b = loops.free_number(), loops.free_number()
    while b == a:
        b = loops.free_number()
    loops.add(a)  # present before start: found by the enumeration
    follower = Follower(_config([a, b]), tmp_path, source)
    async with follower.running():
        assert follower.watcher.source == source
        assert follower.spec_names() == [f"loop{a}"]
        loops.add(b)
        await until(
            lambda: follower.spec_names() == sorted([f"loop{a}", f"loop{b}"]),
            f"loop{b} in the spec",
            TIMEOUT,
        )
        devices = {d.name: d for d in follower.discovery.devices("loop")}
        node = devices[f"loop{b}"].nodes[0]
        st = os.stat(f"/dev/loop{b}")
        assert (node.major, node.minor) == (os.major(st.st_rdev), os.minor(st.st_rdev))
        assert devices[f"loop{b}"].healthy
        loops.remove(a)
        await until(
            lambda: follower.spec_names() == [f"loop{b}"], f"loop{a} gone from the spec", TIMEOUT
        )
        loops.remove(b)
        await until(
            lambda: not (tmp_path / spec_filename("example.com", "loop")).exists(),
            "the spec file removed with the last device",
            TIMEOUT,
        )
    return follower


async def test_kernel_source_follows_loop_hotplug(loops: LoopDevices, tmp_path: Path) -> None:
    follower = await _follow_add_remove(loops, tmp_path, "kernel")
    actions = [r.action for b in follower.batches for r in b.records]
    assert actions.count("add") == 1 and actions.count("remove") == 2


async def test_udev_source_follows_loop_hotplug(
    udevd: None, loops: LoopDevices, tmp_path: Path
) -> None:
    follower = await _follow_add_remove(loops, tmp_path, "udev")
    added = [r for b in follower.batches for r in b.records if r.action == "add"]
    # Processed by udevd, not raw kernel events: udevd stamps its own properties.
    assert added and "USEC_INITIALIZED" in added[0].properties


async def test_resync_enumerates_again(loops: LoopDevices, tmp_path: Path) -> None:
    n = loops.free_number()
    follower = Follower(_config([n]), tmp_path, "kernel")
    async with follower.running():
        loops.add(n)
        await until(lambda: follower.spec_names() == [f"loop{n}"], f"loop{n} in the spec", TIMEOUT)
        follower.watcher.request_resync()
        await until(lambda: any(b.full for b in follower.batches), "a full batch", TIMEOUT)
        full = next(b for b in follower.batches if b.full)
        assert f"loop{n}" in [r.sys_name for r in full.records]
        assert follower.spec_names() == [f"loop{n}"]
        loops.remove(n)
        await until(lambda: follower.spec_names() == [], f"loop{n} gone", TIMEOUT)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the real entry point (with its error → exit code mapping)."""
    from cdi_gen.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_cli_discover_and_write_see_a_new_loop(
    loops: LoopDevices, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = loops.free_number()
    loops.add(n)
    config = tmp_path / "config.yaml"
    config.write_text(
        "vendor: example.com\nclasses:\n"
        f"  - name: loop\n    match: {{subsystem: block, kernel: loop{n}}}\n"
    )
    code, out, err = _cli(capsys, "discover", "--config", str(config), "--json")
    assert code == 0, err
    (device,) = orjson.loads(out)["classes"]["loop"]["devices"]
    assert device["qualifiedName"] == f"example.com/loop=loop{n}"
    assert device["nodes"][0]["hostPath"] == f"/dev/loop{n}"
    spec_dir = tmp_path / "cdi"
    code, out, err = _cli(capsys, "write", "--config", str(config), "--spec-dir", str(spec_dir))
    assert code == 0, err
    written = orjson.loads((spec_dir / "example.com-loop.json").read_bytes())
    assert [d["name"] for d in written["devices"]] == [f"loop{n}"]
    loops.remove(n)
    code, out, err = _cli(capsys, "write", "--config", str(config), "--spec-dir", str(spec_dir))
    assert code == 0, err
    assert not (spec_dir / "example.com-loop.json").exists()
    code, out, err = _cli(capsys, "render", "--config", str(config), "--class", "loop")
    assert (code, out) == (1, "")
    assert err == (
        f"error: class 'loop' (example.com/loop) has no device: nothing matches "
        f'SUBSYSTEM=="block", KERNEL=="loop{n}"\n'
    )


async def test_overflow_recovers_by_enumeration(loops: LoopDevices, tmp_path: Path) -> None:
    """A storm overflows a tiny receive buffer (ENOBUFS): a full batch, then events again."""
    numbers = [loops.free_number() for _ in range(30)]
    numbers = sorted(set(numbers))
    follower = Follower(_config(numbers), tmp_path, "kernel")
    follower.watcher.receive_buffer = 1  # the kernel rounds it up to its minimum
    async with follower.running():
        for n in numbers:  # without yielding to the loop: nothing is read meanwhile
            loops.add(n)
        expected = sorted(f"loop{n}" for n in numbers)
        await until(lambda: follower.spec_names() == expected, "all devices in the spec", TIMEOUT)
        assert follower.watcher.receive_errors >= 1
        assert any(b.full for b in follower.batches)
        # The monitor works again after the overflow: a single remove is an ordinary event.
        # Another process's uevents (a suite beside this one) can overflow the tiny buffer
        # again; then the change came through a resync instead, and the next one is tried.
        for _ in range(5):
            loops.remove(numbers[0])
            await until(
                lambda: follower.spec_names() == expected[1:], f"loop{numbers[0]} gone", TIMEOUT
            )
            if not follower.batches[-1].full:
                break
            loops.add(numbers[0])
            await until(
                lambda: follower.spec_names() == expected, f"loop{numbers[0]} back", TIMEOUT
            )
        assert not follower.batches[-1].full, "five removals in a row came only by resync"


def test_every_device_has_the_numa_node_of_its_nearest_pci_device() -> None:
    # What the agent reads from this machine's sysfs, checked against the file itself: the
    # nearest PCI device's numa_node, -1 none (never a bridge's or a class device's).
    checked = 0
    for record in enumerate_records():
        chain = [(record.subsystem, record.sys_path)]
        chain += [(p.subsystem, p.sys_path) for p in record.parents]
        pci = next((path for subsystem, path in chain if subsystem == "pci"), None)
        if pci is None:
            continue
        node = int((Path(pci) / "numa_node").read_text())
        assert record.numa_node == (None if node < 0 else node), (record.sys_path, node)
        checked += 1
    assert checked, "this machine has no device node below a PCI device"


def test_a_loop_device_named_after_its_backing_file(
    loops: LoopDevices, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 55: a path-valued field made a name with |basename; the name follows the file.
    images = tmp_path / "images"
    images.mkdir()
    backing = images / "scratch-disk.img"
    backing.write_bytes(b"\0" * (1 << 20))
    dev = loops.add()
    loops.attach(dev, backing)
    config = tmp_path / "config.yaml"
    config.write_text(
        "vendor: example.com\nclasses:\n"
        "  - name: image\n"
        f"    match: {{subsystem: block, kernel: {dev.name}, "
        'attributes: {loop/backing_file: "?*"}}\n'
        '    deviceName: "{attribute[loop/backing_file]|basename}"\n'
        '    containerEdits: {env: ["IMAGE={attribute[loop/backing_file]}"]}\n'
    )
    spec_dir = tmp_path / "cdi"
    code, _, err = _cli(capsys, "write", "--config", str(config), "--spec-dir", str(spec_dir))
    assert (code, err) == (0, ""), err
    written = orjson.loads((spec_dir / "example.com-image.json").read_bytes())
    (device,) = written["devices"]
    assert device["name"] == "scratch-disk.img"
    assert device["containerEdits"]["env"] == [f"IMAGE={backing}"]
    assert device["containerEdits"]["deviceNodes"][0]["path"] == str(dev.path)
    # Detached, the device has no backing file: it leaves the class, and the spec goes.
    loops.detach(dev)
    code, _, err = _cli(capsys, "write", "--config", str(config), "--spec-dir", str(spec_dir))
    assert code == 0, err
    assert not (spec_dir / "example.com-image.json").exists()
