"""The ``bpf(2)`` calls a cgroup's device program needs, through libc's ``syscall`` (the
standard library has none): load a program, list the programs attached to a cgroup, open one
by its ID, read a program's ID, attach (or atomically replace) and detach.

Only x86_64's system call number is known here; on another machine :class:`Bpf` refuses to
start with one line. Every descriptor a call opens is the caller's to close; each failure is a
:class:`~cdi_gen.devcgroup.errors.DeviceCgroupError` naming the command and the errno.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

from cdi_gen.devcgroup.errors import DeviceCgroupError
from cdi_gen.libc import function

__all__ = ["BPF_F_ALLOW_MULTI", "BPF_F_REPLACE", "Bpf"]

#: ``__NR_bpf`` per machine.
SYSCALL_NUMBERS = {"x86_64": 321}

# Commands, types and flags of <linux/bpf.h>.
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_QUERY = 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2
BPF_F_REPLACE = 4
_COMMANDS = {
    BPF_PROG_LOAD: "BPF_PROG_LOAD",
    BPF_PROG_ATTACH: "BPF_PROG_ATTACH",
    BPF_PROG_DETACH: "BPF_PROG_DETACH",
    BPF_PROG_GET_FD_BY_ID: "BPF_PROG_GET_FD_BY_ID",
    BPF_OBJ_GET_INFO_BY_FD: "BPF_OBJ_GET_INFO_BY_FD",
    BPF_PROG_QUERY: "BPF_PROG_QUERY",
}
#: A cgroup holds at most 64 programs of one attach type (BPF_CGROUP_MAX_PROGS).
MAX_PROGRAMS = 64
LOG_SIZE = 64 * 1024
PROGRAM_NAME = b"cdi_gen_devices"
#: Where the verifier's log is cut down to for one line.
LOG_QUOTE = 240


def _errno_name(code: int) -> str:
    return f"{errno.errorcode.get(code, str(code))} ({os.strerror(code)})"


def _verifier_line(log: bytes) -> str:
    """The verifier's last lines (its verdict), as one line."""
    lines = [line.strip() for line in log.decode(errors="replace").splitlines() if line.strip()]
    text = " | ".join(lines[-3:])
    return text if len(text) <= LOG_QUOTE else "..." + text[-LOG_QUOTE:]


class Bpf:
    """``bpf(2)`` for cgroup device programs."""

    def __init__(self) -> None:
        machine = platform.machine()
        number = SYSCALL_NUMBERS.get(machine)
        if number is None:
            raise DeviceCgroupError(
                f"bpf(2) is not supported on {machine!r}: its system call number is known "
                f"only for {', '.join(sorted(SYSCALL_NUMBERS))}"
            )
        self._number = number
        self._syscall = function(
            "syscall", (ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint), ctypes.c_long
        )

    def _call(self, command: int, attr: ctypes.Array[ctypes.c_char]) -> int:
        """One call; the kernel may write back into ``attr``. Raises with the errno."""
        result = int(self._syscall(self._number, command, attr, len(attr)))
        if result < 0:
            code = ctypes.get_errno()
            raise DeviceCgroupError(f"bpf({_COMMANDS[command]}): {_errno_name(code)}", code)
        return result

    def load(self, instructions: bytes, license_: str = "Apache-2.0") -> int:
        """A new device program's descriptor. A refusal by the verifier raises one line
        with the verifier's last words (the load is repeated with its log only then)."""
        insns = ctypes.create_string_buffer(instructions, len(instructions))
        license_buffer = ctypes.create_string_buffer(license_.encode())

        def attr(log: ctypes.Array[ctypes.c_char] | None) -> ctypes.Array[ctypes.c_char]:
            return ctypes.create_string_buffer(
                struct.pack(
                    "<IIQQIIQII16sII",
                    BPF_PROG_TYPE_CGROUP_DEVICE,
                    len(instructions) // 8,
                    ctypes.addressof(insns),
                    ctypes.addressof(license_buffer),
                    1 if log is not None else 0,
                    len(log) if log is not None else 0,
                    ctypes.addressof(log) if log is not None else 0,
                    0,
                    0,
                    PROGRAM_NAME,
                    0,
                    BPF_CGROUP_DEVICE,
                ),
                72,
            )

        try:
            return self._call(BPF_PROG_LOAD, attr(None))
        except DeviceCgroupError as error:
            if error.errno not in (errno.EACCES, errno.EINVAL):
                raise
            log = ctypes.create_string_buffer(LOG_SIZE)
            try:
                fd = self._call(BPF_PROG_LOAD, attr(log))
            except DeviceCgroupError:
                raise DeviceCgroupError(
                    f"{error}; the verifier says: {_verifier_line(log.value)}", error.errno
                ) from None
            return fd  # it loaded the second time: a transient refusal

    def query(self, cgroup_fd: int) -> list[int]:
        """The IDs of the device programs attached to the cgroup, in the kernel's order."""
        ids = (ctypes.c_uint32 * MAX_PROGRAMS)()
        attr = ctypes.create_string_buffer(
            struct.pack(
                "<IIIIQI", cgroup_fd, BPF_CGROUP_DEVICE, 0, 0, ctypes.addressof(ids), MAX_PROGRAMS
            ),
            32,
        )
        self._call(BPF_PROG_QUERY, attr)
        (count,) = struct.unpack_from("<I", attr, 24)
        return list(ids[:count])

    def open_program(self, program_id: int) -> int:
        """A descriptor of the loaded program with this ID."""
        return self._call(
            BPF_PROG_GET_FD_BY_ID,
            ctypes.create_string_buffer(struct.pack("<III", program_id, 0, 0), 12),
        )

    def program_id(self, program_fd: int) -> int:
        """The ID of the program behind a descriptor."""
        info = ctypes.create_string_buffer(16)
        attr = ctypes.create_string_buffer(
            struct.pack("<IIQ", program_fd, len(info), ctypes.addressof(info)), 16
        )
        self._call(BPF_OBJ_GET_INFO_BY_FD, attr)
        (program_id,) = struct.unpack_from("<I", info, 4)
        return int(program_id)

    def attach(self, cgroup_fd: int, program_fd: int, replacing_fd: int | None = None) -> None:
        """Attach a device program beside any others (``BPF_F_ALLOW_MULTI``), or in place of
        the one ``replacing_fd`` names, in one step (``BPF_F_REPLACE``): the cgroup is never
        without one of the two."""
        flags = BPF_F_ALLOW_MULTI | (BPF_F_REPLACE if replacing_fd is not None else 0)
        attr = struct.pack(
            "<IIIII", cgroup_fd, program_fd, BPF_CGROUP_DEVICE, flags, replacing_fd or 0
        )
        self._call(BPF_PROG_ATTACH, ctypes.create_string_buffer(attr, len(attr)))

    def detach(self, cgroup_fd: int, program_fd: int) -> None:
        """Detach one device program from the cgroup."""
        attr = struct.pack("<IIIII", cgroup_fd, program_fd, BPF_CGROUP_DEVICE, 0, 0)
        self._call(BPF_PROG_DETACH, ctypes.create_string_buffer(attr, len(attr)))
