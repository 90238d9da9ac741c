"""The cgroup v2 device program: eBPF instructions (``BPF_PROG_TYPE_CGROUP_DEVICE``) that
allow what a :class:`~cdi_gen.devcgroup.access.DeviceAccess` allows, assembled here.

The kernel calls the program with ``struct bpf_cgroup_dev_ctx {u32 access_type; u32 major;
u32 minor;}`` in R1, ``access_type`` being the device type in its low 16 bits (``1`` block,
``2`` char) and the access bits above them; the program returns 1 to allow, 0 to deny. Its
shape: load the four values into R2..R5 once, then one block per exception that jumps to the
next block on the first field that does not match and otherwise returns the exception's
verdict, then the default. Comparisons are 32-bit (``BPF_JMP32``), so every number up to
2^32-1 compares as it is.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cdi_gen.devcgroup.access import DeviceAccess, Key
from cdi_gen.devcgroup.rules import ALL_ACCESS

__all__ = ["DEVICE_TYPES", "Instruction", "assemble", "encode"]

#: ``BPF_DEVCG_DEV_BLOCK`` and ``BPF_DEVCG_DEV_CHAR``.
DEVICE_TYPES = {"b": 1, "c": 2}

# Opcode parts of <linux/bpf_common.h> and <linux/bpf.h>.
LDX, ALU, JMP, JMP32 = 0x01, 0x04, 0x05, 0x06
MEM, W = 0x60, 0x00
K, X = 0x00, 0x08
AND, RSH, MOV = 0x50, 0x70, 0xB0
JNE, EXIT = 0x50, 0x90

_INSN = struct.Struct("<BBhi")


@dataclass(frozen=True, slots=True)
class Instruction:
    """One ``struct bpf_insn``: opcode, registers, offset, immediate."""

    code: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0

    def pack(self) -> bytes:
        # The immediate is signed 32-bit; a number of 2^31 or more goes in as its bit pattern.
        imm = self.imm - 2**32 if self.imm >= 2**31 else self.imm
        return _INSN.pack(self.code, self.dst | self.src << 4, self.off, imm)


def _load(dst: int, offset: int) -> Instruction:
    return Instruction(LDX | MEM | W, dst=dst, src=1, off=offset)


_PROLOGUE = (
    _load(2, 0),
    Instruction(ALU | AND | K, dst=2, imm=0xFFFF),  # R2: type
    _load(3, 0),
    Instruction(ALU | RSH | K, dst=3, imm=16),  # R3: access
    _load(4, 4),  # R4: major
    _load(5, 8),  # R5: minor
)


def _verdict(allow: bool) -> list[Instruction]:
    return [Instruction(ALU | MOV | K, dst=0, imm=int(allow)), Instruction(JMP | EXIT)]


def _block(key: Key, bits: int, allow: bool) -> list[Instruction]:
    """One exception: each test is a jump past the block, its offset (-1 until then) filled
    in once the block's length is known."""
    type_, major, minor = key
    tests: list[Instruction] = [
        Instruction(JMP32 | JNE | K, dst=2, off=-1, imm=DEVICE_TYPES[type_])
    ]
    if bits != ALL_ACCESS:
        # Every bit asked for must be in the exception: (R3 & bits) == R3, in R1 (free now).
        tests += [
            Instruction(ALU | MOV | X, dst=1, src=3),
            Instruction(ALU | AND | K, dst=1, imm=bits),
            Instruction(JMP32 | JNE | X, dst=1, src=3, off=-1),
        ]
    if major is not None:
        tests.append(Instruction(JMP32 | JNE | K, dst=4, off=-1, imm=major))
    if minor is not None:
        tests.append(Instruction(JMP32 | JNE | K, dst=5, off=-1, imm=minor))
    block = [*tests, *_verdict(allow)]
    return [
        Instruction(i.code, i.dst, i.src, len(block) - n - 1, i.imm) if i.off == -1 else i
        for n, i in enumerate(block)
    ]


def assemble(access: DeviceAccess) -> list[Instruction]:
    """The program that allows what ``access`` allows."""
    program = list(_PROLOGUE)
    for key, bits in access.ordered():
        program += _block(key, bits, not access.default_allow)
    return program + _verdict(access.default_allow)


def encode(program: list[Instruction]) -> bytes:
    """The instructions as ``BPF_PROG_LOAD`` takes them."""
    return b"".join(i.pack() for i in program)
