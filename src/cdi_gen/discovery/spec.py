"""The CDI spec of one class, built from its devices through the one spec builder.

:func:`class_document` is the only way a class's devices become a spec: the agent calls it on
every change (with an :class:`EntryCache`, so a device's entry is validated once, when it
appears), ``cdi-gen render`` and ``cdi-gen write`` once. Both end in
:func:`cdi_gen.cdi.builder.assemble`, so they write the same bytes for the same devices.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from cdi_gen.cdi.builder import DeviceEntry, assemble, build_entry
from cdi_gen.cdi.spec import ContainerEdits, Spec
from cdi_gen.config.models import ClassConfig
from cdi_gen.discovery.sharing import expand_devices
from cdi_gen.model import DiscoveredDevice

__all__ = ["EntryCache", "build_spec", "class_document", "spec_devices"]


class EntryCache:
    """Validated spec entries by device name, reused while a device's edits stay the same."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[ContainerEdits, DeviceEntry]] = {}

    def entry(self, device: DiscoveredDevice) -> DeviceEntry:
        """The entry of ``device``; raises :class:`~cdi_gen.errors.SpecError` if invalid."""
        cached = self._entries.get(device.name)
        if cached is not None and cached[0] == device.edits:
            return cached[1]
        entry = build_entry(device.name, device.edits.to_wire())
        self._entries[device.name] = (device.edits, entry)
        return entry


def spec_devices(cls: ClassConfig, devices: Iterable[DiscoveredDevice]) -> list[DiscoveredDevice]:
    """The CDI devices of a class in spec order: by name, each shared device as its slots
    (slot 2 before 10, as the agent advertises them)."""
    ordered = sorted(devices, key=lambda d: d.name)
    if cls.sharing.replicas <= 1:
        return ordered
    return list(expand_devices(ordered, cls.sharing.replicas)[0])


def class_document(
    kind: str,
    devices: Sequence[DiscoveredDevice],
    *,
    cdi_version: str | None = None,
    cache: EntryCache | None = None,
) -> dict[str, Any] | None:
    """The wire spec document of ``kind`` holding ``devices`` in order, or None without any.

    ``cdiVersion`` is the minimum the content needs, or ``cdi_version`` when pinned. Raises
    :class:`~cdi_gen.errors.SpecError` for a device the runtimes would refuse and
    :class:`~cdi_gen.errors.VersionError` when the pin is too old for a field.
    """
    if not devices:
        return None
    entries = cache or EntryCache()
    return assemble(kind, [entries.entry(d) for d in devices], target_version=cdi_version)


def build_spec(vendor: str, cls: ClassConfig, devices: Iterable[DiscoveredDevice]) -> Spec | None:
    """The CDI spec of a class as a model (see :func:`class_document`), or None without
    devices."""
    doc = class_document(
        f"{vendor}/{cls.name}", spec_devices(cls, devices), cdi_version=cls.cdi_version
    )
    return None if doc is None else Spec.model_validate(doc)
