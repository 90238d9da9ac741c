"""A class's CDI spec: each device judged, the document of those that can be in it, and the
devices left out and why.

:func:`class_spec` is the one path from a class's devices to its spec. The agent calls it on
every change of a class; ``cdi-gen render``, ``write`` and ``slices`` call it through
:meth:`~cdi_gen.discovery.inventory.Discovery.class_spec`. So what the CLI previews is what
the agent writes and advertises, and a device is left out alike everywhere.

A device, never its class, is left out when its entry breaks a runtime rule
(``invalid-device``) or needs a newer cdiVersion than the class is pinned to (``version``):
a runtime that reads only the pinned version refuses the whole file, which would lose every
device of the class for one. Each :class:`LeftOut` names the device, the field and the rule.

The agent passes a cache of verdicts, so a device is judged once, when it appears or its
edits change, and rewriting a class's spec after an event costs a list of references and one
assembly (:mod:`cdi_gen.cdi.builder`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cdi_gen.cdi.builder import DeviceEntry, assemble, build_entry
from cdi_gen.cdi.version import Requirement, choose_version, spec_requirements
from cdi_gen.config.models import ClassConfig
from cdi_gen.discovery.sharing import expand_devices
from cdi_gen.errors import Problem, SpecError, VersionError, quote
from cdi_gen.model import DiscoveredDevice

__all__ = ["ClassSpec", "LeftOut", "Verdicts", "class_spec", "spec_devices"]

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
) -> ClassSpec:
    """The spec of class ``cls`` holding ``devices`` (in spec order, see :func:`spec_devices`),
    each device that cannot be in it left out.

    ``cdiVersion`` is ``cdi_version`` when given, else the class's pin, else the minimum the
    devices kept need. With ``cache``, a device whose edits and target are those of its
    cached verdict is not judged again, and each new verdict is stored; the caller drops a
    device's verdict when the device goes (so that it is judged, and logged, afresh when it
    comes back). Pure otherwise: no I/O, no logging.

    Raises :class:`~cdi_gen.errors.SpecError` only when the devices kept cannot share one
    document (two with one name, or fields no single cdiVersion allows together).
    """
    kind = f"{vendor}/{cls.name}"
    target = cdi_version or cls.cdi_version
    # The spec's own fields count for each device: a class name with a dot (0.6.0) under an
    # older pin leaves out every device, each naming ``kind``, rather than failing the class.
    own = tuple(spec_requirements(kind, None, None))
    entries: list[DeviceEntry] = []
    left_out: list[LeftOut] = []
    fresh: list[LeftOut] = []
    for device in devices:
        cached = None if cache is None else cache.get(device.name)
        # Discovery hands out the same edits object while a device is unchanged: ``is``
        # first spares comparing every field of every device on every event.
        if (
            cached is not None
            and cached[1] == target
            and (cached[0] is device.edits or cached[0] == device.edits)
        ):
            verdict = cached[2]
        else:
            verdict = _judge(device, own, target)
            if cache is not None:
                cache[device.name] = (device.edits, target, verdict)
            if isinstance(verdict, LeftOut):
                fresh.append(verdict)
        if isinstance(verdict, LeftOut):
            left_out.append(verdict)
        else:
            entries.append(verdict)
    document = assemble(kind, entries, target_version=target) if entries else None
    return ClassSpec(document, tuple(left_out), tuple(fresh))


def _judge(
    device: DiscoveredDevice, own: tuple[Requirement, ...], target: str | None
) -> DeviceEntry | LeftOut:
    """The device's validated entry, or why it cannot be in a spec stated as ``target``."""
    try:
        entry = build_entry(device.name, device.edits)
        # Also without a target: a device asking for fields of versions that exclude each
        # other (a 1.1.0 field beside one removed in 1.1.0) fits no document.
        choose_version([*entry.requirements, *own], target, device.name)
    except VersionError as exc:
        return LeftOut(device.name, device.physical, "version", tuple(exc.problems))
    except SpecError as exc:
        return LeftOut(device.name, device.physical, "invalid-device", tuple(exc.problems))
    return entry
