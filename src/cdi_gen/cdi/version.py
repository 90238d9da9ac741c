"""Which ``cdiVersion`` a spec needs, from the fields it uses.

Runtimes embed a CDI library that knows versions up to its own; a newer ``cdiVersion`` or a
field it does not know makes the whole file unusable (containerd 1.7.0-1.7.11 and podman 4.3
stop at 0.5.0). So a producer should state the *minimum* version that expresses the spec, and
must refuse, rather than emit, a spec that needs more than the runtime it targets.

The rules work on wire documents (plain dicts, camelCase keys) so that the agent can apply them
per device on its hot path; :class:`~cdi_gen.cdi.spec.Spec` objects are converted first.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdi_gen.errors import Problem, VersionError, quote

if TYPE_CHECKING:
    from cdi_gen.cdi.spec import Spec  # annotations only: the models are built on first use

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
_ORDER = {v: i for i, v in enumerate(KNOWN_VERSIONS)}
#: The reason of the requirement ``netDevices`` imposes: a runtime that reads 1.1.0 must also
#: run an OCI runtime that applies the field (see cdi_gen.cdi.runtimes.net_devices_problem).
NET_DEVICES = "netDevices"
#: containerEdits keys that need no more than the base version whatever their content.
_BASE_EDIT_KEYS = frozenset({"env", "hooks"})


def parse_version(text: str) -> tuple[int, ...]:
    """``"v0.5.0"``/``"0.5.0"`` → ``(0, 5, 0)``; raise ValueError for anything unknown."""
    bare = text[1:] if text.startswith("v") else text
    if bare not in _ORDER:
        raise ValueError(f"invalid version {quote(text)}, known: {', '.join(KNOWN_VERSIONS)}")
    return tuple(int(p) for p in bare.split("."))


def normalize(text: str) -> str:
    """Return the known version without a leading ``v``; raise ValueError if unknown."""
    parse_version(text)
    return text[1:] if text.startswith("v") else text


def newest(*versions: str) -> str:
    """The highest of known versions (BASE_VERSION for none)."""
    return max(versions, key=_ORDER.__getitem__, default=BASE_VERSION)


@dataclass(frozen=True, slots=True)
class Requirement:
    """A field at ``path`` needs ``version`` or newer (or, with ``at_most``, that or older)."""

    version: str
    path: str
    reason: str
    at_most: bool = False


def edits_requirements(edits: Mapping[str, Any], where: str) -> Iterator[Requirement]:
    """Constraints imposed by one wire ``containerEdits`` object found at ``where``."""
    if _BASE_EDIT_KEYS.issuperset(edits):
        return
    for i, mount in enumerate(edits.get("mounts") or ()):
        if mount.get("type"):
            yield Requirement("0.4.0", f"{where}.mounts[{i}].type", "mount type")
    for i, node in enumerate(edits.get("deviceNodes") or ()):
        if node.get("hostPath"):
            yield Requirement("0.5.0", f"{where}.deviceNodes[{i}].hostPath", "device node hostPath")
    rdt = edits.get("intelRdt")
    if rdt is not None:
        yield from _rdt_requirements(rdt, f"{where}.intelRdt")
    if edits.get("additionalGids"):
        yield Requirement("0.7.0", f"{where}.additionalGids", "additionalGids")
    if edits.get("netDevices"):
        yield Requirement("1.1.0", f"{where}.netDevices", NET_DEVICES)


def _rdt_requirements(rdt: Mapping[str, Any], where: str) -> Iterator[Requirement]:
    yield Requirement("0.7.0", where, "intelRdt")
    if rdt.get("schemata") is not None:
        yield Requirement("1.1.0", f"{where}.schemata", "intelRdt schemata")
    if rdt.get("enableMonitoring"):
        yield Requirement("1.1.0", f"{where}.enableMonitoring", "intelRdt enableMonitoring")
    for name in ("enableCMT", "enableMBM"):
        if rdt.get(name) is not None:
            yield Requirement("1.0.0", f"{where}.{name}", f"{name} (removed in 1.1.0)", True)


def device_requirements(device: Mapping[str, Any], where: str) -> Iterator[Requirement]:
    """Constraints imposed by one wire device object found at ``where``."""
    name = device.get("name", "")
    if name[:1].isdigit():
        yield Requirement("0.5.0", f"{where}.name", f"device name {quote(name)} starts with digit")
    if device.get("annotations"):
        yield Requirement("0.6.0", f"{where}.annotations", "device annotations")
    yield from edits_requirements(device.get("containerEdits") or {}, f"{where}.containerEdits")


def spec_requirements(
    kind: str, annotations: Mapping[str, str] | None, edits: Mapping[str, Any] | None
) -> Iterator[Requirement]:
    """Constraints of a spec's own fields (its devices aside): kind, annotations, edits.

    The one place these rules live: the builder and the document checks both call it.
    """
    if annotations:
        yield Requirement("0.6.0", "annotations", "spec annotations")
    cls = kind.partition("/")[2]
    if "." in cls:
        yield Requirement("0.6.0", "kind", f"dot in class name {quote(cls)}")
    if edits is not None:
        yield from edits_requirements(edits, "containerEdits")


def document_requirements(doc: Mapping[str, Any]) -> Iterator[Requirement]:
    """Every version constraint of a wire spec document, with where it comes from."""
    yield from spec_requirements(
        str(doc.get("kind", "")), doc.get("annotations"), doc.get("containerEdits")
    )
    for i, device in enumerate(doc.get("devices") or ()):
        yield from device_requirements(device, f"devices[{i}]")


def requirements(spec: Spec) -> list[Requirement]:
    """Every version constraint the spec's content imposes."""
    return list(document_requirements(spec.to_wire()))


def minimum_of(reqs: Iterator[Requirement] | list[Requirement]) -> str:
    """The lowest version satisfying every lower bound in ``reqs``."""
    return newest(*(r.version for r in reqs if not r.at_most))


def problems_for(reqs: list[Requirement], version: str) -> list[Problem]:
    """Why content with ``reqs`` cannot be stated as ``version``; empty when it can."""
    try:
        target = parse_version(version)
    except ValueError as exc:
        return [Problem("cdiVersion", str(exc))]
    problems: list[Problem] = []
    for req in reqs:
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


def choose_version(reqs: list[Requirement], target: str | None, what: str) -> str:
    """The version to emit: the minimum, or ``target`` if it allows everything.

    Raises :class:`VersionError` naming every field that needs a newer version than
    ``target`` (a runtime stuck at ``target`` would reject the whole file).
    """
    if target is None:
        version = minimum_of(reqs)
    else:
        try:
            version = normalize(target)
        except ValueError as exc:
            raise VersionError([Problem("cdiVersion", str(exc))]) from exc
    problems = problems_for(reqs, version)
    if problems:
        raise VersionError(problems, f"{what} as cdiVersion {version}")
    return version
