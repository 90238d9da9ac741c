"""Which ``cdiVersion`` a spec needs, from the fields it uses.

Runtimes embed a CDI library that knows versions up to its own; a newer ``cdiVersion`` or a
field it does not know makes the whole file unusable (containerd 1.7.0-1.7.11 and podman 4.3
stop at 0.5.0). So a producer should state the *minimum* version that expresses the spec, and
must refuse, rather than emit, a spec that needs more than the runtime it targets.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdi_gen.errors import Problem, VersionError
from cdi_gen.spec import ContainerEdits, Spec

KNOWN_VERSIONS: tuple[str, ...] = (
    "0.1.0",
    "0.2.0",
    "0.3.0",
    "0.4.0",
    "0.5.0",
    "0.6.0",
    "0.7.0",
    "0.8.0",
    "1.0.0",
    "1.1.0",
)
#: The oldest version a producer emits: the first tagged specification.
BASE_VERSION = "0.3.0"
LATEST_VERSION = KNOWN_VERSIONS[-1]


def parse_version(text: str) -> tuple[int, ...]:
    """``"v0.5.0"``/``"0.5.0"`` → ``(0, 5, 0)``; raise ValueError for anything unknown."""
    bare = text[1:] if text.startswith("v") else text
    if bare not in KNOWN_VERSIONS:
        raise ValueError(f"invalid version {text!r}, known: {', '.join(KNOWN_VERSIONS)}")
    return tuple(int(p) for p in bare.split("."))


def normalize(text: str) -> str:
    """Return the known version without a leading ``v``; raise ValueError if unknown."""
    parse_version(text)
    return text[1:] if text.startswith("v") else text


@dataclass(frozen=True, slots=True)
class Requirement:
    """A field at ``path`` needs ``version`` or newer (or, with ``at_most``, that or older)."""

    version: str
    path: str
    reason: str
    at_most: bool = False


def _edits_requirements(edits: ContainerEdits, where: str) -> list[Requirement]:
    reqs: list[Requirement] = []
    for i, mount in enumerate(edits.mounts or ()):
        if mount.type:
            reqs.append(Requirement("0.4.0", f"{where}.mounts[{i}].type", "mount type"))
    for i, node in enumerate(edits.device_nodes or ()):
        if node.host_path:
            reqs.append(
                Requirement("0.5.0", f"{where}.deviceNodes[{i}].hostPath", "device node hostPath")
            )
    if edits.intel_rdt is not None:
        rdt = edits.intel_rdt
        reqs.append(Requirement("0.7.0", f"{where}.intelRdt", "intelRdt"))
        if rdt.schemata is not None:
            reqs.append(Requirement("1.1.0", f"{where}.intelRdt.schemata", "intelRdt schemata"))
        if rdt.enable_monitoring:
            reqs.append(
                Requirement(
                    "1.1.0", f"{where}.intelRdt.enableMonitoring", "intelRdt enableMonitoring"
                )
            )
        for name, value in (("enableCMT", rdt.enable_cmt), ("enableMBM", rdt.enable_mbm)):
            if value is not None:
                reqs.append(
                    Requirement(
                        "1.0.0", f"{where}.intelRdt.{name}", f"{name} (removed in 1.1.0)", True
                    )
                )
    if edits.additional_gids:
        reqs.append(Requirement("0.7.0", f"{where}.additionalGids", "additionalGids"))
    if edits.net_devices:
        reqs.append(Requirement("1.1.0", f"{where}.netDevices", "netDevices"))
    return reqs


def requirements(spec: Spec) -> list[Requirement]:
    """Every version constraint the spec's content imposes, with where it comes from."""
    reqs: list[Requirement] = []
    if spec.annotations:
        reqs.append(Requirement("0.6.0", "annotations", "spec annotations"))
    if "." in spec.cls:
        reqs.append(Requirement("0.6.0", "kind", f"dot in class name {spec.cls!r}"))
    if spec.container_edits is not None:
        reqs.extend(_edits_requirements(spec.container_edits, "containerEdits"))
    for i, device in enumerate(spec.devices):
        where = f"devices[{i}]"
        if device.name[:1].isdigit():
            reqs.append(
                Requirement(
                    "0.5.0", f"{where}.name", f"device name {device.name!r} starts with digit"
                )
            )
        if device.annotations:
            reqs.append(Requirement("0.6.0", f"{where}.annotations", "device annotations"))
        reqs.extend(_edits_requirements(device.container_edits, f"{where}.containerEdits"))
    return reqs


def minimum_version(spec: Spec) -> str:
    """The lowest version whose rules allow every field the spec uses."""
    needed = [r.version for r in requirements(spec) if not r.at_most]
    return max(needed, key=parse_version, default=BASE_VERSION)


def version_problems(spec: Spec, version: str) -> list[Problem]:
    """Why ``spec`` cannot be stated as ``version``; empty when it can."""
    try:
        target = parse_version(version)
    except ValueError as exc:
        return [Problem("cdiVersion", str(exc))]
    problems: list[Problem] = []
    for req in requirements(spec):
        bound = parse_version(req.version)
        if req.at_most and target > bound:
            problems.append(
                Problem(
                    req.path,
                    f"{req.reason} is only valid up to cdiVersion {req.version}, not {version}",
                )
            )
        elif not req.at_most and target < bound:
            problems.append(
                Problem(
                    req.path,
                    f"{req.reason} needs cdiVersion {req.version} or newer, "
                    f"the target is {version}",
                )
            )
    return problems


def apply_version(spec: Spec, target: str | None = None) -> Spec:
    """Return ``spec`` with ``cdiVersion`` set to its minimum, or to the pinned ``target``.

    Raises :class:`VersionError` naming every field that needs a newer version than
    ``target`` (a runtime stuck at ``target`` would reject the whole file).
    """
    if target is None:
        version = minimum_version(spec)
    else:
        try:
            version = normalize(target)
        except ValueError as exc:
            raise VersionError([Problem("cdiVersion", str(exc))]) from exc
    problems = version_problems(spec, version)
    if problems:
        raise VersionError(problems, f"{spec.kind} as cdiVersion {version}")
    if spec.cdi_version == version:
        return spec
    return spec.model_copy(update={"cdi_version": version})
