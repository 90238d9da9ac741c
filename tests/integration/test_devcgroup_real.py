"""A container's device access changed in place, with the real kernel: a real process in a
cgroup v2 child (its device program attached, then replaced) and in a cgroup v1 child of the
devices controller (its files written) opens real device nodes, and what it can open follows
each change. The rules are the ones runc would apply for a container whose spec gives it
/dev/null: runc's defaults, less the ones for nodes the spec lists itself."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdi_gen.devcgroup.access import DeviceAccess
from cdi_gen.devcgroup.bpf import Bpf
from cdi_gen.devcgroup.cgroupv1 import DEVICES_HIERARCHY, DevicesCgroup
from cdi_gen.devcgroup.cgroupv2 import UNIFIED_HIERARCHY, ProgramCgroup
from cdi_gen.devcgroup.errors import DeviceCgroupError, DeviceRuleError
from cdi_gen.devcgroup.program import assemble, encode
from cdi_gen.devcgroup.rules import (
    DeviceRule,
    DeviceType,
    moved,
    parse_oci_devices,
    with_runc_defaults,
)
from tests.conftest import examples
from tests.mountns import reported, run_private
from tests.processes import terminate

#: The nodes the process opens: two the change moves between, two runc's defaults allow and
#: one nothing allows.
NODES = {
    "null": "/dev/null",  # c 1:3: the spec's device, moved away
    "zero": "/dev/zero",  # c 1:5: where it moves to
    "full": "/dev/full",  # c 1:7: a runc default
    "urandom": "/dev/urandom",  # c 1:9: a runc default
    "loop-control": "/dev/loop-control",  # c 10:237: allowed by no rule
}
SPEC = [
    {"allow": False, "access": "rwm"},
    {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"},
]
#: runc's list: the spec's rules and its defaults, less those of the nodes the spec lists.
RUNTIME_RULES = with_runc_defaults(parse_oci_devices(SPEC), ["/dev/null", "/dev/zero"])
FOLLOWED = moved(RUNTIME_RULES, "c", (1, 3), (1, 5))

ALL_OPEN = {f"{name}:{mode}": "ok" for name in NODES for mode in "rw"}
BEFORE = {**ALL_OPEN, "zero:r": "EPERM", "zero:w": "EPERM"}
BEFORE |= {"loop-control:r": "EPERM", "loop-control:w": "EPERM"}
AFTER = {**BEFORE, "null:r": "EPERM", "null:w": "EPERM", "zero:r": "ok", "zero:w": "ok"}

PROBE = f"""
import errno, os, sys
NODES = {NODES!r}
def one(path, flags):
    try:
        os.close(os.open(path, flags))
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print("ready", flush=True)
for line in sys.stdin:
    print(" ".join(f"{{n}}:{{m}}=" + one(p, os.O_RDONLY if m == "r" else os.O_WRONLY)
                   for n, p in NODES.items() for m in "rw"), flush=True)
"""


class Prober:
    """A real process that opens each node when asked and says what it could open."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None and self.process.stdin is not None
        self._in, self._out = self.process.stdin, self.process.stdout
        # Started, and nothing probed yet: it joins its cgroup before its first open.
        assert self._out.readline() == "ready\n"

    def join(self, cgroup: str) -> None:
        Path(cgroup, "cgroup.procs").write_text(str(self.process.pid))

    def probe(self) -> dict[str, str]:
        self._in.write("\n")
        self._in.flush()
        line = self._out.readline()
        assert line, f"the probe exited ({self.process.poll()})"
        return dict(item.split("=") for item in line.split())

    def stop(self) -> None:
        self._in.close()
        terminate(self.process, grace=5)
        self._out.close()


def _cgroup(hierarchy: str) -> Iterator[str]:
    path = f"{hierarchy}/cdi-gen-test-{uuid.uuid4().hex[:12]}"
    os.mkdir(path)
    try:
        yield path
    finally:
        os.rmdir(path)


@pytest.fixture
def v2_cgroup() -> Iterator[str]:
    """A fresh cgroup v2 child, removed after (its programs go with it)."""
    yield from _cgroup(UNIFIED_HIERARCHY)


@pytest.fixture
def v1_cgroup() -> Iterator[str]:
    """A fresh child of the v1 devices controller, removed after."""
    yield from _cgroup(DEVICES_HIERARCHY)


@pytest.fixture
def prober() -> Iterator[Prober]:
    started = Prober()
    try:
        yield started
    finally:
        started.stop()


def test_v2_a_program_allows_denies_and_is_replaced_in_place(
    v2_cgroup: str, prober: Prober
) -> None:
    prober.join(v2_cgroup)
    with ProgramCgroup(v2_cgroup) as cgroup:
        assert cgroup.attached() == []
        assert prober.probe() == ALL_OPEN

        runtimes = cgroup.attach(RUNTIME_RULES)
        assert cgroup.attached() == [runtimes]
        assert prober.probe() == BEFORE

        followed = cgroup.replace(FOLLOWED, expected=runtimes)
        assert followed != runtimes
        assert cgroup.attached() == [followed]
        assert prober.probe() == AFTER

        # And back: the change is its own inverse, still one program.
        back = cgroup.replace(moved(FOLLOWED, "c", (1, 5), (1, 3)))
        assert cgroup.attached() == [back]
        assert prober.probe() == BEFORE


def test_v1_the_devices_controller_allows_denies_and_moves_a_device(
    v1_cgroup: str, prober: Prober
) -> None:
    prober.join(v1_cgroup)
    with DevicesCgroup(v1_cgroup) as cgroup:
        assert [r.text for r in cgroup.listed()] == ["a *:* rwm"]
        assert prober.probe() == ALL_OPEN

        cgroup.apply(RUNTIME_RULES)
        # The kernel holds what the rules grant, as the v2 program computes it.
        granted = DeviceAccess.of(RUNTIME_RULES)
        assert {(r.type, r.major, r.minor, r.access) for r in cgroup.listed()} == {
            (*key, bits) for key, bits in granted.exceptions.items()
        }
        assert prober.probe() == BEFORE

        cgroup.allow(DeviceRule(True, "c", 1, 5, 6))
        cgroup.deny(DeviceRule(False, "c", 1, 3, 6))
        listed = {r.text for r in cgroup.listed()}
        assert "c 1:5 rw" in listed and not any(t.startswith("c 1:3 ") for t in listed)
        assert prober.probe() == AFTER


def test_the_replacement_keeps_the_runtimes_other_rules_with_no_window(
    v2_cgroup: str,
) -> None:
    """While the program is replaced again and again, a process opening a node every rule
    list allows (/dev/full) never fails, and one no list allows (/dev/loop-control) never
    opens: at no moment is the cgroup without one of the two programs, or with both."""
    hammer = subprocess.Popen(
        [sys.executable, "-c", HAMMER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert hammer.stdin is not None and hammer.stdout is not None
    try:
        assert hammer.stdout.readline() == "ready\n"
        Path(v2_cgroup, "cgroup.procs").write_text(str(hammer.pid))
        with ProgramCgroup(v2_cgroup) as cgroup:
            current = cgroup.attach(RUNTIME_RULES)
            hammer.stdin.write("go\n")
            hammer.stdin.flush()
            assert hammer.stdout.readline() == "going\n"
            lists = [FOLLOWED, RUNTIME_RULES]
            for i in range(200):
                current = cgroup.replace(lists[i % 2], expected=current)
                assert cgroup.attached() == [current]
        hammer.stdin.write("stop\n")
        hammer.stdin.flush()
        counts = dict(item.split("=") for item in hammer.stdout.readline().split())
    finally:
        hammer.stdin.close()
        terminate(hammer, grace=5)
        hammer.stdout.close()
    assert counts["full_denied"] == "0", counts
    assert counts["loop_opened"] == "0", counts
    assert int(counts["rounds"]) > 0


HAMMER = """
import os, select, sys
print("ready", flush=True)
sys.stdin.readline()
print("going", flush=True)
rounds = full_denied = loop_opened = 0
while not select.select([sys.stdin], [], [], 0)[0]:
    rounds += 1
    try:
        os.close(os.open("/dev/full", os.O_RDONLY))
    except PermissionError:
        full_denied += 1
    try:
        os.close(os.open("/dev/loop-control", os.O_RDONLY))
        loop_opened += 1
    except PermissionError:
        pass
print(f"rounds={rounds} full_denied={full_denied} loop_opened={loop_opened}", flush=True)
"""


def test_a_replacement_is_refused_unless_one_program_is_attached(v2_cgroup: str) -> None:
    with ProgramCgroup(v2_cgroup) as cgroup:
        with pytest.raises(DeviceCgroupError, match=r"0 device programs attached \[\]"):
            cgroup.replace(FOLLOWED)
        first = cgroup.attach(RUNTIME_RULES)
        with pytest.raises(DeviceCgroupError, match=f"device program {first} is attached, not 1"):
            cgroup.replace(FOLLOWED, expected=1)
        second = cgroup.attach(RUNTIME_RULES)
        with pytest.raises(DeviceCgroupError, match=r"2 device programs attached") as raised:
            cgroup.replace(FOLLOWED)
        assert str(first) in str(raised.value) and str(second) in str(raised.value)
        # Nothing changed by any refusal.
        assert sorted(cgroup.attached()) == sorted([first, second])


def test_a_program_detached_under_the_replacement_makes_the_kernel_refuse_it(
    v2_cgroup: str,
) -> None:
    """The race ``replace`` leaves to the kernel: between its query and its swap someone
    detaches the program it read; ``BPF_F_REPLACE`` then refuses (ENOENT) and attaches
    nothing, rather than adding the new program beside whatever is there now."""
    bpf = Bpf()
    with ProgramCgroup(v2_cgroup, bpf=bpf) as cgroup:
        read = cgroup.attach(RUNTIME_RULES)
        old = bpf.open_program(read)
        new = bpf.load(encode(assemble(DeviceAccess.of(FOLLOWED))))
        folder = os.open(v2_cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            cgroup.detach(read)  # someone else, in between
            with pytest.raises(DeviceCgroupError, match=r"BPF_PROG_ATTACH\): ENOENT"):
                bpf.attach(folder, new, replacing_fd=old)
            assert cgroup.attached() == []
        finally:
            for fd in (folder, new, old):
                os.close(fd)


def test_a_rule_list_that_cannot_be_a_program_changes_nothing(v2_cgroup: str) -> None:
    with ProgramCgroup(v2_cgroup) as cgroup:
        first = cgroup.attach(RUNTIME_RULES)
        with pytest.raises(Exception, match="wildcard"):
            cgroup.replace([*RUNTIME_RULES, DeviceRule(False, "c", 1, 3, 7)])
        assert cgroup.attached() == [first]


def test_the_hierarchy_roots_are_never_changed() -> None:
    with (
        pytest.raises(DeviceCgroupError, match="empty component"),
        ProgramCgroup(UNIFIED_HIERARCHY + "/"),
    ):
        pass
    with pytest.raises(DeviceCgroupError, match="is not beneath"), DevicesCgroup(DEVICES_HIERARCHY):
        pass


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_every_descriptor_is_closed_and_a_program_can_be_detached(v2_cgroup: str) -> None:
    """Replacements, refusals and detaching leave no descriptor open (a long-running agent
    would otherwise pin one program per change)."""
    bpf = Bpf()
    before = _open_fds()
    with ProgramCgroup(v2_cgroup, bpf=bpf) as cgroup:
        current = cgroup.attach(RUNTIME_RULES)
        for lists in (FOLLOWED, RUNTIME_RULES) * 10:
            current = cgroup.replace(lists, expected=current)
        with pytest.raises(DeviceCgroupError):
            cgroup.replace(FOLLOWED, expected=current + 1000)
        with pytest.raises(DeviceRuleError):
            cgroup.replace([*RUNTIME_RULES, DeviceRule(False, "c", 1, 3, 7)])
        other = cgroup.attach(FOLLOWED)
        assert sorted(cgroup.attached()) == sorted([current, other])
        cgroup.detach(other)
        assert cgroup.attached() == [current]
        with pytest.raises(DeviceCgroupError, match=f"detaching device program {other}: "):
            cgroup.detach(other)
    assert _open_fds() == before


MOUNTED_OVER = """
import json, subprocess, sys
from cdi_gen.devcgroup.cgroupv2 import ProgramCgroup
from cdi_gen.devcgroup.errors import DeviceCgroupError, DeviceRuleError
subprocess.run(["mount", "-t", "tmpfs", "none", sys.argv[1]], check=True)
try:
    ProgramCgroup(sys.argv[1]).close()
    print("OPENED")
except DeviceCgroupError as error:
    print("REFUSED " + json.dumps(str(error)))
"""


def test_a_folder_mounted_over_a_cgroup_is_refused(v2_cgroup: str) -> None:
    """Something mounted over a cgroup's folder (here a tmpfs, in a private mount namespace)
    is another file system: refused, never taken for the cgroup."""
    stdout = run_private(["-c", MOUNTED_OVER, v2_cgroup])
    assert "OPENED" not in stdout
    message = reported(stdout, "REFUSED ")
    assert "is on another file system than its hierarchy" in message


def test_a_verifier_refusal_is_one_line_with_its_reason() -> None:
    # A program that returns without setting R0: the verifier refuses it.
    with pytest.raises(DeviceCgroupError) as raised:
        Bpf().load(bytes([0x95, 0, 0, 0, 0, 0, 0, 0]))
    message = str(raised.value)
    assert message.startswith("bpf(BPF_PROG_LOAD): EACCES")
    assert "the verifier says:" in message and "R0 !read_ok" in message
    assert "\n" not in message


TYPES: list[DeviceType] = ["a", "b", "c", "c"]


@st.composite
def _rules(draw: st.DrawFn) -> list[DeviceRule]:
    out = []
    for _ in range(draw(st.integers(0, 40))):
        type_ = draw(st.sampled_from(TYPES))
        numbers = (
            (None, None)
            if type_ == "a"
            else (
                draw(st.none() | st.integers(0, 2**32 - 1)),
                draw(st.none() | st.integers(0, 2**32 - 1)),
            )
        )
        out.append(DeviceRule(draw(st.booleans()), type_, *numbers, draw(st.integers(1, 7))))
    return out


@settings(max_examples=examples(50), deadline=None)
@given(_rules())
def test_the_kernel_verifier_takes_every_program(rules: list[DeviceRule]) -> None:
    try:
        access = DeviceAccess.of(rules)
    except ValueError:
        return
    bpf = Bpf()
    fd = bpf.load(encode(assemble(access)))
    try:
        assert bpf.program_id(fd) > 0
    finally:
        os.close(fd)
