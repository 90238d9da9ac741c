"""A class's CDI spec: each device judged, the document of those that can be in it, and the
devices left out and why.

:func:`class_spec` is the one path from a class's devices to its spec. The agent calls it on
every change of a class; ``cdi-gen render``, ``write`` and ``slices`` call it through
:meth:`~cdi_gen.discovery.inventory.Discovery.class_spec`. So what the CLI previews is what
the agent writes and advertises, and a device is left out alike everywhere.

A device, never its class, is left out when its entry breaks a runtime rule
(``invalid-device``) or needs a newer cdiVersion than the class is pinned to, or, unpinned,
than the node's runtimes read when they are known (``version``, see
:class:`~cdi_gen.cdi.runtimes.Ceiling`): a runtime that reads only that version refuses the
whole file, which would lose every device of the class for one; pinned or not, a device
moving a network interface is left out (``version``) where a runtime's runc is known to
ignore ``netDevices``. A device is also left out
(``invalid-device``) when a host path of its extra ``deviceNodes`` or bind ``mounts`` is
missing and not marked ``optional``: a container asking for it would fail at creation. The
caller says how to look (``exists``), so this module does no I/O itself; paths are checked
after rendering, since a template makes them per device. Each :class:`LeftOut` names the
device, the field and the rule.

The agent passes a cache of verdicts, so a device is judged once, when it appears or its
edits change, and rewriting a class's spec after an event costs a list of references and one
assembly (:mod:`cdi_gen.cdi.builder`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from cdi_gen.cdi.builder import DeviceEntry, assemble, build_entry
from cdi_gen.cdi.version import KNOWN_VERSIONS, Requirement, choose_version, spec_requirements
from cdi_gen.config.models import ClassConfig
from cdi_gen.discovery.sharing import expand_devices
from cdi_gen.errors import Problem, SpecError, VersionError, quote
from cdi_gen.model import DiscoveredDevice

if TYPE_CHECKING:
    # Annotations only: finding the runtimes (subprocess, mmap) is the caller's business.
    from cdi_gen.cdi.runtimes import Ceiling

__all__ = [
    "ClassSpec",
    "LeftOut",
    "Verdicts",
    "class_spec",
    "missing_host_paths",
    "spec_devices",
    "within",
]

#: The host's folders the agent sees as the host's wherever it runs: its DaemonSet mounts
#: them (the device nodes it serves, their sysfs). Elsewhere a pod sees its own image, so a
#: host path there cannot be told missing from it: ``doctor`` and ``render``/``write``, run
#: on the host, check those.
AGENT_FOLDERS = ("/dev", "/sys")

#: Why a device is left out of its class's spec; also its ``cdi_gen_failures_total`` reason.
LeftOutReason = Literal["invalid-device", "version"]


@dataclass(frozen=True, slots=True)
class LeftOut:
    """A device left out of its class's spec (and so of what the class advertises), and why."""

    #: Its CDI device name (a slot's name for a shared device).
    device: str
    #: The physical device behind it (its sys path), as the agent's log lines name devices.
    physical: str
    reason: LeftOutReason
    #: Each field at fault and the rule it breaks (``devices['x'].name: ... needs cdiVersion
    #: 0.5.0 or newer, the target is 0.3.0``).
    problems: tuple[Problem, ...]
    #: What of this node left it out, beyond the config's rules: its runtimes (``runtime``,
    #: reading an older cdiVersion) or a host path it lacks (``host path``); "" for none.
    #: ``/readyz`` names the classes degraded so; a host path, which may appear without the
    #: device's edits changing, is judged again at every build rather than kept as a verdict.
    node: Literal["", "runtime", "host path"] = ""

    @property
    def why(self) -> str:
        return "; ".join(map(str, self.problems))

    def __str__(self) -> str:
        return f"device {quote(self.device)} left out of the spec ({self.reason}): {self.why}"


@dataclass(frozen=True, slots=True)
class ClassSpec:
    """What :func:`class_spec` made of a class's devices."""

    #: The wire spec document, or None when no device is left to put in it.
    document: dict[str, Any] | None
    #: Every device left out, in spec order.
    left_out: tuple[LeftOut, ...] = ()
    #: Those of ``left_out`` judged by this call rather than taken from the cache: what a
    #: caller that logs each device once logs now.
    fresh: tuple[LeftOut, ...] = ()


#: A class's verdicts by device name: the edits and the cdiVersion target judged, and the
#: device's entry or why it is left out. Kept by the caller, one per class.
Verdicts = dict[str, tuple[Mapping[str, Any], str | None, DeviceEntry | LeftOut]]


def spec_devices(cls: ClassConfig, devices: Iterable[DiscoveredDevice]) -> list[DiscoveredDevice]:
    """The CDI devices of a class in spec order: by name, each shared device as its slots
    (slot 2 before 10, as the agent advertises them)."""
    ordered = sorted(devices, key=lambda d: d.name)
    if cls.sharing.replicas <= 1:
        return ordered
    return list(expand_devices(ordered, cls.sharing.replicas)[0])


def class_spec(
    vendor: str,
    cls: ClassConfig,
    devices: Sequence[DiscoveredDevice],
    *,
    cdi_version: str | None = None,
    cache: Verdicts | None = None,
    ceiling: Ceiling | None = None,
    exists: Callable[[str], bool] | None = None,
) -> ClassSpec:
    """The spec of class ``cls`` holding ``devices`` (in spec order, see :func:`spec_devices`),
    each device that cannot be in it left out.

    ``cdiVersion`` is ``cdi_version`` when given, else the class's pin, else the minimum the
    devices kept need; unpinned, a device needing more than ``ceiling`` (the node's runtimes)
    is left out, and pinned or not, one moving a network interface that a runtime's runc
    would ignore (``Ceiling.net_devices``). With ``exists``, a device whose required host
    path it denies is left out (see :func:`missing_host_paths`). With ``cache``, a device
    whose edits and target are those of its cached verdict is not judged again, and each new
    verdict is stored; the caller drops a device's verdict when the device goes (so that it
    is judged, and logged, afresh when it comes back). Pure otherwise: no I/O but ``exists``,
    no logging.

    Raises :class:`~cdi_gen.errors.SpecError` only when the devices kept cannot share one
    document (two with one name, or fields no single cdiVersion allows together).
    """
    kind = f"{vendor}/{cls.name}"
    target = cdi_version or cls.cdi_version
    # A pin is the user's word: the ceiling bounds only the version chosen for them. Not
    # whether a runc moves interfaces: a pinned spec moving them would be read and ignored.
    limit = None if target is not None else ceiling
    if limit is None and ceiling is not None and ceiling.net_devices is not None:
        limit = dataclasses.replace(ceiling, limit=KNOWN_VERSIONS[-1])
    # The verdict's key: the same target under another ceiling is judged again.
    key = target if limit is None else f"{target}<={limit.limit};{limit.net_devices}"
    # The spec's own fields count for each device: a class name with a dot (0.6.0) under an
    # older pin leaves out every device, each naming ``kind``, rather than failing the class.
    own = tuple(spec_requirements(kind, None, None))
    checks_paths = exists is not None and _has_extra_paths(cls)
    entries: list[DeviceEntry] = []
    left_out: list[LeftOut] = []
    fresh: list[LeftOut] = []
    for device in devices:
        cached = None if cache is None else cache.get(device.name)
        # Discovery hands out the same edits object while a device is unchanged: ``is``
        # first spares comparing every field of every device on every event.
        valid = (
            cached is not None
            and cached[1] == key
            and (cached[0] is device.edits or cached[0] == device.edits)
        )
        if valid and cached is not None and not _rechecked(cached[2]):
            verdict = cached[2]
        else:
            verdict = _judge(device, own, target, limit)
        if checks_paths and exists is not None and not isinstance(verdict, LeftOut):
            missing = missing_host_paths(cls, device, exists)
            if missing:
                verdict = LeftOut(
                    device.name, device.physical, "invalid-device", tuple(missing), "host path"
                )
        if cache is not None and (cached is None or verdict is not cached[2]):
            cache[device.name] = (device.edits, key, verdict)
        if isinstance(verdict, LeftOut):
            # Fresh unless it is the verdict already given (a path still missing).
            if not (valid and cached is not None and cached[2] == verdict):
                fresh.append(verdict)
            left_out.append(verdict)
        else:
            entries.append(verdict)
    document = assemble(kind, entries, target_version=target) if entries else None
    return ClassSpec(document, tuple(left_out), tuple(fresh))


def _rechecked(verdict: DeviceEntry | LeftOut) -> bool:
    return isinstance(verdict, LeftOut) and verdict.node == "host path"


def _has_extra_paths(cls: ClassConfig) -> bool:
    edits = cls.container_edits
    return bool(edits.device_nodes or edits.mounts)


#: Mount types whose ``hostPath`` is a path of the host (others name a source: tmpfs, proc).
_BIND_TYPES = frozenset({"bind", "rbind", "none"})


def missing_host_paths(
    cls: ClassConfig, device: DiscoveredDevice, exists: Callable[[str], bool]
) -> list[Problem]:
    """The host paths of ``device``'s extra ``deviceNodes`` and bind ``mounts`` (as rendered
    for it) that ``exists`` denies, those marked ``optional`` aside: a runtime fails the
    container at creation for each. The device's own nodes are udev's and exist."""
    edits = device.edits
    config = cls.container_edits
    problems: list[Problem] = []
    extra = (edits.get("deviceNodes") or ())[len(device.nodes) :]
    for i, (node, node_config) in enumerate(zip(extra, config.device_nodes, strict=True)):
        field = "hostPath" if node.get("hostPath") else "path"
        host = node[field]
        if not node_config.optional and not exists(host):
            problems.append(_missing(f"containerEdits.deviceNodes[{i}].{field}", host))
    for i, (mount, mount_config) in enumerate(
        zip(edits.get("mounts") or (), config.mounts, strict=True)
    ):
        host = mount["hostPath"]
        bind = mount.get("type") in (None, *_BIND_TYPES)
        if bind and host.startswith("/") and not mount_config.optional and not exists(host):
            problems.append(_missing(f"containerEdits.mounts[{i}].hostPath", host))
    return problems


def within(
    folders: Sequence[str],
    exists: Callable[[str], bool],
    unseen: Callable[[str], object] | None = None,
) -> Callable[[str], bool]:
    """``exists`` for paths under ``folders``; any other path counts as present (unknown),
    and is handed to ``unseen`` (for a caller that names what it could not check)."""
    prefixes = tuple(f.rstrip("/") + "/" for f in folders)

    def check(path: str) -> bool:
        if path.startswith(prefixes):
            return exists(path)
        if unseen is not None:
            unseen(path)
        return True

    return check


def _missing(where: str, host: str) -> Problem:
    return Problem(
        where,
        f"host path {quote(host)} does not exist: a container asking for the device would "
        "fail at creation (mark it optional: true if it appears later)",
    )


def _judge(
    device: DiscoveredDevice,
    own: tuple[Requirement, ...],
    target: str | None,
    ceiling: Ceiling | None,
) -> DeviceEntry | LeftOut:
    """The device's validated entry, or why it cannot be in a spec stated as ``target``
    (or, unpinned, read by the runtime of ``ceiling``)."""
    try:
        entry = build_entry(device.name, device.edits)
        # Also without a target: a device asking for fields of versions that exclude each
        # other (a 1.1.0 field beside one removed in 1.1.0) fits no document.
        reqs = [*entry.requirements, *own]
        choose_version(reqs, target, device.name)
    except VersionError as exc:
        return LeftOut(device.name, device.physical, "version", tuple(exc.problems))
    except SpecError as exc:
        return LeftOut(device.name, device.physical, "invalid-device", tuple(exc.problems))
    if ceiling is not None and (problems := ceiling.problems(reqs)):
        return LeftOut(device.name, device.physical, "version", tuple(problems), "runtime")
    return entry
