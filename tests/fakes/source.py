"""A record source on a real pipe, fed from recorded udev data instead of this machine.

It keeps the :class:`~cdi_gen.sources.RecordSource` protocol the agent uses with udev: the
first enumeration from :meth:`start`, then batches read on the event loop through
``add_reader`` on a real file descriptor, as the netlink monitor is read. A test pushes
records (``push``) or a full re-enumeration (``push(..., full=True)``); each push writes one
byte to the pipe, so the agent wakes exactly as it does for a uevent. Records come from
``tests/data/udev`` (``udevadm info --export-db`` text or the JSON form), never from the
host's udev database.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

from cdi_gen.model import DeviceRecord
from cdi_gen.sources import RecordBatch
from cdi_gen.sources.records import load_recording

DATA = Path(__file__).resolve().parents[1] / "data" / "udev"


class PipeSource:
    """Records pushed by the test, delivered like udev events (see the module docstring)."""

    source = "recorded"

    def __init__(self, records: Iterable[DeviceRecord] = ()) -> None:
        self.initial = list(records)
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self._queue: list[RecordBatch] = []
        self._closed = False
        self.resync_requests = 0

    @classmethod
    def from_data(cls, name: str, *, only: Iterable[str] | None = None) -> PipeSource:
        """A source whose enumeration is ``tests/data/udev/<name>`` (only the ``sys_name`` s
        in ``only``, when given)."""
        records = load_recording(DATA / name).records
        wanted = None if only is None else set(only)
        return cls(r for r in records if wanted is None or r.sys_name in wanted)

    # -- the RecordSource protocol -----------------------------------------------------------

    def start(self) -> list[DeviceRecord]:
        return list(self.initial)

    async def batches(self) -> AsyncIterator[RecordBatch]:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()

        def readable() -> None:
            try:
                os.read(self._read_fd, 4096)
            except BlockingIOError:
                return
            ready.set()

        loop.add_reader(self._read_fd, readable)
        try:
            while not self._closed:
                await ready.wait()
                ready.clear()
                while self._queue and not self._closed:
                    yield self._queue.pop(0)
        finally:
            loop.remove_reader(self._read_fd)

    def request_resync(self) -> None:
        self.resync_requests += 1
        self.push(*self.initial, full=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        os.write(self._write_fd, b"\x00")

    # -- for tests ---------------------------------------------------------------------------

    def push(self, *records: DeviceRecord, full: bool = False) -> None:
        """Deliver ``records`` as one batch (``full``: a complete enumeration)."""
        if full:
            self.initial = list(records)
        self._queue.append(RecordBatch(tuple(records), full=full, received=time.monotonic()))
        os.write(self._write_fd, b"\x01")

    def add(self, record: DeviceRecord) -> None:
        self.push(dataclasses.replace(record, action="add"))

    def remove(self, record: DeviceRecord) -> None:
        self.push(
            DeviceRecord(
                sys_path=record.sys_path,
                subsystem=record.subsystem,
                sys_name=record.sys_name,
                action="remove",
            )
        )

    def release(self) -> None:
        """Close the pipe (a test's teardown)."""
        self.close()
        for fd in (self._read_fd, self._write_fd):
            os.close(fd)
