"""The ``follow`` step with the real kernel and no Kubernetes: the "container" is a real
process in a private mount namespace with its own tmpfs on ``/dev`` holding the node of a
loop device, in a fresh cgroup v1 devices child and a fresh cgroup v2 child whose device
program holds the runtime's rules (runc's defaults and the loop device's numbers). The loop
device comes back with another minor (detached, removed, its backing file attached to a new
one), and the follow step must give the container the new device at the same path."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdi_gen.agent.follow import CameBack, Hierarchies, Holder, follow
from cdi_gen.containernode.node import ContainerProcess, DeviceNode
from cdi_gen.devcgroup.cgroupv1 import DevicesCgroup
from cdi_gen.devcgroup.cgroupv2 import UNIFIED_HIERARCHY
from cdi_gen.devcgroup.rules import DeviceRule, parse_oci_devices, with_runc_defaults
from tests.heldcontainer import CONTENT, PATH, Container
from tests.loopdev import LoopDevice, LoopDevices
from tests.processes import terminate


@pytest.fixture
def backing() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="cg"))
    (folder / "disk").write_bytes(CONTENT)
    try:
        yield folder / "disk"
    finally:
        shutil.rmtree(folder)


@pytest.fixture
def attached(loops: LoopDevices, backing: Path) -> LoopDevice:
    device = loops.add()
    loops.attach(device, backing)
    return device


@pytest.fixture
def holder(attached: LoopDevice) -> Iterator[Container]:
    started = Container(attached.number)
    try:
        yield started
    finally:
        started.stop()


def _came_back(loops: LoopDevices, old: LoopDevice, backing: Path) -> CameBack:
    """The device goes and comes back with another minor: its backing file is detached (the
    old device stays, empty: opening the node of a loop minor that is gone would make the
    kernel create it again) and attached to a new loop device."""
    loops.detach(old)
    new = loops.add()
    loops.attach(new, backing)
    assert new.number != old.number
    return CameBack("loop-a", DeviceNode(PATH, "b", 7, new.number, 0o660, 0, 6), (7, old.number))


def test_a_held_device_that_came_back_is_readable_at_the_same_path(
    loops: LoopDevices, backing: Path, attached: LoopDevice, holder: Container
) -> None:
    other = Container(attached.number)
    try:
        assert holder.read() == CONTENT[:20].decode()
        came = _came_back(loops, attached, backing)
        # Before the follow the container's node names the old numbers: an empty device.
        assert holder.read() == ""
        rdev = f"out = os.stat({PATH!r}).st_rdev"
        other_before = (other.listed(), other.programs(), other.run(rdev))

        [result] = follow(came, [holder.holder()], Hierarchies.now())

        assert (result.status, result.reason) == ("done", ""), result.line
        assert holder.read() == CONTENT[:20].decode()
        # The old numbers are withdrawn in both hierarchies: a node for them is denied.
        listed = holder.listed()
        assert f"b 7:{came.new[1]} rw" in listed
        assert not any(t.startswith(f"b 7:{came.old[1]} ") for t in listed)
        holder.run(f"os.mknod('/dev/old', 0o60660, os.makedev(7, {came.old[1]}))")
        assert holder.read("/dev/old") == "EPERM"
        assert holder.programs() != [holder.program] and len(holder.programs()) == 1
        # The container that does not hold the device is untouched.
        assert other_before == (other.listed(), other.programs(), other.run(rdev))
    finally:
        other.stop()


def test_without_the_follow_the_v2_program_alone_denies_the_new_numbers(
    loops: LoopDevices, backing: Path, attached: LoopDevice, holder: Container
) -> None:
    """The v2 program is checked apart from v1: with only the node replaced (v1 allowing the
    new numbers by hand), the read is still denied: the follow step's v2 change is needed."""
    came = _came_back(loops, attached, backing)
    with DevicesCgroup(holder.v1) as v1:
        v1.allow(DeviceRule(True, "b", 7, came.new[1], 6))
    holder.run(f"os.mknod('/dev/new', 0o60660, os.makedev(7, {came.new[1]}))")
    assert holder.read("/dev/new") == "EPERM"
    [result] = follow(came, [holder.holder()], Hierarchies(None, UNIFIED_HIERARCHY))
    assert result.status == "done", result.line
    assert holder.read() == CONTENT[:20].decode()


def test_an_exited_container_is_skipped_and_a_reused_pid_refused(
    loops: LoopDevices, backing: Path, attached: LoopDevice, holder: Container
) -> None:
    came = _came_back(loops, attached, backing)
    programs, listed = holder.programs(), holder.listed()
    reused = ContainerProcess(holder.at.pid, holder.at.start - 1)
    [refused] = follow(came, [holder.holder(reused)], Hierarchies.now())
    assert refused.status == "refused" and "another process" in refused.reason, refused.line
    assert (holder.programs(), holder.listed()) == (programs, listed)
    assert holder.read() == ""

    holder._in.close()
    terminate(holder.process, grace=5)
    [skipped] = follow(came, [holder.holder()], Hierarchies.now())
    assert skipped.status == "skipped" and "exited" in skipped.line, skipped.line
    assert "\n" not in skipped.line


def test_a_node_that_cannot_be_replaced_undoes_the_new_numbers(
    loops: LoopDevices, backing: Path, attached: LoopDevice, holder: Container
) -> None:
    """A link planted at the path: the node is refused, and the new numbers the cgroups
    allowed first are withdrawn again; the old ones were never withdrawn."""
    came = _came_back(loops, attached, backing)
    listed = holder.listed()
    holder.run(f"os.unlink({PATH!r}); os.symlink('/etc/passwd', {PATH!r})")
    [result] = follow(came, [holder.holder()], Hierarchies.now())
    assert result.status == "refused" and "symbolic link" in result.reason, result.line
    assert "withdrawn again" in result.reason, result.line
    assert holder.listed() == listed
    holder.run(f"os.mknod('/dev/new', 0o60660, os.makedev(7, {came.new[1]}))")
    assert holder.read("/dev/new") == "EPERM"
    assert holder.run(f"out = os.readlink({PATH!r})") == "/etc/passwd"


def test_rules_that_do_not_name_the_old_numbers_are_refused_and_nothing_changes(
    loops: LoopDevices, backing: Path, attached: LoopDevice, holder: Container
) -> None:
    """A holder whose rules reach the device only through a wildcard (or not at all): no
    rule to move, so no wildcard is widened by a guess, and no cgroup or node changes."""
    came = _came_back(loops, attached, backing)
    programs, listed = holder.programs(), holder.listed()
    wildcard = with_runc_defaults(parse_oci_devices([{"allow": True, "type": "b", "access": "rw"}]))
    [result] = follow(
        came, [Holder("ns/pod/c", holder.at, holder.cgroup, wildcard)], Hierarchies.now()
    )
    assert result.status == "refused" and "no rule names b 7:" in result.reason, result.line
    assert (holder.programs(), holder.listed()) == (programs, listed)
    assert holder.read() == ""
