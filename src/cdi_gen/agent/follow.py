"""The ``follow`` step of a device that came back (issue 55): a device a container holds came
back with new numbers, and each holding container is given the new device at the same path.

For each holder, in this order, so that there is no moment at which the path exists and its
device is denied: (1) its device cgroup allows the new numbers (cgroup v1: ``devices.allow``;
cgroup v2: the runtime's program replaced by one that allows both); (2) the node at the path
inside the container is replaced (:func:`~cdi_gen.containernode.replace.replace_node`);
(3) the old numbers are withdrawn (v1: ``devices.deny``; v2: the program replaced by the
runtime's rules :func:`~cdi_gen.devcgroup.rules.moved` to the new numbers, every other rule
kept). A step that fails undoes the earlier ones, as far as it can, and says so.

Which hierarchies apply is read from the node's mounts: the devices controller of cgroup v1
and the unified hierarchy of cgroup v2, both on a hybrid host (a v2 cgroup with no device
program attached enforces nothing, and is left alone).

Each holder gets one :class:`FollowResult` (done, skipped: its process is gone, refused: a rule
said no, with why); one holder's problem is never an exception, and the caller gets them all
and logs them (:mod:`~cdi_gen.agent.whenback`, for a class with ``whenBack: follow``).
Blocking (one process start per holder): call it from a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cdi_gen.containernode.node import ContainerProcess, DeviceNode, Status
from cdi_gen.containernode.replace import replace_node
from cdi_gen.devcgroup.access import DeviceAccess
from cdi_gen.devcgroup.cgroupv1 import DevicesCgroup
from cdi_gen.devcgroup.cgroupv2 import ProgramCgroup
from cdi_gen.devcgroup.errors import DeviceCgroupError, DeviceRuleError
from cdi_gen.devcgroup.rules import ALL_ACCESS, DeviceRule, DeviceType, moved
from cdi_gen.errors import quote

__all__ = ["CameBack", "FollowResult", "Hierarchies", "Holder", "cgroup_relative", "follow"]


@dataclass(frozen=True, slots=True)
class CameBack:
    """A device that came back: the class's ``device`` name, its ``node`` as the spec gives
    it (path in the container, type, the NEW numbers, mode, owner, group) and the ``old``
    numbers the holders were given."""

    device: str
    node: DeviceNode
    old: tuple[int, int]

    @property
    def new(self) -> tuple[int, int]:
        return (self.node.major, self.node.minor)


@dataclass(frozen=True, slots=True)
class Holder:
    """A container holding the device: ``name`` (for its line), its init ``process`` (PID and
    start time, captured when learnt), the OCI spec's ``cgroups_path`` and the device rules
    the runtime applied (its own and its defaults, as
    :func:`~cdi_gen.devcgroup.rules.with_runc_defaults` gives them)."""

    name: str
    process: ContainerProcess
    cgroups_path: str
    rules: tuple[DeviceRule, ...]


@dataclass(frozen=True, slots=True)
class FollowResult:
    """What became of one holder; :attr:`line` is its log line."""

    holder: str
    device: str
    status: Status
    reason: str

    @property
    def line(self) -> str:
        what = f"device {quote(self.device)} came back: container {quote(self.holder)}"
        return f"{what}: {self.status}" + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True, slots=True)
class Hierarchies:
    """Where the node mounts the v1 devices controller and the v2 hierarchy (None: not)."""

    v1: str | None
    v2: str | None

    @classmethod
    def of_mounts(cls, mountinfo: str) -> Hierarchies:
        """From ``/proc/self/mountinfo``'s text: the first mount of each."""
        v1 = v2 = None
        for line in mountinfo.splitlines():
            fields = line.split(" ")
            if " - " not in line or len(fields) < 5:
                continue
            after = line.split(" - ", 1)[1].split(" ")
            fstype, options = after[0], after[2].split(",") if len(after) > 2 else []
            if fstype == "cgroup" and "devices" in options and v1 is None:
                v1 = fields[4]
            elif fstype == "cgroup2" and v2 is None:
                v2 = fields[4]
        return cls(v1, v2)

    @classmethod
    def now(cls) -> Hierarchies:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            return cls.of_mounts(f.read())


def cgroup_relative(cgroups_path: str) -> str:
    """An OCI ``cgroupsPath`` → the cgroup's path below a hierarchy's root.

    The cgroupfs form (``/kubepods/pod…/ID``) is that path; the systemd form
    (``slice:prefix:name``) is expanded as runc's systemd driver does: each ``-`` of the
    slice's name is one level of parent slices, and the container is ``prefix-name.scope``.
    """
    if cgroups_path.startswith("/"):
        return cgroups_path
    parts = cgroups_path.split(":")
    if len(parts) != 3 or not parts[0].endswith(".slice") or not parts[2]:
        raise DeviceRuleError(
            f"cgroupsPath {quote(cgroups_path)} is neither a path nor 'slice:prefix:name'"
        )
    slice_, prefix, name = parts
    words = slice_.removesuffix(".slice").split("-")
    folders = ["-".join(words[: i + 1]) + ".slice" for i in range(len(words))]
    unit = name if name.endswith(".slice") else f"{prefix}-{name}.scope" if prefix else name
    return "/" + "/".join([*folders, unit])


def _granted(rules: Iterable[DeviceRule], type_: DeviceType, numbers: tuple[int, int]) -> int:
    """The access bits ``rules`` grant the device by a rule of its own (what the runtime
    writes to ``devices.allow`` for it; a wildcard's bits are the wildcard's)."""
    access = DeviceAccess.of(rules)
    if access.default_allow:
        return 0
    return access.exceptions.get((type_, *numbers), 0)


def _both(rules: Sequence[DeviceRule], type_: DeviceType, came: CameBack) -> tuple[DeviceRule, ...]:
    """The runtime's rules with each rule naming the old numbers followed by its copy naming
    the new ones: what the program allows while the node is replaced."""
    out: list[DeviceRule] = []
    for rule in rules:
        out.append(rule)
        if rule.names(type_, *came.old):
            out.extend(moved((rule,), type_, came.old, came.new))
    return tuple(out)


class _Step:
    """One holder's cgroup changes, with what to undo when a later step fails."""

    def __init__(self, came: CameBack, holder: Holder, where: Hierarchies) -> None:
        self.came, self.holder, self.where = came, holder, where
        self.type: DeviceType = "b" if came.node.type == "b" else "c"
        self.final = moved(holder.rules, self.type, came.old, came.new)
        self.bits = _granted(self.final, self.type, came.new)
        self.relative = cgroup_relative(holder.cgroups_path)
        self.v1 = self._folder(where.v1)
        self.v2 = self._folder(where.v2)
        self.v2_program: int | None = None

    def _folder(self, hierarchy: str | None) -> str | None:
        if hierarchy is None:
            return None
        path = hierarchy.rstrip("/") + self.relative
        # A hybrid host's container may have no folder in one of them: nothing to change
        # there. The folder is opened again, without following links, to be changed.
        return path if os.path.isdir(path) else None

    def allow_new(self) -> None:
        if self.v1 is not None and self.bits:
            with DevicesCgroup(self.v1, self.where.v1 or "") as cgroup:
                cgroup.allow(DeviceRule(True, self.type, *self.came.new, self.bits))
        if self.v2 is not None:
            with ProgramCgroup(self.v2, self.where.v2 or "") as cgroup:
                attached = cgroup.attached()
                if attached:
                    rules = _both(self.holder.rules, self.type, self.came)
                    self.v2_program = cgroup.replace(rules, expected=attached[0])

    def withdraw(self, numbers: tuple[int, int], final: Sequence[DeviceRule]) -> None:
        if self.v1 is not None:
            with DevicesCgroup(self.v1, self.where.v1 or "") as cgroup:
                cgroup.deny(DeviceRule(False, self.type, *numbers, ALL_ACCESS))
        if self.v2 is not None and self.v2_program is not None:
            with ProgramCgroup(self.v2, self.where.v2 or "") as cgroup:
                self.v2_program = cgroup.replace(final, expected=self.v2_program)


def _process_problem(process: ContainerProcess) -> tuple[Status, str] | None:
    """Why the holder's process cannot be changed (exited, or its PID reused), or None."""
    now = ContainerProcess.now(process.pid)
    if now is None:
        return "skipped", f"its process {process.pid} has exited: nothing to update"
    if now.start != process.start:
        return "refused", (
            f"process {process.pid} started at {now.start}, not {process.start}: the PID "
            "went to another process"
        )
    return None


def _one(came: CameBack, holder: Holder, where: Hierarchies) -> tuple[Status, str]:
    problem = _process_problem(holder.process)
    if problem is not None:
        return problem
    try:
        step = _Step(came, holder, where)
        if step.v1 is None and step.v2 is None:
            return "refused", f"no cgroup folder for cgroupsPath {quote(holder.cgroups_path)}"
        step.allow_new()
    except (DeviceCgroupError, DeviceRuleError) as error:
        return "refused", f"allowing {came.new[0]}:{came.new[1]}: {error}"
    node = replace_node(holder.process, came.node)
    if not node.done:
        return node.status, f"the node: {node.reason}{_undo(step)}"
    try:
        step.withdraw(came.old, step.final)
    except (DeviceCgroupError, DeviceRuleError) as error:
        return "refused", f"the new node is in place, but withdrawing the old numbers: {error}"
    return "done", ""


def _undo(step: _Step) -> str:
    """The new numbers withdrawn again after the node could not be replaced."""
    try:
        step.withdraw(step.came.new, step.holder.rules)
    except (DeviceCgroupError, DeviceRuleError) as error:
        return f"; and withdrawing the new numbers again failed: {error}"
    return "; the new numbers were withdrawn again"


def follow(
    came: CameBack, holders: Iterable[Holder], where: Hierarchies | None = None
) -> list[FollowResult]:
    """Give each holder of ``came`` the device at its new numbers; one result per holder,
    in order (its :attr:`~FollowResult.line` for the caller to log)."""
    hierarchies = where or Hierarchies.now()
    return [
        FollowResult(holder.name, came.device, *_one(came, holder, hierarchies))
        for holder in holders
    ]
