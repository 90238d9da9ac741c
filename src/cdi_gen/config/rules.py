"""Which records a class takes, in the config: udev-style match rules, the grouping of matched
nodes into one device, the health check of a present device.

Each is a frozen, strict model of the config file (:mod:`cdi_gen.config.models` holds them in a
class); :mod:`cdi_gen.discovery.match` applies them to records.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator, model_validator

from cdi_gen.config.configmodel import ConfigModel
from cdi_gen.config.templates import DEVICE_NAME_FIELDS, NameTemplate, parse_template
from cdi_gen.errors import quote

__all__ = ["GroupConfig", "HealthConfig", "MatchRule"]

_SYSFS_NAME_RE = re.compile(r"[A-Za-z0-9_.:+-]+(/[A-Za-z0-9_.:+-]+)*")
_PROPERTY_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")


def _check_globs(values: Mapping[str, str], key_re: re.Pattern[str], what: str) -> None:
    for key in values:
        if not key_re.fullmatch(key) or ".." in key.split("/"):
            raise ValueError(f"invalid {what} name {quote(key)}")


class MatchRule(ConfigModel):
    """One udev rule: every condition given must hold (like the keys of one udev rule line).

    ``subsystem`` is exact; the rest are shell globs (``*``, ``?``, ``[...]``) as in udev.
    """

    subsystem: str | None = Field(
        default=None, description="udev SUBSYSTEM, exact (e.g. block, misc)"
    )
    kernel: str | None = Field(
        default=None, description="glob on the kernel name (KERNEL), e.g. loop*"
    )
    devnode: str | None = Field(
        default=None,
        description="glob on the device node path or one of its udev links (DEVLINKS), e.g. "
        "/dev/net/* or /dev/serial/by-id/usb-FTDI*; in a link, * stays within one folder",
    )
    driver: str | None = Field(
        default=None,
        description="glob on the driver of the device or any parent (like udev DRIVERS)",
    )
    attributes: dict[str, str] = Field(
        default_factory=dict, description="sysfs attributes of the device (ATTR), values are globs"
    )
    parent_attributes: dict[str, str] = Field(
        default_factory=dict,
        description="sysfs attributes that one parent must all have (ATTRS), values are globs",
    )
    properties: dict[str, str] = Field(
        default_factory=dict, description="udev properties (ENV), values are globs"
    )

    @field_validator("subsystem", "kernel", "devnode", "driver")
    @classmethod
    def _not_empty(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError("must not be empty (leave the key out to match anything)")
        return value

    @field_validator("attributes", "parent_attributes")
    @classmethod
    def _attribute_names(cls, value: dict[str, str]) -> dict[str, str]:
        _check_globs(value, _SYSFS_NAME_RE, "sysfs attribute")
        return value

    @field_validator("properties")
    @classmethod
    def _property_names(cls, value: dict[str, str]) -> dict[str, str]:
        _check_globs(value, _PROPERTY_NAME_RE, "udev property")
        return value

    @model_validator(mode="after")
    def _something(self) -> MatchRule:
        if not (
            self.subsystem
            or self.kernel
            or self.devnode
            or self.driver
            or self.attributes
            or self.parent_attributes
            or self.properties
        ):
            raise ValueError("a rule needs at least one condition (subsystem, kernel, ...)")
        return self

    def describe(self) -> str:
        """The rule in udev's own notation, for messages and ``discover`` output."""
        return self._description

    @functools.cached_property
    def _description(self) -> str:
        # Cached: every matched device records its rule, and a class may match thousands.
        out = []
        if self.subsystem is not None:
            out.append(f'SUBSYSTEM=="{self.subsystem}"')
        if self.kernel is not None:
            out.append(f'KERNEL=="{self.kernel}"')
        if self.devnode is not None:
            out.append(f'DEVNAME=="{self.devnode}"')
        if self.driver is not None:
            out.append(f'DRIVERS=="{self.driver}"')
        out += [f'ATTR{{{k}}}=="{v}"' for k, v in self.attributes.items()]
        out += [f'ATTRS{{{k}}}=="{v}"' for k, v in self.parent_attributes.items()]
        out += [f'ENV{{{k}}}=="{v}"' for k, v in self.properties.items()]
        return ", ".join(out)


class GroupConfig(ConfigModel):
    """Make one CDI device of every set of matched nodes that share a parent or a property.

    Example: a DFL FPGA's ``dfl-fme.0`` and ``dfl-port.0`` nodes are both children of
    ``fpga_region`` ``region0``; grouping by that parent hands both nodes to one container.

    ``offer`` says what the class offers of each group: the whole (one device, every node),
    its parts (one device per node), or both, where a DRA pool's counters let a claim have
    the whole or any parts, never both at once (see :mod:`cdi_gen.dra.plugin.slices`). A
    record that is itself in the ``subsystem`` grouped by and has no parent in it (a disk,
    whose partitions group under it) is its group's own node: in the whole, never a part.
    """

    by: Literal["parent", "property"] = Field(
        default="parent", description="group by a common parent device, or by a udev property value"
    )
    subsystem: str | None = Field(
        default=None,
        description="with by=parent: the nearest parent in this subsystem (default: the "
        "immediate parent)",
    )
    property: str | None = Field(default=None, description="with by=property: the property name")
    offer: Literal["whole", "parts", "both"] = Field(
        default="whole",
        description="what the class offers of each group: 'whole' (one device with every "
        "node, the default), 'parts' (one device per node), or 'both' (the whole and each "
        "part; DRA only: a claim gets the whole or parts, never both at once)",
    )
    part_name: NameTemplate = Field(
        default_factory=lambda: parse_template("{kernel}", DEVICE_NAME_FIELDS),
        description="with offer parts or both: template of a part's CDI device name (the "
        "whole is named by deviceName)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> GroupConfig:
        if self.by == "property" and not self.property:
            raise ValueError("by: property needs property: <NAME>")
        if self.by == "parent" and self.property is not None:
            raise ValueError(f"property {self.property!r} only applies with by: property")
        if self.by == "property" and self.subsystem is not None:
            raise ValueError(f"subsystem {self.subsystem!r} only applies with by: parent")
        return self


class HealthConfig(ConfigModel):
    """When a present device is healthy, beyond its device node existing.

    Some devices exist but cannot serve: a loop device without a backing file (size 0), a
    network device whose carrier is down, an accelerator whose firmware reports an error
    state in sysfs. Each key is a sysfs attribute and each value a udev glob (``|`` for
    alternatives), compared with trailing whitespace removed, as udev's ATTR and ATTRS are.
    Attributes are read at every enumeration and every uevent of the device: a change that
    comes without a uevent is seen at the next resync (``resyncSeconds``).
    """

    attributes: dict[str, str] = Field(
        default_factory=dict,
        description="sysfs attributes of the device and the globs their values must match "
        "for it to be healthy, e.g. {size: '[1-9]*'}",
    )
    parent_attributes: dict[str, str] = Field(
        default_factory=dict,
        description="sysfs attributes that the device or one parent must all match (like "
        "ATTRS) for it to be healthy",
    )

    @field_validator("attributes", "parent_attributes")
    @classmethod
    def _attribute_names(cls, value: dict[str, str]) -> dict[str, str]:
        _check_globs(value, _SYSFS_NAME_RE, "sysfs attribute")
        return value

    @model_validator(mode="after")
    def _something(self) -> HealthConfig:
        if not (self.attributes or self.parent_attributes):
            raise ValueError("a health check needs attributes or parentAttributes")
        return self
