"""The cgroup v2 device program, read back: a small interpreter runs the assembled bytes for
every request and must agree with a reference reading of the rule list that shares no code with
the assembler (per device and access bit, the last rule that touched it decides), for many rule
lists. The interpreter knows only the instructions the program may use, jumps only forward and
inside the program, and treats every register as 64-bit, as the kernel does."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdi_gen.devcgroup.access import DeviceAccess
from cdi_gen.devcgroup.errors import DeviceRuleError
from cdi_gen.devcgroup.program import assemble, encode
from cdi_gen.devcgroup.rules import (
    DeviceRule,
    DeviceType,
    moved,
    parse_oci_devices,
    with_runc_defaults,
)
from tests.conftest import examples

MASK = 2**64 - 1
TYPES = {"b": 1, "c": 2}


class ProgramFaultError(Exception):
    """The program did something a device program must not."""


LOW = 0xFFFFFFFF


def _alu32(op: int, left: int, right: int) -> int:
    """A 32-bit ALU operation; the result is zero-extended into the 64-bit register."""
    if op == 0xB0:  # mov
        return right
    if op == 0x50:  # and
        return left & right
    if op == 0x70:  # rsh
        return (left & LOW) >> right
    raise ProgramFaultError(f"ALU operation {op:#x}")


def _jumps32(op: int, left: int, right: int) -> bool:
    if op == 0x50:  # jne
        return left & LOW != right
    if op == 0x10:  # jeq
        return left & LOW == right
    raise ProgramFaultError(f"jump operation {op:#x}")


def run(program: bytes, type_: str, major: int, minor: int, access: int) -> int:
    """R0 of the program for one request (``struct bpf_cgroup_dev_ctx`` in R1)."""
    context = struct.pack("<III", TYPES[type_] | access << 16, major, minor)
    insns = [struct.unpack_from("<BBhi", program, at) for at in range(0, len(program), 8)]
    regs = [0] * 11
    regs[1] = -1  # the context pointer: only loads through it are allowed
    pc = 0
    while 0 <= pc < len(insns):
        code, registers, off, imm = insns[pc]
        dst, src = registers & 0xF, registers >> 4
        pc += 1
        # The second operand: a register's low half (BPF_X) or the immediate's bit pattern.
        right = regs[src] & LOW if code & 0x08 else imm & LOW
        if code == 0x95:  # exit
            return regs[0]
        if code == 0x61:  # ldxw dst, [src + off]
            if regs[src] != -1 or off not in (0, 4, 8):
                raise ProgramFaultError(f"load from r{src}{off:+}")
            regs[dst] = struct.unpack_from("<I", context, off)[0]
        elif code & 0x07 == 0x04:  # alu32
            if code & 0x08 and regs[src] == -1:
                raise ProgramFaultError("the context pointer used as a number")
            regs[dst] = _alu32(code & 0xF0, regs[dst], right) & LOW
        elif code & 0x07 == 0x06:  # jmp32
            if off < 0:
                raise ProgramFaultError("a backward jump")
            pc += off if _jumps32(code & 0xF0, regs[dst], right) else 0
        else:
            raise ProgramFaultError(f"opcode {code:#x} is not one a device program uses")
    raise ProgramFaultError(f"pc {pc} left the program")


def reference(rules: Sequence[DeviceRule], type_: str, major: int, minor: int, access: int) -> bool:
    """What runc grants, read without a fold: the last ``a`` rule sets the default, and after
    it each bit of each exact (type, major, minor) is held when the last rule touching that bit
    there went against the default; a request matches a rule's device when the type is equal
    and each number is equal or a wildcard, and is decided against the default when one
    matching device holds every bit asked for."""
    start = max((i + 1 for i, r in enumerate(rules) if r.type == "a"), default=0)
    default = rules[start - 1].allow if start else False
    tail = rules[start:]

    def held(device: tuple[str, int | None, int | None], bit: int, upto: int) -> bool:
        last = next(
            (
                r
                for r in reversed(tail[:upto])
                if (r.type, r.major, r.minor) == device and r.access & bit
            ),
            None,
        )
        return last is not None and last.allow != default

    devices = {(r.type, r.major, r.minor) for r in tail}
    hit = any(
        t == type_
        and ma in (None, major)
        and mi in (None, minor)
        and all(held((t, ma, mi), bit, len(tail)) for bit in (1, 2, 4) if access & bit)
        for t, ma, mi in devices
    )
    return (not default) if hit else default


def punches_a_hole(rules: Sequence[DeviceRule]) -> bool:
    """Whether a rule going with the default takes a bit a wildcard covering it still holds,
    in any stretch between ``a`` rules (runc refuses the list even when a later ``a`` rule
    would reset it)."""
    default, segment_start = False, 0
    for i, rule in enumerate(rules):
        if rule.type == "a":
            default, segment_start = rule.allow, i + 1
            continue
        if rule.allow != default:
            continue
        earlier = rules[segment_start:i]
        for wider in {
            (rule.type, None, rule.minor),
            (rule.type, rule.major, None),
            (rule.type, None, None),
        } - {(rule.type, rule.major, rule.minor)}:
            for bit in (1, 2, 4):
                last = next(
                    (
                        r
                        for r in reversed(earlier)
                        if (r.type, r.major, r.minor) == wider and r.access & bit
                    ),
                    None,
                )
                if rule.access & bit and last is not None and last.allow != default:
                    return True
    return False


MAJORS = (1, 2, 2**32 - 1)
MINORS = (3, 4, 2**31)
REQUESTS = list(itertools.product("bc", (*MAJORS, 5), (*MINORS, 9), range(1, 8)))


@st.composite
def rule_lists(draw: st.DrawFn) -> list[DeviceRule]:
    rules = []
    for _ in range(draw(st.integers(0, 12))):
        type_: DeviceType = draw(st.sampled_from(["b", "c", "c", "c", "a"]))
        numbers = (
            (None, None)
            if type_ == "a"
            else (
                draw(st.sampled_from([None, *MAJORS])),
                draw(st.sampled_from([None, *MINORS])),
            )
        )
        rules.append(DeviceRule(draw(st.booleans()), type_, *numbers, draw(st.integers(1, 7))))
    return rules


@settings(max_examples=examples(300), deadline=None)
@given(rule_lists())
def test_the_program_allows_what_the_rules_grant(rules: list[DeviceRule]) -> None:
    if punches_a_hole(rules):
        with pytest.raises(DeviceRuleError, match="wildcard"):
            DeviceAccess.of(rules)
        return
    access = DeviceAccess.of(rules)
    program = encode(assemble(access))
    for request in REQUESTS:
        expected = reference(rules, *request)
        assert run(program, *request) == int(expected), (request, [str(r) for r in rules])
        assert access.allows(*request) == expected


def test_a_runtimes_usual_rules_in_the_program() -> None:
    """runc's list for a container given /dev/null: the defaults and the spec's rule."""
    rules = with_runc_defaults(
        parse_oci_devices(
            [
                {"allow": False, "access": "rwm"},
                {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"},
            ]
        ),
        ["/dev/null"],
    )
    program = encode(assemble(DeviceAccess.of(rules)))
    assert run(program, "c", 1, 3, 2 | 4) == 1  # /dev/null read-write
    assert run(program, "c", 1, 3, 1) == 1  # mknod of anything (c *:* m)
    assert run(program, "c", 1, 1, 2) == 0  # /dev/mem
    assert run(program, "b", 7, 0, 2) == 0  # a block device
    assert run(program, "b", 7, 0, 1) == 1  # ... mknod of it
    assert run(program, "c", 136, 12, 6) == 1  # a pty
    assert run(program, "c", 5, 0, 6) == 1  # /dev/tty


def test_an_allow_all_list_is_one_return() -> None:
    program = assemble(DeviceAccess.of(parse_oci_devices([{"allow": True, "access": "rwm"}])))
    # The prologue, then R0 = 1 and exit: nothing is checked.
    assert [i.code for i in program[-2:]] == [0xB4, 0x95]
    assert program[-2].imm == 1
    assert not any(i.code in (0x56, 0x5E) for i in program)


@settings(max_examples=examples(200), deadline=None)
@given(rule_lists(), st.sampled_from(MAJORS), st.sampled_from(MINORS), st.data())
def test_moving_a_device_changes_no_other_device(
    rules: list[DeviceRule], major: int, minor: int, data: st.DataObject
) -> None:
    """``moved`` keeps the rest of the list: every device but the old and the new numbers is
    allowed exactly what it was."""
    rules = [*rules, DeviceRule(True, "c", major, minor, data.draw(st.integers(1, 7)))]
    new = (5, 9)
    after = moved(rules, "c", (major, minor), new)
    assert len(after) == len(rules)
    assert [r for r in after if not r.names("c", *new)] == [
        r for r in rules if not r.names("c", major, minor) and not r.names("c", *new)
    ]
    if punches_a_hole(rules) or punches_a_hole(after):
        return
    before_program = encode(assemble(DeviceAccess.of(rules)))
    after_program = encode(assemble(DeviceAccess.of(after)))
    for request in REQUESTS:
        if request[:3] in (("c", major, minor), ("c", *new)):
            continue
        assert run(after_program, *request) == run(before_program, *request), request
    # The new numbers get what the old had through their own rules.
    for bits in range(1, 8):
        named_before = DeviceAccess.of(
            [r for r in rules if r.names("c", major, minor) or r.type == "a"]
        )
        named_after = DeviceAccess.of([r for r in after if r.names("c", *new) or r.type == "a"])
        assert named_after.allows("c", *new, bits) == named_before.allows("c", major, minor, bits)


def test_a_device_reached_only_through_a_wildcard_is_not_moved() -> None:
    rules = [DeviceRule(True, "c", 188, None, 7)]
    with pytest.raises(DeviceRuleError, match=r"no rule names c 188:0 exactly"):
        moved(rules, "c", (188, 0), (188, 1))


def test_a_hole_in_a_wildcard_is_refused_naming_both() -> None:
    runtime = with_runc_defaults([DeviceRule(False, "a", None, None, 7)])
    rules = (*runtime, DeviceRule(False, "c", 1, 3, 7))
    with pytest.raises(DeviceRuleError) as raised:
        DeviceAccess.of(rules)
    message = str(raised.value)
    assert "\n" not in message
    assert "deny c 1:3 rwm" in message and "'c *:* m'" in message
    # Withdrawing only what the wildcard does not grant is fine.
    access = DeviceAccess.of([*rules[:-1], DeviceRule(False, "c", 1, 3, 6)])
    assert not access.allows("c", 1, 3, 2) and access.allows("c", 1, 3, 1)
