"""Pure discovery: udev records → matched devices per class → CDI specs and advertised lists.

Nothing here does I/O or imports pyudev: :class:`Discovery` is fed records (a full
enumeration or events) and answers, per class, the new device set and what changed, so the
agent can keep its ordering invariant: on add, write the spec and then advertise; on remove,
withdraw and then rewrite the spec (:class:`ClassChange` carries both lists).

Matching follows udev: ``subsystem`` is exact, the other keys are shell globs where ``|``
separates alternatives; ``driver`` matches the device or any parent (DRIVERS); all
``parentAttributes`` of a rule must hold on one device of the chain, the device itself
included (ATTRS). A device that cannot be named (a template field it lacks, a name that breaks
the CDI grammar, a name another device already holds) is skipped with a
:class:`DiscoveryWarning`; the rest of the class still works.

Device names stay with the device that holds them: when a newcomer renders a name that an
advertised device already has, the newcomer is the one skipped, so a pod's allocation never
silently moves to other hardware.

udev values are not trusted: anyone who can name a USB serial number or a loop device's
backing file chooses them. A value substituted into a template must be at most
:data:`MAX_VALUE_BYTES` long and hold no control character, and the rendered edits must pass
:func:`~cdi_gen.cdi.validation.edits_problems` (no ``..`` path component, no newline in an
environment entry); otherwise the device is skipped with a warning quoting the field and the
value, truncated.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from cdi_gen import names
from cdi_gen.cdi.spec import ContainerEdits, Device, DeviceNode, Hook, Mount, Spec
from cdi_gen.cdi.validation import edits_problems
from cdi_gen.cdi.version import apply_version
from cdi_gen.config.models import (
    AgentConfig,
    ClassConfig,
    Field_,
    HealthConfig,
    MatchRule,
    Template,
)
from cdi_gen.errors import InvalidNameError, quote
from cdi_gen.model import (
    AdvertisedDevice,
    ClassChange,
    DeviceRecord,
    DiscoveredDevice,
    DiscoveryWarning,
    NodeInfo,
    RecordWants,
)

__all__ = [
    "MAX_VALUE_BYTES",
    "ClassChange",
    "DiscoveredDevice",
    "Discovery",
    "DiscoveryWarning",
    "NodeInfo",
    "build_spec",
    "match_record",
    "matches",
    "render_template",
]

# ---------------------------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _glob(pattern: str) -> re.Pattern[str]:
    # udev globs: fnmatch plus "|" alternatives.
    return re.compile("|".join(fnmatch.translate(p) for p in pattern.split("|")))


def glob_match(pattern: str, value: str | None) -> bool:
    """udev glob semantics; a missing value never matches."""
    return value is not None and _glob(pattern).match(value) is not None


def _attrs_match(wanted: Mapping[str, str], have: Mapping[str, str]) -> bool:
    # udev compares sysfs values with trailing whitespace removed.
    return all(glob_match(g, _rstrip(have.get(k))) for k, g in wanted.items())


def _rstrip(value: str | None) -> str | None:
    return value.rstrip() if value is not None else None


def matches(rule: MatchRule, record: DeviceRecord) -> bool:
    """Whether ``record`` satisfies every condition of ``rule``."""
    if rule.subsystem is not None and record.subsystem != rule.subsystem:
        return False
    if rule.kernel is not None and not glob_match(rule.kernel, record.sys_name):
        return False
    if rule.devnode is not None and not glob_match(rule.devnode, record.devnode):
        return False
    if rule.driver is not None and not any(glob_match(rule.driver, d) for d in record.drivers):
        return False
    if rule.properties and not all(
        glob_match(g, record.properties.get(k)) for k, g in rule.properties.items()
    ):
        return False
    if rule.attributes and not _attrs_match(rule.attributes, record.attributes):
        return False
    return not rule.parent_attributes or _chain_match(rule.parent_attributes, record)


def _chain_match(wanted: Mapping[str, str], record: DeviceRecord) -> bool:
    # ATTRS: every attribute on one device of the chain, the device itself included.
    chain = [record.attributes, *(p.attributes for p in record.parents)]
    return any(_attrs_match(wanted, attrs) for attrs in chain)


def is_healthy(health: HealthConfig | None, record: DeviceRecord) -> bool:
    """Whether ``record`` is a healthy member of its device: its node exists and it passes
    the class's health check (:class:`~cdi_gen.config.models.HealthConfig`), if any."""
    if not record.node_exists:
        return False
    if health is None:
        return True
    if health.attributes and not _attrs_match(health.attributes, record.attributes):
        return False
    return not health.parent_attributes or _chain_match(health.parent_attributes, record)


def match_record(cls: ClassConfig, record: DeviceRecord) -> int | None:
    """Index of the first rule of ``cls`` that ``record`` satisfies, or None.

    Only devices with a device node can be handed to a container, so only they match.
    """
    if not record.devnode:
        return None
    for i, rule in enumerate(cls.match):
        if matches(rule, record):
            return i
    return None


def _could_match(rule: MatchRule, subsystem: str, sys_name: str) -> bool:
    return (rule.subsystem is None or rule.subsystem == subsystem) and (
        rule.kernel is None or glob_match(rule.kernel, sys_name)
    )


# ---------------------------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------------------------


class TemplateError(ValueError):
    """A template field has no value for this device (``field`` says which)."""

    def __init__(self, field_: Field_, reason: str) -> None:
        super().__init__(field_, reason)
        self.field = field_
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


@dataclass(frozen=True, slots=True)
class RenderContext:
    """What templates of one device can refer to."""

    record: DeviceRecord
    group: str | None = None
    name: str | None = None
    vendor: str = ""
    cls: str = ""
    numa: int | None = None


def _value(f: Field_, ctx: RenderContext) -> str | None:
    r = ctx.record
    match f.name:
        case "kernel":
            return r.sys_name
        case "number":
            return r.sys_number
        case "major":
            return None if r.major is None else str(r.major)
        case "minor":
            return None if r.minor is None else str(r.minor)
        case "devnode":
            return r.devnode
        case "devname":
            return r.devnode.removeprefix("/dev/") if r.devnode else None
        case "subsystem":
            return r.subsystem
        case "devtype":
            return r.devtype
        case "driver":
            return r.driver
        case "group":
            return ctx.group
        case "name":
            return ctx.name
        case "vendor":
            return ctx.vendor
        case "class":
            return ctx.cls
        case "numa":
            return "" if ctx.numa is None else str(ctx.numa)
        case "property":
            return r.properties.get(f.key or "")
        case "attribute":
            return _rstrip(r.attributes.get(f.key or ""))
        case "parent_attribute":
            for attrs in (r.attributes, *(p.attributes for p in r.parents)):
                if (v := attrs.get(f.key or "")) is not None:
                    return v.rstrip()
            return None
    raise TemplateError(f, "unknown field")  # pragma: no cover - config refuses these


#: Longest udev value a template takes. Identifying values (serial numbers, models, by-path
#: names, modaliases) stay well under 256 bytes; sysfs attributes can be a whole page (4 KiB),
#: and such a blob is no name. 1 KiB leaves room for long identifiers while a rendered path
#: stays far below PATH_MAX and a class of a thousand devices keeps a spec of bounded size.
MAX_VALUE_BYTES = 1024
#: C0 controls, DEL and C1 controls: none belongs in a name, a path or an environment value.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _unsafe(value: str) -> str | None:
    """Why a udev value may not be substituted, or None."""
    if (
        len(value) > MAX_VALUE_BYTES // 4
        and len(value.encode("utf-8", "surrogatepass")) > MAX_VALUE_BYTES
    ):
        return f"value {quote(value)} is longer than {MAX_VALUE_BYTES} bytes"
    if (bad := _CONTROL_RE.search(value)) is not None:
        return f"value {quote(value)} has control character {bad.group()!r}"
    return None


_WHY_MISSING = {
    "number": "the kernel name has no trailing number",
    "major": "the device has no major number",
    "minor": "the device has no minor number",
    "devnode": "the device has no device node",
    "devname": "the device has no device node",
    "devtype": "the device has no DEVTYPE",
    "driver": "no driver is bound to the device",
    "group": "the class has no group",
    "name": "not available in the device name itself",
}


def render_template(template: Template, ctx: RenderContext) -> str:
    """Substitute every field; raise TemplateError naming the first field without a value."""
    out: list[str] = []
    for part in template.parts:
        if isinstance(part, str):
            out.append(part)
            continue
        value = _value(part, ctx)
        if value is None:
            if part.name == "property":
                reason = f"the device has no udev property {part.key} (is /run/udev mounted?)"
            elif part.name in ("attribute", "parent_attribute"):
                where = "the device" if part.name == "attribute" else "no parent"
                reason = f"{where} has no readable sysfs attribute {part.key!r}"
            else:
                reason = _WHY_MISSING.get(part.name, "no value")
            raise TemplateError(part, reason)
        if (why := _unsafe(value)) is not None:
            raise TemplateError(part, why)
        out.append(value)
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------------------------


def _node_type(record: DeviceRecord) -> Literal["b", "c"]:
    return "b" if record.subsystem == "block" else "c"


def _render_edits(cls: ClassConfig, ctx: RenderContext) -> ContainerEdits:
    e = cls.container_edits

    def r(t: Template) -> str:
        return render_template(t, ctx)

    def rl(ts: Iterable[Template] | None) -> list[str] | None:
        return None if ts is None else [r(t) for t in ts]

    return ContainerEdits(
        env=[r(t) for t in e.env] or None,
        device_nodes=[
            DeviceNode(
                path=r(n.path),
                host_path=r(n.host_path) if n.host_path is not None else None,
                type=n.type,
                major=n.major,
                minor=n.minor,
                file_mode=n.file_mode,
                permissions=n.permissions,
                uid=n.uid,
                gid=n.gid,
            )
            for n in e.device_nodes
        ]
        or None,
        mounts=[
            Mount(
                host_path=r(m.host_path),
                container_path=r(m.container_path),
                options=rl(m.options),
                type=m.type,
            )
            for m in e.mounts
        ]
        or None,
        hooks=[
            Hook(
                hook_name=h.hook_name,
                path=r(h.path),
                args=rl(h.args),
                env=rl(h.env),
                timeout=h.timeout,
            )
            for h in e.hooks
        ]
        or None,
        additional_gids=list(e.additional_gids) or None,
    )


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
    if g.subsystem is None:
        return "no parent device to group by"
    return f"no parent in subsystem {g.subsystem!r} to group by"


_MemberKey = tuple[tuple[DeviceRecord, int], ...]


@dataclass(slots=True)
class _Candidate:
    members: list[tuple[DeviceRecord, int]]
    physical: str
    group: str | None


def build_devices(
    vendor: str,
    cls: ClassConfig,
    matched: Iterable[tuple[DeviceRecord, int]],
    incumbents: Mapping[str, str] | None = None,
    cache: dict[str, tuple[_MemberKey, DiscoveredDevice]] | None = None,
) -> tuple[list[DiscoveredDevice], list[DiscoveryWarning]]:
    """Turn the matched records of a class into devices, sorted by name.

    ``incumbents`` maps names already advertised to their ``physical``; such a device keeps
    its name when another renders the same one. ``cache`` (physical → device, updated in
    place) skips rebuilding devices whose records did not change: one event in a class of a
    thousand devices then costs what one device costs. Returns the devices and the warnings
    of the devices skipped.
    """
    warnings: list[DiscoveryWarning] = []
    candidates: list[_Candidate] = []
    ordered = sorted(matched, key=lambda m: m[0].sys_path)
    if cls.group is None:
        candidates = [_Candidate([m], m[0].sys_path, None) for m in ordered]
    else:
        groups: dict[str, _Candidate] = {}
        for record, rule in ordered:
            key = _group_key(cls, record)
            if isinstance(key, str):
                warnings.append(DiscoveryWarning(cls.name, record.sys_path, key))
                continue
            ident, label = key
            groups.setdefault(ident, _Candidate([], ident, label)).members.append((record, rule))
        candidates = list(groups.values())

    named: dict[str, list[tuple[_Candidate, RenderContext]]] = {}
    for cand in candidates:
        first = cand.members[0][0]
        numa = next((r.numa_node for r, _ in cand.members if r.numa_node is not None), None)
        ctx = RenderContext(first, group=cand.group, vendor=vendor, cls=cls.name, numa=numa)
        try:
            name = render_template(cls.device_name, ctx)
            names.validate_device_name(name)
        except TemplateError as exc:
            warnings.append(
                DiscoveryWarning(
                    cls.name, cand.physical, f"deviceName {cls.device_name.source!r}: {exc}"
                )
            )
            continue
        except InvalidNameError as exc:
            warnings.append(
                DiscoveryWarning(
                    cls.name,
                    cand.physical,
                    f"deviceName {cls.device_name.source!r} renders {exc}; device skipped",
                )
            )
            continue
        named.setdefault(name, []).append(
            (
                cand,
                RenderContext(
                    first, group=cand.group, name=name, vendor=vendor, cls=cls.name, numa=numa
                ),
            )
        )

    built: list[tuple[_MemberKey, DiscoveredDevice]] = []
    for name, all_holders in sorted(named.items()):
        holders = all_holders
        if len(holders) > 1:
            keep = next(
                (h for h in holders if incumbents and incumbents.get(name) == h[0].physical),
                holders[0],
            )
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
            holders = [keep]
        cand, ctx = holders[0]
        state_key = _state_key(cand.members)
        if cache is not None:
            hit = cache.get(cand.physical)
            if hit is not None and hit[1].name == name and hit[0] == state_key:
                built.append((state_key, hit[1]))
                continue
        try:
            device = _build_device(cls, cand, ctx)
        except TemplateError as exc:
            warnings.append(
                DiscoveryWarning(cls.name, cand.physical, f"containerEdits: {exc}; device skipped")
            )
            continue
        except ValueError as exc:
            # A rendered value the spec models refuse (pydantic errors are ValueErrors):
            # this device's problem, not its class's.
            reason = quote(str(exc).replace("\n", " "), 200)
            warnings.append(
                DiscoveryWarning(
                    cls.name, cand.physical, f"containerEdits: {reason}; device skipped"
                )
            )
            continue
        problems = edits_problems(device.edits.to_wire(), "containerEdits")
        if problems:
            warnings.append(
                DiscoveryWarning(
                    cls.name,
                    cand.physical,
                    "; ".join(str(p) for p in problems) + "; device skipped",
                )
            )
            continue
        built.append((state_key, device))
    if cache is not None:
        cache.clear()
        cache.update((d.physical, (k, d)) for k, d in built)
    return [d for _, d in built], warnings


def _state_key(members: list[tuple[DeviceRecord, int]]) -> tuple[tuple[DeviceRecord, int], ...]:
    # The action differs between an enumerated record and an event for the same state.
    return tuple(
        (r if r.action is None else dataclasses.replace(r, action=None), i) for r, i in members
    )


def _build_device(cls: ClassConfig, cand: _Candidate, ctx: RenderContext) -> DiscoveredDevice:
    opts = cls.node
    nodes: list[NodeInfo] = []
    own: list[DeviceNode] = []
    for record, _ in cand.members:
        assert record.devnode is not None
        member_ctx = RenderContext(
            record, group=ctx.group, name=ctx.name, vendor=ctx.vendor, cls=ctx.cls, numa=ctx.numa
        )
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
            DeviceNode(
                path=path,
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
    extra = _render_edits(cls, ctx)
    edits = extra.model_copy(update={"device_nodes": own + list(extra.device_nodes or ())})
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
    )


def build_spec(vendor: str, cls: ClassConfig, devices: Iterable[DiscoveredDevice]) -> Spec | None:
    """The CDI spec of a class, ``cdiVersion`` set to its minimum or the class's pin.

    A shared class (``sharing.replicas`` > 1) gets one CDI device per slot. Returns None
    when there is no device (a spec without devices is invalid). Raises VersionError when the
    class pins a cdiVersion older than its edits need.
    """
    from cdi_gen.discovery.sharing import expand_devices  # sharing builds on this module

    devs = sorted(devices, key=lambda d: d.name)
    # Slots of shared devices, in the same order the agent writes them (slot 2 before 10).
    devs = list(expand_devices(devs, cls.sharing.replicas)[0]) if cls.sharing.replicas > 1 else devs
    if not devs:
        return None
    spec = Spec(
        cdi_version="0.3.0",
        kind=f"{vendor}/{cls.name}",
        devices=[Device(name=d.name, container_edits=d.edits) for d in devs],
    )
    return apply_version(spec, cls.cdi_version)


# ---------------------------------------------------------------------------------------------
# Inventory
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _ClassState:
    config: ClassConfig
    matched: dict[str, tuple[DeviceRecord, int]] = field(default_factory=dict)
    devices: dict[str, DiscoveredDevice] = field(default_factory=dict)
    gone: dict[str, DiscoveredDevice] = field(default_factory=dict)
    warnings: tuple[DiscoveryWarning, ...] = ()
    cache: dict[str, tuple[_MemberKey, DiscoveredDevice]] = field(default_factory=dict)


class Discovery:
    """The device sets of the configured classes, kept up to date from udev records.

    Feed it :meth:`replace` with a full enumeration (at start and on every resync) and
    :meth:`apply` with event records; both return a :class:`ClassChange` for each class whose
    devices (or warnings) changed. Pure and synchronous: call it from the loop. The agent's
    loop, in short::

        discovery = Discovery(config)
        watcher = UdevWatcher(source=config.udev_source, subsystems=discovery.subsystems,
                              interest=discovery.interest, wants=discovery.wants,
                              resync_seconds=config.resync_seconds)
        changes = discovery.replace(watcher.start())     # monitor first, then enumeration
        ...                                               # write specs, then publish
        async for batch in watcher.batches():
            feed = discovery.replace if batch.full else discovery.apply
            for change in feed(batch.records):
                log each change.warnings
                board.publish(change.before_write)        # withdraw removed IDs first
                spec = discovery.spec(change.class_name)  # None: no device left
                write_spec(...) if spec else remove_spec(...)
                board.publish(change.after_write)         # advertise once on disk
    """

    def __init__(self, config: AgentConfig, classes: Iterable[str] | None = None) -> None:
        self.config = config
        selected = (
            config.classes
            if classes is None
            else [config.get_class(name) for name in dict.fromkeys(classes)]
        )
        self._states = {c.name: _ClassState(c) for c in selected}
        self._initialised = False

    # -- what udev should read -----------------------------------------------------------------

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(self._states)

    @property
    def wants(self) -> RecordWants:
        """The sysfs attributes the selected classes read (device ones include ATTRS names)."""
        attrs: set[str] = set()
        parent: set[str] = set()
        for s in self._states.values():
            attrs |= s.config.wanted_attributes | s.config.wanted_parent_attributes
            parent |= s.config.wanted_parent_attributes
        return RecordWants(frozenset(attrs), frozenset(parent))

    @property
    def subsystems(self) -> frozenset[str] | None:
        """Subsystems worth enumerating, or None when some rule matches any subsystem."""
        out: set[str] = set()
        for s in self._states.values():
            for r in s.config.match:
                if r.subsystem is None:
                    return None
                out.add(r.subsystem)
        return frozenset(out)

    def interest(self, subsystem: str, sys_name: str) -> bool:
        """Cheap prefilter: whether a device with this subsystem and name could match."""
        return any(
            _could_match(r, subsystem, sys_name)
            for s in self._states.values()
            for r in s.config.match
        )

    # -- feeding -------------------------------------------------------------------------------

    def replace(self, records: Iterable[DeviceRecord]) -> list[ClassChange]:
        """Take a full enumeration as the truth; return the classes that changed."""
        recs = list(records)
        for state in self._states.values():
            state.matched = {}
            for r in recs:
                rule = match_record(state.config, r)
                if rule is not None:
                    state.matched[r.sys_path] = (r, rule)
        first = not self._initialised
        self._initialised = True
        return self._rebuild(self._states.values(), report_all=first)

    def apply(self, records: Iterable[DeviceRecord]) -> list[ClassChange]:
        """Apply events in order (``remove`` drops a device; any other action adds/updates)."""
        touched: dict[str, _ClassState] = {}
        for r in records:
            for name, state in self._states.items():
                was = r.sys_path in state.matched
                if r.action == "remove":
                    if was:
                        del state.matched[r.sys_path]
                        touched[name] = state
                    continue
                rule = match_record(state.config, r)
                if rule is not None:
                    state.matched[r.sys_path] = (r, rule)
                    touched[name] = state
                elif was:
                    del state.matched[r.sys_path]
                    touched[name] = state
        return self._rebuild(touched.values(), report_all=False)

    # -- reading -------------------------------------------------------------------------------

    def devices(self, cls: str) -> tuple[DiscoveredDevice, ...]:
        """Current devices of ``cls`` sorted by name, unhealthy kept ones included."""
        state = self._state(cls)
        merged = {**state.gone, **state.devices}
        return tuple(merged[n] for n in sorted(merged))

    def advertised(self, cls: str) -> tuple[AdvertisedDevice, ...]:
        return tuple(d.advertised() for d in self.devices(cls))

    def warnings(self, cls: str) -> tuple[DiscoveryWarning, ...]:
        return self._state(cls).warnings

    def spec(self, cls: str) -> Spec | None:
        """The CDI spec of ``cls`` now, or None without devices (VersionError on a bad pin)."""
        return build_spec(self.config.vendor, self._state(cls).config, self.devices(cls))

    def config_of(self, cls: str) -> ClassConfig:
        return self._state(cls).config

    def _state(self, cls: str) -> _ClassState:
        try:
            return self._states[cls]
        except KeyError:
            known = ", ".join(self._states) or "none"
            raise KeyError(f"class {cls!r} is not discovered here (known: {known})") from None

    def _rebuild(self, states: Iterable[_ClassState], *, report_all: bool) -> list[ClassChange]:
        changes = []
        for state in states:
            cls = state.config
            before = self.devices(cls.name)
            incumbents = {d.name: d.physical for d in before}
            devices, warnings = build_devices(
                self.config.vendor, cls, state.matched.values(), incumbents, state.cache
            )
            new = {d.name: d for d in devices}
            if cls.when_gone == "unhealthy":
                for old in before:
                    if old.name not in new:
                        state.gone[old.name] = _unhealthy(old)
                for n in new:
                    state.gone.pop(n, None)
            state.devices = new
            after = self.devices(cls.name)
            old_by_name = {d.name: d for d in before}
            new_by_name = {d.name: d for d in after}
            added = tuple(n for n in new_by_name if n not in old_by_name)
            removed = tuple(n for n in old_by_name if n not in new_by_name)
            changed = tuple(
                n
                for n in new_by_name
                if n in old_by_name
                and new_by_name[n] is not old_by_name[n]  # a cache hit: unchanged
                and new_by_name[n] != old_by_name[n]
            )
            fresh = tuple(w for w in warnings if w not in state.warnings)
            state.warnings = tuple(warnings)
            if report_all or added or removed or changed or fresh:
                changes.append(
                    ClassChange(
                        class_name=cls.name,
                        devices=after,
                        added=added,
                        removed=removed,
                        changed=changed,
                        warnings=fresh,
                        before_write=tuple(d.advertised() for d in before if d.name in new_by_name),
                        after_write=tuple(d.advertised() for d in after),
                    )
                )
        return changes


def _unhealthy(device: DiscoveredDevice) -> DiscoveredDevice:
    if not device.healthy:
        return device
    return DiscoveredDevice(
        name=device.name,
        class_name=device.class_name,
        physical=device.physical,
        nodes=device.nodes,
        numa_node=device.numa_node,
        healthy=False,
        rules=device.rules,
        edits=device.edits,
        records=device.records,
    )


def iter_matches(
    config: AgentConfig, records: Iterable[DeviceRecord]
) -> Iterator[tuple[ClassConfig, DeviceRecord, int]]:
    """Every (class, record, rule index) match, for diagnostics."""
    recs = list(records)
    for cls in config.classes:
        for r in recs:
            i = match_record(cls, r)
            if i is not None:
                yield cls, r, i
