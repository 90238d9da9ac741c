"""A cgroup v2 cgroup's device program: the programs attached to it listed, one attached (as a
runtime does when it starts a container) or detached, and the one attached replaced in place
by a program built from a new rule list.

With several device programs on one cgroup the kernel allows an access only when each of them
does, so a device can be added only by replacing the program that denies it, never by adding
one. The replacement is one ``BPF_PROG_ATTACH`` with ``BPF_F_REPLACE``: the kernel swaps the
old program for the new one, and the cgroup is never without one of them. It is refused
unless exactly one program is attached (and, when the caller names it, that one): with
more, replacing one could not grant what another denies.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from cdi_gen.devcgroup.access import DeviceAccess
from cdi_gen.devcgroup.bpf import Bpf
from cdi_gen.devcgroup.errors import DeviceCgroupError
from cdi_gen.devcgroup.folders import CGROUP2_SUPER_MAGIC, CgroupFolder, quote_path
from cdi_gen.devcgroup.program import assemble, encode
from cdi_gen.devcgroup.rules import DeviceRule

__all__ = ["UNIFIED_HIERARCHY", "ProgramCgroup"]

#: Where a hybrid host (this project's test machines) mounts cgroup v2; a host with only
#: cgroup v2 mounts it at /sys/fs/cgroup.
UNIFIED_HIERARCHY = "/sys/fs/cgroup/unified"


class ProgramCgroup(CgroupFolder):
    """One cgroup v2 cgroup, held open from ``__init__`` to :meth:`close`."""

    def __init__(
        self, path: str, hierarchy: str = UNIFIED_HIERARCHY, bpf: Bpf | None = None
    ) -> None:
        self._bpf = bpf or Bpf()
        super().__init__(path, hierarchy, CGROUP2_SUPER_MAGIC)

    def _fail(self, what: str, error: DeviceCgroupError) -> DeviceCgroupError:
        return DeviceCgroupError(f"cgroup {quote_path(self.path)}: {what}: {error}", error.errno)

    def attached(self) -> list[int]:
        """The IDs of the device programs attached to this cgroup."""
        try:
            return self._bpf.query(self._fd)
        except DeviceCgroupError as error:
            raise self._fail("listing its device programs", error) from None

    def _load(self, rules: Iterable[DeviceRule]) -> int:
        return self._bpf.load(encode(assemble(DeviceAccess.of(rules))))

    def attach(self, rules: Iterable[DeviceRule]) -> int:
        """Attach a program built from ``rules`` beside any others; its ID."""
        program = self._load(rules)
        try:
            self._bpf.attach(self._fd, program)
            return self._bpf.program_id(program)
        except DeviceCgroupError as error:
            raise self._fail("attaching a device program", error) from None
        finally:
            os.close(program)

    def detach(self, program_id: int) -> None:
        """Detach the attached device program with this ID."""
        try:
            program = self._bpf.open_program(program_id)
            try:
                self._bpf.detach(self._fd, program)
            finally:
                os.close(program)
        except DeviceCgroupError as error:
            raise self._fail(f"detaching device program {program_id}", error) from None

    def replace(self, rules: Iterable[DeviceRule], expected: int | None = None) -> int:
        """Replace the one attached program by one built from ``rules``, atomically; the new
        program's ID. ``expected``: the ID the caller read, refused if another is attached.

        The rules are checked and the program loaded before the cgroup is looked at, so a bad
        list changes nothing; a program swapped by someone else between the query and the
        swap makes the kernel refuse it (``ENOENT``), and nothing changes either.
        """
        program = self._load(rules)
        try:
            ids = self.attached()
            if len(ids) != 1:
                raise DeviceCgroupError(
                    f"cgroup {quote_path(self.path)}: {len(ids)} device programs attached {ids}; "
                    "only the one a runtime attached is replaced"
                )
            if expected is not None and ids[0] != expected:
                raise DeviceCgroupError(
                    f"cgroup {quote_path(self.path)}: device program {ids[0]} is attached, "
                    f"not {expected}"
                )
            try:
                old = self._bpf.open_program(ids[0])
            except DeviceCgroupError as error:
                raise self._fail(f"opening device program {ids[0]}", error) from None
            try:
                self._bpf.attach(self._fd, program, replacing_fd=old)
            except DeviceCgroupError as error:
                raise self._fail(f"replacing device program {ids[0]}", error) from None
            finally:
                os.close(old)
            return self._bpf.program_id(program)
        finally:
            os.close(program)
