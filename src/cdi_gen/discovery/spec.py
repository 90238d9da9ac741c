"""The CDI spec document of one class, built from its devices through the one spec builder.

:func:`class_document` is how ``cdi-gen render`` and ``cdi-gen write`` (through
:meth:`~cdi_gen.discovery.inventory.Discovery.document`) turn a class's devices into a spec;
the agent keeps the same entries cached per device, so that a device is validated once, when
it appears, and assembles them itself on every change. Both end in
:func:`cdi_gen.cdi.builder.assemble`, so they write the same bytes for the same devices.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.config.models import ClassConfig
from cdi_gen.discovery.sharing import expand_devices
from cdi_gen.model import DiscoveredDevice

__all__ = ["class_document", "spec_devices"]


def spec_devices(cls: ClassConfig, devices: Iterable[DiscoveredDevice]) -> list[DiscoveredDevice]:
    """The CDI devices of a class in spec order: by name, each shared device as its slots
    (slot 2 before 10, as the agent advertises them)."""
    ordered = sorted(devices, key=lambda d: d.name)
    if cls.sharing.replicas <= 1:
        return ordered
    return list(expand_devices(ordered, cls.sharing.replicas)[0])


def class_document(
    kind: str, devices: Sequence[DiscoveredDevice], *, cdi_version: str | None = None
) -> dict[str, Any] | None:
    """The wire spec document of ``kind`` holding ``devices`` in order, or None without any.

    ``cdiVersion`` is the minimum the content needs, or ``cdi_version`` when pinned. Raises
    :class:`~cdi_gen.errors.SpecError` for a device the runtimes would refuse and
    :class:`~cdi_gen.errors.VersionError` when the pin is too old for a field.
    """
    if not devices:
        return None
    entries = [build_entry(d.name, d.edits.to_wire()) for d in devices]
    return assemble(kind, entries, target_version=cdi_version)
