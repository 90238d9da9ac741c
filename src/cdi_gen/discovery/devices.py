"""The devices of one class, built from its matched records.

A device that cannot be named (a template field it lacks, a name that breaks the CDI grammar,
a name another device already holds) or whose rendered edits break a runtime rule (no ``..``
path component, no newline in an environment entry; see
:func:`~cdi_gen.cdi.validation.edits_problems`) is skipped with a :class:`DiscoveryWarning`;
the rest of the class still works.

Device names stay with the device that holds them: when a newcomer renders a name that an
advertised device already has, the newcomer is the one skipped, so a pod's allocation never
silently moves to other hardware.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cdi_gen import names
from cdi_gen.cdi.validation import edits_problems
from cdi_gen.config.models import (
    ClassConfig,
)
from cdi_gen.discovery.match import is_healthy
from cdi_gen.discovery.render import (
    RenderContext,
    TemplateError,
    device_node,
    render_edits,
    render_template,
)
from cdi_gen.errors import InvalidNameError
from cdi_gen.model import (
    NO_ATTRIBUTES,
    DeviceRecord,
    DiscoveredDevice,
    DiscoveryWarning,
    NodeInfo,
)


def _node_type(record: DeviceRecord) -> Literal["b", "c"]:
    return "b" if record.subsystem == "block" else "c"


def _group_key(cls: ClassConfig, record: DeviceRecord) -> tuple[str, str] | str:
    """(identity, label) of the record's group, or an explanation why it has none."""
    g = cls.group
    assert g is not None
    if g.by == "property":
        value = record.properties.get(g.property or "")
        if not value:
            return f"no udev property {g.property} to group by"
        return (f"property:{value}", value)
    for parent in record.parents:
        if g.subsystem is None or parent.subsystem == g.subsystem:
            return (parent.sys_path, parent.sys_name)
    if g.subsystem is not None and record.subsystem == g.subsystem:
        # A record of the subsystem with no parent in it is a parent itself (a disk, under
        # which its partitions group): its group's own node.
        return (record.sys_path, record.sys_name)
    if g.subsystem is None:
        return "no parent device to group by"
    return f"no parent in subsystem {g.subsystem!r} to group by"


MemberKey = tuple[tuple[DeviceRecord, int], ...]


@dataclass(slots=True)
class _Candidate:
    members: list[tuple[DeviceRecord, int]]
    physical: str
    group: str | None
    #: Of a class that offers a group's whole and its parts: the group's identity.
    composite: str = ""
    #: One node of a group offered alone (``offer: parts`` or ``both``), named by partName.
    part: bool = False


def build_devices(
    vendor: str,
    cls: ClassConfig,
    matched: Iterable[tuple[DeviceRecord, int]],
    incumbents: Mapping[str, str] | None = None,
    cache: dict[str, tuple[MemberKey, DiscoveredDevice]] | None = None,
) -> tuple[list[DiscoveredDevice], list[DiscoveryWarning]]:
    """Turn the matched records of a class into devices, sorted by name.

    ``incumbents`` maps names already advertised to their ``physical``; such a device keeps
    its name when another renders the same one. ``cache`` (physical → device, updated in
    place) skips rebuilding devices whose records did not change: one event in a class of a
    thousand devices then costs what one device costs. Returns the devices and the warnings
    of the devices skipped.
    """
    warnings: list[DiscoveryWarning] = []
    candidates = _candidates(cls, matched, warnings)
    named = _named(vendor, cls, candidates, warnings)
    built: list[tuple[MemberKey, DiscoveredDevice]] = []
    for name, holders in sorted(named.items()):
        cand, ctx = _holder(cls, name, holders, incumbents or {}, warnings)
        state_key = _state_key(cand.members)
        hit = cache.get(cand.physical) if cache is not None else None
        if hit is not None and hit[1].name == name and hit[0] == state_key:
            built.append((state_key, hit[1]))
            continue
        device = _checked_device(cls, cand, ctx, warnings)
        if device is not None:
            built.append((state_key, device))
    if cache is not None:
        cache.clear()
        cache.update((d.physical, (k, d)) for k, d in built)
    return [d for _, d in built], warnings


def _candidates(
    cls: ClassConfig,
    matched: Iterable[tuple[DeviceRecord, int]],
    warnings: list[DiscoveryWarning],
) -> list[_Candidate]:
    """One candidate device per record, or per group of records when the class groups."""
    ordered = sorted(matched, key=lambda m: m[0].sys_path)
    if cls.group is None:
        return [_Candidate([m], m[0].sys_path, None) for m in ordered]
    groups: dict[str, _Candidate] = {}
    for record, rule in ordered:
        key = _group_key(cls, record)
        if isinstance(key, str):
            warnings.append(DiscoveryWarning(cls.name, record.sys_path, key))
            continue
        ident, label = key
        groups.setdefault(ident, _Candidate([], ident, label)).members.append((record, rule))
    offer = cls.group.offer
    if offer == "whole":
        return list(groups.values())
    out: list[_Candidate] = []
    for whole in groups.values():
        composite = whole.physical if offer == "both" else ""
        if offer == "both":
            whole.composite = composite
            out.append(whole)
        # The group's own node (a disk's) is in the whole alone: as a part it would overlap
        # every other part.
        out += [
            _Candidate([m], m[0].sys_path, whole.group, composite, part=True)
            for m in whole.members
            if m[0].sys_path != whole.physical
        ]
    return out


def _named(
    vendor: str,
    cls: ClassConfig,
    candidates: Iterable[_Candidate],
    warnings: list[DiscoveryWarning],
) -> dict[str, list[tuple[_Candidate, RenderContext]]]:
    """The candidates by the device name they render; those without a valid one skipped."""
    named: dict[str, list[tuple[_Candidate, RenderContext]]] = {}
    for cand in candidates:
        template = cls.group.part_name if cand.part and cls.group is not None else cls.device_name
        key = "group.partName" if template is not cls.device_name else "deviceName"
        first, rule = cand.members[0]
        numa = next((r.numa_node for r, _ in cand.members if r.numa_node is not None), None)
        ctx = RenderContext(
            first,
            devnode_pattern=cls.match[rule].devnode,
            group=cand.group,
            vendor=vendor,
            cls=cls.name,
            numa=numa,
        )
        try:
            name = render_template(template, ctx)
            names.validate_device_name(name)
        except TemplateError as exc:
            why = f"{key} {template.source!r}: {exc}"
            warnings.append(DiscoveryWarning(cls.name, cand.physical, why))
            continue
        except InvalidNameError as exc:
            why = f"{key} {template.source!r} renders {exc}; device skipped"
            warnings.append(DiscoveryWarning(cls.name, cand.physical, why))
            continue
        named.setdefault(name, []).append((cand, dataclasses.replace(ctx, name=name)))
    return named


def _holder(
    cls: ClassConfig,
    name: str,
    holders: list[tuple[_Candidate, RenderContext]],
    incumbents: Mapping[str, str],
    warnings: list[DiscoveryWarning],
) -> tuple[_Candidate, RenderContext]:
    """The one candidate that gets ``name``: the incumbent if it is among them, else the
    first; the others are skipped with a warning."""
    keep = next((h for h in holders if incumbents.get(name) == h[0].physical), holders[0])
    for other in holders:
        if other is not keep:
            warnings.append(
                DiscoveryWarning(
                    cls.name,
                    other[0].physical,
                    f"device name {name!r} is already used by {keep[0].physical}; "
                    f"device skipped (make deviceName {cls.device_name.source!r} "
                    "unique, e.g. with {number} or {property[ID_SERIAL]})",
                )
            )
    return keep


def _checked_device(
    cls: ClassConfig, cand: _Candidate, ctx: RenderContext, warnings: list[DiscoveryWarning]
) -> DiscoveredDevice | None:
    """The device of ``cand``, or None (with a warning) if its edits cannot be rendered or
    break a runtime rule."""
    try:
        device = _build_device(cls, cand, ctx)
    except TemplateError as exc:
        why = f"containerEdits: {exc}; device skipped"
        warnings.append(DiscoveryWarning(cls.name, cand.physical, why))
        return None
    problems = edits_problems(device.edits, "containerEdits")
    if problems:
        why = "; ".join(str(p) for p in problems) + "; device skipped"
        warnings.append(DiscoveryWarning(cls.name, cand.physical, why))
        return None
    return device


def _state_key(members: list[tuple[DeviceRecord, int]]) -> tuple[tuple[DeviceRecord, int], ...]:
    # The action differs between an enumerated record and an event for the same state.
    return tuple(
        (r if r.action is None else dataclasses.replace(r, action=None), i) for r, i in members
    )


def _build_device(cls: ClassConfig, cand: _Candidate, ctx: RenderContext) -> DiscoveredDevice:
    opts = cls.node
    nodes: list[NodeInfo] = []
    own: list[dict[str, Any]] = []
    nets: list[dict[str, str]] = []
    for record, rule in cand.members:
        member_ctx = dataclasses.replace(
            ctx, record=record, devnode_pattern=cls.match[rule].devnode
        )
        if record.devnode is None:
            # A network interface (the only match without a node): the runtime moves it by
            # its current kernel name, which is why that name, never a template, is the host
            # end; a re-plug that renames it re-renders the device.
            nets.append(
                {
                    "hostInterfaceName": record.sys_name,
                    "name": render_template(cls.net_device.name, member_ctx),
                }
            )
            continue
        path = render_template(opts.path, member_ctx) if opts.path is not None else record.devnode
        info = NodeInfo(
            host_path=record.devnode,
            container_path=path,
            major=record.major,
            minor=record.minor,
            type=_node_type(record),
            sys_path=record.sys_path,
        )
        nodes.append(info)
        pin = opts.pin_numbers and record.major is not None and record.minor is not None
        own.append(
            device_node(
                path,
                host_path=record.devnode if path != record.devnode else None,
                type=info.type if pin else None,
                major=record.major if pin else None,
                minor=record.minor if pin else None,
                file_mode=opts.file_mode,
                permissions=opts.permissions,
                uid=opts.uid,
                gid=opts.gid,
            )
        )
    edits = render_edits(cls, ctx, own, nets)
    # DRA attributes are descriptive: one that cannot be rendered is left out (the pool
    # says which), it does not cost the device its place in the spec.
    attributes: dict[str, str] = {}
    for key, template in cls.attributes.items():
        with contextlib.suppress(TemplateError):
            attributes[key] = render_template(template, ctx)
    return DiscoveredDevice(
        name=ctx.name or "",
        class_name=cls.name,
        physical=cand.physical,
        nodes=tuple(nodes),
        numa_node=ctx.numa,
        healthy=all(is_healthy(cls.health, r) for r, _ in cand.members),
        rules=tuple(cls.match[i].describe() for _, i in cand.members),
        edits=edits,
        records=tuple(r for r, _ in cand.members),
        attributes=attributes or NO_ATTRIBUTES,
        composite=cand.composite,
        part=cand.part,
    )


def as_gone(device: DiscoveredDevice) -> DiscoveredDevice:
    """``device`` kept after its node disappeared (``whenGone``): unhealthy and gone."""
    if device.gone:
        return device
    return dataclasses.replace(device, healthy=False, gone=True)
