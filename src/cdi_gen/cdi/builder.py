"""Pre-validated device entries, and assembling a class's spec document from them.

The agent rewrites a class's spec on every hotplug event. Judging and serialising the whole
spec through the pydantic models costs tens of microseconds per device, so the hot path works
on wire dicts instead: each device is validated once, when it appears, into an immutable
:class:`DeviceEntry` carrying its version requirements; assembling the spec is then a list of
references, a uniqueness check and the version choice, and serialisation is one orjson call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cdi_gen import names
from cdi_gen.cdi.validation import device_problems
from cdi_gen.cdi.version import (
    Requirement,
    choose_version,
    device_requirements,
    spec_requirements,
)
from cdi_gen.errors import InvalidNameError, Problem, SpecError


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    """One CDI device in wire form (``{"name", "containerEdits", ...}``), already validated."""

    name: str
    doc: Mapping[str, Any]
    requirements: tuple[Requirement, ...]


def build_entry(name: str, container_edits: Mapping[str, Any]) -> DeviceEntry:
    """Validate one device and return its entry.

    ``container_edits`` is a wire ``containerEdits`` dict; it is kept by reference, so the
    caller must not mutate it afterwards. Raises :class:`SpecError` listing every problem.
    """
    doc: dict[str, Any] = {"name": name, "containerEdits": container_edits}
    where = f"devices[{name!r}]"
    problems = device_problems(doc, where)
    if problems:
        raise SpecError(problems)
    return DeviceEntry(name, doc, tuple(device_requirements(doc, where)))


@lru_cache(maxsize=256)
def _checked_kind(kind: str) -> str:
    names.parse_kind(kind)
    return kind


def _kind_and_device_problems(kind: str, entries: Sequence[DeviceEntry]) -> list[Problem]:
    problems: list[Problem] = []
    try:
        _checked_kind(kind)
    except InvalidNameError as exc:
        problems.append(Problem("kind", str(exc)))
    if not entries:
        problems.append(Problem("devices", "invalid spec, no devices"))
    if len({e.name for e in entries}) != len(entries):
        seen: set[str] = set()
        for e in entries:
            if e.name in seen:
                problems.append(Problem("devices", f"invalid spec, multiple device {e.name!r}"))
            seen.add(e.name)
    return problems


def assemble(
    kind: str, entries: Sequence[DeviceEntry], *, target_version: str | None = None
) -> dict[str, Any]:
    """The wire spec document of ``kind`` holding ``entries`` in the given order.

    ``cdiVersion`` is the minimum the content needs, or ``target_version`` when pinned.
    Raises :class:`SpecError` for an invalid kind, no devices or a repeated device name, and
    :class:`~cdi_gen.errors.VersionError` when the pinned version is too old for a field.
    """
    problems = _kind_and_device_problems(kind, entries)
    reqs: list[Requirement] = [r for e in entries for r in e.requirements]
    reqs += spec_requirements(kind, None, None)
    if problems:
        raise SpecError(problems, kind)
    return {
        "cdiVersion": choose_version(reqs, target_version, kind),
        "kind": kind,
        "devices": [e.doc for e in entries],
    }
