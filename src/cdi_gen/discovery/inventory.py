"""The device sets of the configured classes, kept up to date from udev records.

Nothing here does I/O or imports pyudev: :class:`Discovery` is fed records (a full
enumeration or events) and answers, per class, the new device set and what changed
(:class:`~cdi_gen.model.ClassChange`), so the agent can keep its ordering invariant: on add,
write the spec and then advertise; on remove, withdraw and then rewrite the spec.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cdi_gen.config.models import (
    AgentConfig,
    ClassConfig,
)
from cdi_gen.discovery.devices import MemberKey, as_gone, build_devices
from cdi_gen.discovery.match import could_match, match_record
from cdi_gen.discovery.spec import ClassSpec, class_spec, spec_devices
from cdi_gen.model import (
    AdvertisedDevice,
    ClassChange,
    DeviceRecord,
    DiscoveredDevice,
    DiscoveryWarning,
    RecordWants,
)

if TYPE_CHECKING:
    from cdi_gen.cdi.runtimes import Ceiling


@dataclass(slots=True)
class _ClassState:
    config: ClassConfig
    matched: dict[str, tuple[DeviceRecord, int]] = field(default_factory=dict)
    devices: dict[str, DiscoveredDevice] = field(default_factory=dict)
    gone: dict[str, DiscoveredDevice] = field(default_factory=dict)
    warnings: tuple[DiscoveryWarning, ...] = ()
    cache: dict[str, tuple[MemberKey, DiscoveredDevice]] = field(default_factory=dict)


class Discovery:
    """The device sets of the configured classes, kept up to date from udev records.

    Feed it :meth:`replace` with a full enumeration (at start and on every resync) and
    :meth:`apply` with event records; both return a :class:`ClassChange` for each class whose
    devices (or warnings) changed. Pure and synchronous: call it from the loop. The agent
    (:mod:`cdi_gen.agent.agent`) runs it, in short, as::

        discovery = Discovery(config)
        watcher = UdevWatcher(source=..., subsystems=discovery.subsystems,
                              interest=discovery.interest, wants=discovery.wants,
                              resync_seconds=config.resync_seconds)
        changes = discovery.replace(watcher.start())     # monitor first, then enumeration
        ...                                               # each change to its class's task
        async for batch in watcher.batches():
            feed = discovery.replace if batch.full else discovery.apply
            changes = feed(batch.records)                 # each to its class's task

    and each class's task, for each of its changes (shared devices expanded into slots)::

        log change.warnings
        board.publish(change.before_write(board.devices.values()))  # withdraw first
        spec = class_spec(vendor, cls, change.devices, cache=verdicts)  # log spec.fresh
        writer.sync_spec(spec_dir, vendor, cls, spec.document's bytes, or None)
        board.publish(change.after_write less spec.left_out)   # advertise once on disk

    ``cdi-gen render``, ``write`` and ``slices`` take a class's spec from :meth:`class_spec`,
    which leaves out the devices the agent leaves out.
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
            could_match(r, subsystem, sys_name)
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
        """Apply events in order (``remove`` drops a device; any other action adds/updates).

        ``ended`` drops one too, but never keeps it as gone (``whenGone``): a virtual network
        interface destroyed with the pod's namespace it was moved into was not unplugged.
        ``away`` (an interface moved out of the host's namespace, its last record) keeps the
        device as it was (see :mod:`cdi_gen.sources.netns`).
        """
        touched: dict[str, _ClassState] = {}
        ended: set[str] = set()
        for r in records:
            if r.action == "ended":
                ended.add(r.sys_path)
            for name, state in self._states.items():
                was = r.sys_path in state.matched
                if r.action in ("remove", "ended"):
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
        return self._rebuild(touched.values(), report_all=False, ended=ended)

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

    def class_spec(
        self,
        cls: str,
        cdi_version: str | None = None,
        *,
        ceiling: Ceiling | None = None,
        exists: Callable[[str], bool] | None = None,
    ) -> ClassSpec:
        """The spec of ``cls`` now, and the devices left out of it (see
        :func:`~cdi_gen.discovery.spec.class_spec`, the agent's path too, for ``ceiling``
        and ``exists``).

        ``cdiVersion`` is ``cdi_version`` when given, else the class's pin, else the minimum.
        """
        config = self._state(cls).config
        return class_spec(
            self.config.vendor,
            config,
            spec_devices(config, self.devices(cls)),
            cdi_version=cdi_version,
            ceiling=ceiling,
            exists=exists,
        )

    def config_of(self, cls: str) -> ClassConfig:
        return self._state(cls).config

    def _state(self, cls: str) -> _ClassState:
        try:
            return self._states[cls]
        except KeyError:
            known = ", ".join(self._states) or "none"
            raise KeyError(f"class {cls!r} is not discovered here (known: {known})") from None

    def _rebuild(
        self,
        states: Iterable[_ClassState],
        *,
        report_all: bool,
        ended: frozenset[str] | set[str] = frozenset(),
    ) -> list[ClassChange]:
        changes = []
        for state in states:
            cls = state.config
            before = self.devices(cls.name)
            incumbents = {d.name: d.physical for d in before}
            devices, warnings = build_devices(
                self.config.vendor, cls, state.matched.values(), incumbents, state.cache
            )
            new = {d.name: d for d in devices}
            if cls.keeps_gone:
                for old in before:
                    if old.name not in new and not any(r.sys_path in ended for r in old.records):
                        state.gone[old.name] = as_gone(old)
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
                        after_write=tuple(d.advertised() for d in after),
                    )
                )
        return changes
