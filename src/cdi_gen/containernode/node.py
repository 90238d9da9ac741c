"""What one node replacement is given and what it answers: the container's process (its PID
and the start time that tells it from a later process given the same PID), the device node as
the CDI spec gives it (path under ``/dev``, type, numbers, mode, owner, group), each checked
once here, and the typed result (done, skipped, refused) with its one line."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from cdi_gen.containernode.linux import process_start
from cdi_gen.errors import quote

__all__ = [
    "ContainerProcess",
    "DeviceNode",
    "NodeResult",
]

#: The kernel's ``dev_t`` holds a 12-bit major and a 20-bit minor.
MAJOR_LIMIT = 1 << 12
MINOR_LIMIT = 1 << 20
#: ``chown`` reads -1 (``2**32 - 1``) as "leave as it is": never an owner a spec may name.
ID_LIMIT = 2**32 - 1
#: Longest path (``PATH_MAX``) and path component (``NAME_MAX``) the kernel takes.
PATH_LIMIT = 4095
NAME_LIMIT = 255
#: The folder every node this package touches is beneath, in the container.
DEV = "/dev/"

Status = Literal["done", "skipped", "refused"]


def _path_problem(path: object) -> str | None:
    """A path under ``/dev`` with no empty, ``.`` or ``..`` component, within the kernel's
    lengths; else why not."""
    if not isinstance(path, str) or not path.startswith(DEV):
        return f"path {quote(path)} is not under {DEV}"
    if "\0" in path or len(os.fsencode(path)) > PATH_LIMIT:
        return f"path {quote(path)} holds a NUL or is longer than {PATH_LIMIT} bytes"
    for part in path.removeprefix(DEV).split("/"):
        if part in ("", ".", ".."):
            return f"path {quote(path)} has an empty, '.' or '..' component"
        if len(os.fsencode(part)) > NAME_LIMIT:
            return f"path {quote(path)} has a component longer than {NAME_LIMIT} bytes"
    return None


@dataclass(frozen=True, slots=True)
class ContainerProcess:
    """A container's process (its init, as the runtime reports it) by host PID and start
    time, captured when the PID was learnt."""

    pid: int
    start: int

    @classmethod
    def now(cls, pid: int) -> ContainerProcess | None:
        """The process that has ``pid`` now; None when none has."""
        start = process_start(pid)
        return None if start is None else cls(pid, start)


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node as the spec gives it: ``path`` in the container (under ``/dev``),
    ``type`` ``c`` or ``b``, its numbers, permission bits ``mode``, owner ``uid``, group
    ``gid``. Nothing is checked at construction: :meth:`problem` says what is wrong."""

    path: str
    type: str
    major: int
    minor: int
    mode: int
    uid: int
    gid: int

    def problem(self) -> str | None:
        """Why this node may not be written (one clause naming the rule), or None."""
        return _path_problem(self.path) or self._number_problem()

    def _number_problem(self) -> str | None:
        if self.type not in ("c", "b"):
            return f"type {quote(self.type)} is not 'c' or 'b'"
        for what, value, limit in (
            ("major", self.major, MAJOR_LIMIT),
            ("minor", self.minor, MINOR_LIMIT),
            ("uid", self.uid, ID_LIMIT),
            ("gid", self.gid, ID_LIMIT),
        ):
            if type(value) is not int or not 0 <= value < limit:
                return f"{what} {quote(value)} is not in 0..{limit - 1}"
        if type(self.mode) is not int or not 0 <= self.mode <= 0o777:
            return f"mode {quote(self.mode)} is not permission bits (0..0o777)"
        return None

    @property
    def relative(self) -> str:
        """The path below the container's ``/dev``."""
        return self.path.removeprefix(DEV)

    def as_arguments(self) -> list[str]:
        """The node as the child takes it on its command line (the path has no NUL)."""
        numbers = (self.major, self.minor, self.mode, self.uid, self.gid)
        return [self.path, self.type, *map(str, numbers)]


@dataclass(frozen=True, slots=True)
class NodeResult:
    """What became of one replacement: ``done``; ``skipped`` (the container's process is gone:
    there is nothing to update); ``refused`` (a rule said no, and nothing was changed).
    ``reason`` is the clause that says why; :attr:`line` the log line."""

    status: Status
    reason: str
    pid: int
    path: str

    @property
    def done(self) -> bool:
        return self.status == "done"

    @property
    def line(self) -> str:
        what = f"device node {quote(self.path)} in the container of process {self.pid}"
        return f"{what}: {self.status}" + (f": {self.reason}" if self.reason else "")
