"""Brand-new loop devices through /dev/loop-control: real kernel add/remove uevents.

Shared by the integration and e2e tests and the benchmarks, so that every suite creates and
removes devices the same way: numbers from a range of its own (other suites run at the same
time), EBUSY retried on removal (udevd may still hold a new device open), and every device
removed again at the end, whatever happens.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import struct
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.waiting import until_sync

LOOP_CTL_ADD = 0x4C80
LOOP_CTL_REMOVE = 0x4C81
LOOP_SET_FD = 0x4C00
LOOP_CLR_FD = 0x4C01
LOOP_MAJOR = 7
#: A removal that reports the device is not there (any more).
_GONE = (errno.ENODEV, errno.ENXIO, errno.ENOENT)


def _control(request: int, number: int, fd: int | None = None) -> None:
    own = fd is None
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC) if fd is None else fd
    try:
        fcntl.ioctl(ctl, request, number)
    finally:
        if own:
            os.close(ctl)


def add_loop(number: int, fd: int | None = None) -> None:
    """LOOP_CTL_ADD: create /dev/loop<number> (EEXIST if it exists). ``fd``: an open
    /dev/loop-control, for callers timing the ioctl alone."""
    _control(LOOP_CTL_ADD, number, fd)


def remove_loop(number: int, fd: int | None = None, timeout: float = 5.0) -> None:
    """LOOP_CTL_REMOVE, retrying EBUSY for up to ``timeout`` s; a device already gone is fine."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _control(LOOP_CTL_REMOVE, number, fd)
            return
        except OSError as exc:
            if exc.errno in _GONE:
                return
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def free_loop_numbers(count: int, low: int = 300, high: int = 999) -> list[int]:
    """``count`` distinct numbers in [low, high] with no loop device now."""
    free = [n for n in range(low, high + 1) if not os.path.exists(f"/sys/block/loop{n}")]
    if len(free) < count:
        raise RuntimeError(f"only {len(free)} free loop numbers in {low}-{high}")
    return random.sample(free, count)


def partitioned_image(path: Path, sizes_mib: Sequence[int]) -> Path:
    """A sparse disk image at ``path`` with an MBR partition table of one Linux partition
    (type 0x83) per size in ``sizes_mib``, each starting on a MiB boundary."""
    start = 2048  # sectors of 512 bytes: the first partition at 1 MiB
    entries = b""
    for size in sizes_mib:
        count = size * 2048
        entries += struct.pack("<B3sB3sII", 0, b"\0" * 3, 0x83, b"\0" * 3, start, count)
        start += count
    mbr = bytearray(512)
    mbr[446 : 446 + len(entries)] = entries
    mbr[510:512] = b"\x55\xaa"
    with open(path, "wb") as f:
        f.write(mbr)
        f.truncate(start * 512)
    return path


def mbr_partitions(image: Path) -> list[tuple[int, int]]:
    """The (start, count) in sectors of each partition of ``image``'s MBR, in order."""
    with open(image, "rb") as f:
        mbr = f.read(512)
    entries = [struct.unpack_from("<B3sB3sII", mbr, 446 + 16 * i) for i in range(4)]
    return [(start, count) for _, _, kind, _, start, count in entries if kind]


@dataclass(frozen=True)
class LoopDevice:
    number: int

    @property
    def name(self) -> str:
        return f"loop{self.number}"

    @property
    def path(self) -> Path:
        return Path(f"/dev/loop{self.number}")

    def rdev(self) -> tuple[int, int]:
        """major:minor of the node as the host kernel reports it."""
        st = os.stat(self.path)
        return os.major(st.st_rdev), os.minor(st.st_rdev)


@dataclass
class LoopDevices:
    """Creates loop devices numbered ``low``-``high`` and guarantees their removal.

    Numbers start at a random point because other suites create loop devices at the same
    time; an existing number (EEXIST) is simply skipped. An agent under test matches every
    loop device of its range, so ranges that run side by side must not overlap: e2e 200-299,
    tests/integration/test_agent.py 300-399, the cluster tests 400-499,
    test_agent_failures.py 600-699, the other integration tests 700-999 (and the benchmarks,
    which run alone, 500-999).
    """

    low: int = 200
    high: int = 299
    created: list[LoopDevice] = field(default_factory=list)
    backing: dict[int, Path] = field(default_factory=dict)

    def reserve(self) -> LoopDevice:
        """A number that is free now, without creating the device (for hotplug tests)."""
        span = self.high - self.low + 1
        start = random.randrange(span)
        taken = {d.number for d in self.created}
        for i in range(span):
            number = self.low + (start + i) % span
            if number not in taken and not os.path.exists(f"/sys/block/loop{number}"):
                return LoopDevice(number)
        raise RuntimeError(f"no free loop number in {self.low}-{self.high}")

    def free_number(self) -> int:
        return self.reserve().number

    def add(self, device: LoopDevice | int | None = None) -> LoopDevice:
        """Create ``device`` (or any free one) and wait for its node."""
        wanted = LoopDevice(device) if isinstance(device, int) else device
        for _ in range(20):
            dev = wanted or self.reserve()
            try:
                add_loop(dev.number)
            except OSError as exc:
                if exc.errno == errno.EEXIST and wanted is None:
                    continue
                raise
            self.created.append(dev)
            until_sync(dev.path.exists, f"{dev.path} to appear", within=5.0, every=0.005)
            return dev
        raise RuntimeError("could not create a loop device")

    def attach(self, dev: LoopDevice, backing_file: Path) -> None:
        """Bind a backing file so that reads from the device return its content."""
        with open(backing_file, "rb+") as f, open(dev.path, "rb") as d:
            fcntl.ioctl(d.fileno(), LOOP_SET_FD, f.fileno())
        self.backing[dev.number] = backing_file

    def attach_partitioned(self, dev: LoopDevice, image: Path) -> int:
        """Bind ``image`` with partitions allowed (``losetup -P``), make sure the kernel has
        the partitions of its MBR, wait for their nodes (``loop<N>p1`` on); how many.

        A kernel built without partition table parsers (this test VM's has none) scans and
        finds nothing; the partitions are then added as the table gives them, with
        ``addpart`` (the BLKPG ioctl), which needs no parser."""
        subprocess.run(
            ["losetup", "-P", str(dev.path), str(image)], check=True, capture_output=True
        )
        self.backing[dev.number] = image
        table = mbr_partitions(image)
        for n, (start, count) in enumerate(table, 1):
            if not Path(f"/sys/block/{dev.name}/{dev.name}p{n}").exists():
                self.add_partition(dev, n, start, count)
        for n in range(1, len(table) + 1):
            node = Path(f"{dev.path}p{n}")
            until_sync(node.exists, f"{node} to appear", within=10.0, every=0.01)
        return len(table)

    def add_partition(self, dev: LoopDevice, number: int, start: int, count: int) -> None:
        """Add partition ``number`` of ``count`` sectors at ``start`` (BLKPG, ``addpart``):
        the kernel's add uevent, as a rewritten partition table gives."""
        subprocess.run(
            ["addpart", str(dev.path), str(number), str(start), str(count)],
            check=True,
            capture_output=True,
        )

    def delete_partition(self, dev: LoopDevice, number: int) -> None:
        """Remove partition ``number`` (BLKPG, ``delpart``): the kernel's remove uevent."""
        subprocess.run(["delpart", str(dev.path), str(number)], check=True, capture_output=True)

    def detach(self, dev: LoopDevice) -> None:
        """Clear the backing file (LOOP_CLR_FD): the device stays, with size 0."""
        with open(dev.path, "rb") as d:
            fcntl.ioctl(d.fileno(), LOOP_CLR_FD, 0)
        self.backing.pop(dev.number, None)

    def remove(self, device: LoopDevice | int) -> None:
        dev = LoopDevice(device) if isinstance(device, int) else device
        if self.backing.pop(dev.number, None) is not None:
            with contextlib.suppress(OSError), open(dev.path, "rb") as d:
                fcntl.ioctl(d.fileno(), LOOP_CLR_FD, 0)
        remove_loop(dev.number)
        if dev in self.created:
            self.created.remove(dev)

    def cleanup(self) -> None:
        errors = []
        for dev in list(self.created):
            try:
                self.remove(dev)
            except OSError as exc:
                errors.append(f"{dev.path}: {exc}")
        if errors:
            raise RuntimeError("could not remove loop devices: " + "; ".join(errors))
