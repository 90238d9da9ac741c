"""Who holds a device of a class: the kubelet's pod-resources answer matched against what the
kubelet knows the device by, then each holding container's process, start time, cgroup path
and device rules from the runtime's CRI socket (blocking: call from a worker thread).

What the kubelet knows a device by (:class:`DeviceKeys`): for a device-plugin class, the
extended resource and the device IDs (the device's name, or each of its sharing slots); for a
DRA class, the driver, the pool (the node) and the device's names in the pool, and its CDI
names (a kubelet before 1.31 sends only these). A container the pod-resources answer lists
but the runtime does not run, or whose answer cannot be trusted, is one line in
:attr:`Holders.notes`; a container whose process is gone or started after the container did
(its PID given to another process) is kept, with its problem, for its own line.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from cdi_gen.agent.follow import Holder
from cdi_gen.containernode.linux import process_start
from cdi_gen.containernode.node import ContainerProcess
from cdi_gen.devcgroup.errors import DeviceRuleError
from cdi_gen.devcgroup.rules import DeviceType, moved, parse_oci_devices, with_runc_defaults
from cdi_gen.kubelet.containers import RunningContainer, find_running
from cdi_gen.kubelet.podresources import Assignments, ContainerRef, read_assignments
from cdi_gen.localclient import Deadline

__all__ = ["DeviceKeys", "FoundHolder", "Holders", "as_followed", "find_holders", "wall_start"]

#: A process may start this long after its container's recorded start (the runtime records
#: the start after the process exists; the clocks are read apart): later, it is another.
START_SLACK_NS = 2_000_000_000


@dataclass(frozen=True, slots=True)
class DeviceKeys:
    """What the kubelet knows one device by (see the module docstring)."""

    resource: str = ""
    device_ids: tuple[str, ...] = ()
    driver: str = ""
    pool: str = ""
    pool_devices: tuple[str, ...] = ()
    cdi_names: tuple[str, ...] = ()

    def holders(self, assignments: Assignments) -> tuple[ContainerRef, ...]:
        refs: list[ContainerRef] = []
        for device_id in self.device_ids:
            refs.extend(assignments.holding_plugin_device(self.resource, device_id))
        for name in self.pool_devices:
            refs.extend(assignments.holding_claim_device(self.driver, self.pool, name))
        for cdi in self.cdi_names:
            refs.extend(assignments.holding_cdi_device(cdi))
        return tuple(dict.fromkeys(refs))


@dataclass(frozen=True, slots=True)
class FoundHolder:
    """A holding container as the runtime runs it; ``holder`` for the follow step, or
    ``problem`` (status and why) when its process cannot be the container's."""

    running: RunningContainer
    holder: Holder | None
    problem: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Holders:
    found: tuple[FoundHolder, ...]
    notes: tuple[str, ...]


def _boot_seconds() -> float:
    with open("/proc/stat", encoding="ascii") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def wall_start(ticks: int) -> int:
    """A process start time (clock ticks after boot) as ns since the epoch."""
    return int((_boot_seconds() + ticks / os.sysconf("SC_CLK_TCK")) * 1e9)


def _holder(running: RunningContainer) -> FoundHolder:
    name = str(running.ref)
    start = process_start(running.pid)
    if start is None:
        return FoundHolder(running, None, ("skipped", f"its process {running.pid} has exited"))
    if not running.started_at:
        return FoundHolder(
            running, None, ("refused", "the runtime gave no start time to check its PID by")
        )
    if wall_start(start) > running.started_at + START_SLACK_NS:
        return FoundHolder(
            running,
            None,
            (
                "refused",
                f"process {running.pid} started after the container did: the PID went to "
                "another process",
            ),
        )
    try:
        paths = [d["path"] for d in running.devices if isinstance(d.get("path"), str)]
        rules = with_runc_defaults(parse_oci_devices(list(running.device_rules)), paths)  # type: ignore[arg-type]
    except DeviceRuleError as exc:
        return FoundHolder(running, None, ("refused", f"its device rules: {exc}"))
    process = ContainerProcess(running.pid, start)
    return FoundHolder(running, Holder(name, process, running.cgroups_path, rules))


def find_holders(keys: DeviceKeys, pod_resources: Path, cri: Path, deadline: Deadline) -> Holders:
    """The containers holding the device ``keys`` names, each with its process checked.
    Raises :class:`~cdi_gen.localclient.LocalCallError` (one line) when a socket
    gives no answer within ``deadline``."""
    # Rounded: the bound is named in the line of a socket that gives no answer.
    assignments = read_assignments(pod_resources, round(deadline.remaining(), 2))
    refs = keys.holders(assignments)
    if not refs:
        return Holders((), assignments.notes)
    running = find_running(cri, refs, round(deadline.remaining(), 2))
    found = tuple(_holder(r) for r in running.containers)
    return Holders(found, (*assignments.notes, *running.notes))


def as_followed(
    found: FoundHolder, path: str, type_: DeviceType, old: tuple[int, int]
) -> Holder | None:
    """``found``'s holder with its rules as an earlier follow left them: the runtime's spec
    still names the numbers the container was created with (its ``linux.devices`` entry at
    ``path``); when the device has come back before and was followed, the container's
    cgroup names ``old`` instead, and so must the rules a follow starts from."""
    holder = found.holder
    if holder is None:
        return None
    created = None
    for device in found.running.devices:
        major, minor = device.get("major"), device.get("minor")
        if device.get("path") == path and isinstance(major, int) and isinstance(minor, int):
            created = (major, minor)
    if created is None or created == old:
        return holder
    try:
        return dataclasses.replace(holder, rules=moved(holder.rules, type_, created, old))
    except DeviceRuleError:
        return holder  # no rule names the created numbers: the follow step refuses it
