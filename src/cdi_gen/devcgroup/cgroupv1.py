"""A cgroup v1 device cgroup (the ``devices`` controller): a device allowed or withdrawn by
writing its rule to ``devices.allow`` or ``devices.deny``, and ``devices.list`` read back.

Only the cgroup folder it is given is touched, reached as :mod:`cdi_gen.devcgroup.folders`
reaches it (no link followed, nothing outside the hierarchy), and the files in it are opened
with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from cdi_gen.devcgroup.errors import DeviceCgroupError
from cdi_gen.devcgroup.folders import CGROUP_SUPER_MAGIC, CgroupFolder, quote_path
from cdi_gen.devcgroup.rules import DeviceRule, parse_list_line

__all__ = ["DEVICES_HIERARCHY", "DevicesCgroup"]

#: Where a v1 host (or a hybrid one) mounts the devices controller.
DEVICES_HIERARCHY = "/sys/fs/cgroup/devices"
#: ``devices.list`` is one short line per exception; the kernel caps them far below this.
LIST_LIMIT = 1 << 20


class DevicesCgroup(CgroupFolder):
    """One cgroup of the devices controller, held open from ``__init__`` to :meth:`close`."""

    def __init__(self, path: str, hierarchy: str = DEVICES_HIERARCHY) -> None:
        super().__init__(path, hierarchy, CGROUP_SUPER_MAGIC)

    def _write(self, name: str, text: str) -> None:
        try:
            fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
        except OSError as error:
            raise DeviceCgroupError(
                f"cgroup {quote_path(self.path)}: writing {text!r} to {name}: "
                f"{os.strerror(error.errno or 0)}",
                error.errno,
            ) from None

    def apply(self, rules: Iterable[DeviceRule]) -> None:
        """Each rule in order: an allow to ``devices.allow``, a deny to ``devices.deny``."""
        for rule in rules:
            self._write("devices.allow" if rule.allow else "devices.deny", rule.text)

    def allow(self, rule: DeviceRule) -> None:
        """Grant the rule's access (its ``allow`` is ignored)."""
        self._write("devices.allow", rule.text)

    def deny(self, rule: DeviceRule) -> None:
        """Withdraw the rule's access (its ``allow`` is ignored)."""
        self._write("devices.deny", rule.text)

    def _read(self, name: str) -> str:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
            try:
                data = b""
                while chunk := os.read(fd, LIST_LIMIT + 1 - len(data)):
                    data += chunk
                    if len(data) > LIST_LIMIT:
                        raise DeviceCgroupError(
                            f"cgroup {quote_path(self.path)}: {name} is over {LIST_LIMIT} bytes"
                        )
            finally:
                os.close(fd)
        except OSError as error:
            raise DeviceCgroupError(
                f"cgroup {quote_path(self.path)}: reading {name}: {os.strerror(error.errno or 0)}",
                error.errno,
            ) from None
        return data.decode()

    def listed(self) -> tuple[DeviceRule, ...]:
        """What ``devices.list`` says the cgroup allows (``a *:* rwm`` alone: everything)."""
        return tuple(parse_list_line(line) for line in self._read("devices.list").splitlines())
