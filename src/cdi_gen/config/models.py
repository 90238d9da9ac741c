"""The agent configuration: its classes (which udev devices form which CDI class, how they are
named, shared, checked and served) and the vendor they are published under.

Frozen, strict pydantic models (unknown keys are errors); a class's match rules are in
:mod:`cdi_gen.config.rules`, its spec edits in :mod:`cdi_gen.config.edits`.
:mod:`cdi_gen.config.loader` reads a file or the embedded catalogue into them, one line per
problem.

Templates (``deviceName``, every string of ``containerEdits``) are parsed at load time by
:mod:`cdi_gen.config.templates`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cdi_gen import names
from cdi_gen.cdi.version import KNOWN_VERSIONS, normalize
from cdi_gen.config.configmodel import ConfigModel
from cdi_gen.config.deviceattributes import (
    MAX_CLASS_ATTRIBUTES,
    MAX_DEVICE_ATTRIBUTES,
    OWN,
    STANDARD,
    STANDARD_DOMAIN,
)
from cdi_gen.config.edits import ContainerEditsConfig, NetDeviceOptions, NodeOptions
from cdi_gen.config.rules import GroupConfig, HealthConfig, MatchRule
from cdi_gen.config.templates import (
    DEVICE_NAME_FIELDS,
    PER_NODE_FIELDS,
    EditTemplate,
    NameTemplate,
    Template,
    parse_template,
)
from cdi_gen.errors import ConfigError, InvalidNameError, quote
from cdi_gen.strictmodel import FieldError, Loc

__all__ = [
    "DEFAULT_VENDOR",
    "MAX_CLASS_ATTRIBUTES",
    "MAX_DEVICE_ATTRIBUTES",
    "AgentConfig",
    "ClassConfig",
    "SharingConfig",
    "composite_refusal",
]

#: The vendor of the embedded catalogue: a domain naming this tool, so the resources
#: (``cdi-gen.io/kvm``) say who advertises them and never clash with a hardware vendor's own
#: plugin (``nvidia.com/gpu``). Sites override it with ``vendor:`` in their config.
DEFAULT_VENDOR = "cdi-gen.io"
MIN_RESYNC_SECONDS = 10.0
MAX_RESYNC_SECONDS = 7 * 86400.0

# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


#: A cdiVersion pin meaning "the newest the node's container runtime reads", resolved at start
#: (cdi_gen.cdi.runtimes); never written into a spec.
RUNTIME_PIN = "runtime"


#: A DRA attribute name without a domain (the driver's is implied): a C identifier.
_DRA_ATTRIBUTE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")


def composite_refusal(api: str) -> str:
    """Why a class served as ``api`` may not offer a group's whole and its parts both."""
    return (
        f"'both' needs api: dra, not {quote(api)}: the kubelet knows no counters for a "
        "device plugin, which would give the whole and a part of it to two pods at once; "
        "offer 'whole' or 'parts' (one form per resource)"
    )


def _as_rule_list(value: Any) -> Any:
    # One rule may be written as a mapping; the error formatter drops the synthetic [0].
    return [value] if isinstance(value, Mapping) else value


class SharingConfig(ConfigModel):
    """How many containers may share one device (slots); the slot feature reads this."""

    replicas: int = Field(default=1, ge=1, le=1024, description="IDs advertised per device")
    policy: Literal["spread", "pack"] = Field(
        default="spread",
        description="spread: prefer slots of the least used devices; pack: the most used",
    )
    fail_requests_greater_than_one: bool = Field(
        default=False, description="refuse a request for more than one slot of a shared device"
    )


class ClassConfig(ConfigModel):
    """One CDI class (and Kubernetes resource ``<vendor>/<name>``)."""

    name: str = Field(description="CDI class; the resource name is <vendor>/<name>")
    description: str = ""
    match: Annotated[list[MatchRule], BeforeValidator(_as_rule_list)] = Field(
        description="a rule, or a list of rules of which any may match"
    )
    device_name: NameTemplate = Field(
        default_factory=lambda: parse_template("{kernel}", DEVICE_NAME_FIELDS),
        description="template of the CDI device name (also the kubelet device ID)",
    )
    group: GroupConfig | None = None
    node: NodeOptions = NodeOptions()
    net_device: NetDeviceOptions = Field(
        default_factory=NetDeviceOptions,
        description="for the network interfaces a rule with subsystem: net matches: how each "
        "is moved into the container (netDevices, cdiVersion 1.1.0)",
    )
    container_edits: ContainerEditsConfig = ContainerEditsConfig()
    sharing: SharingConfig = SharingConfig()
    cdi_version: str | None = Field(
        default=None,
        description="pin cdiVersion for this class: X.Y.Z, or 'runtime' for the newest the "
        "node's container runtime reads (default: the minimum the spec needs)",
    )
    health: HealthConfig | None = Field(
        default=None,
        description="when a present device is healthy beyond its node existing (sysfs "
        "attribute values); unhealthy devices stay advertised as Unhealthy",
    )
    when_gone: Literal["withdraw", "unhealthy", "taint"] = Field(
        default="withdraw",
        description="a device whose node disappears is withdrawn (default), or kept and "
        "advertised unhealthy until it comes back; 'taint' also keeps it, and DRA publishes "
        "it with a NoExecute taint so that the pods using it are evicted",
    )
    when_back: Literal["keep", "restart", "follow"] = Field(
        default="keep",
        description="a device that comes back (new node numbers) while a container holds "
        "it: 'keep' leaves the container as it is; 'restart' stops the holding containers "
        "through the CRI (the kubelet starts them with the current spec); 'follow' gives them "
        "the new device in place (cgroup and node); without the privileges it needs, a class "
        "runs as the next one down, said at start",
    )
    api: Literal["devicePlugin", "dra"] = Field(
        default="devicePlugin",
        description="how the kubelet learns of the devices: a device plugin (extended "
        "resource <vendor>/<name>) or Dynamic Resource Allocation (ResourceSlices); the "
        "agent's --api overrides it for every class",
    )
    attributes: dict[str, EditTemplate] = Field(
        default_factory=dict,
        description="extra DRA device attributes: name (a C identifier, at most 32 "
        "characters) → template, e.g. {firmware: '{attribute[fw_version]}'}; at most "
        f"{MAX_CLASS_ATTRIBUTES} (a device carries at most {MAX_DEVICE_ATTRIBUTES} with "
        "the built-in ones); a value over 64 bytes is left out",
        json_schema_extra={"maxProperties": MAX_CLASS_ATTRIBUTES},
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        names.validate_class(value)
        return value

    @field_validator("attributes")
    @classmethod
    def _attribute_names(
        cls, value: dict[str, Template], info: ValidationInfo
    ) -> dict[str, Template]:
        if len(value) > MAX_CLASS_ATTRIBUTES:
            name = info.data.get("name")
            who = f"class {quote(name)}" if isinstance(name, str) else "the class"
            raise ValueError(
                f"{who} has {len(value)} attributes, at most {MAX_CLASS_ATTRIBUTES}: a "
                f"ResourceSlice device carries at most {MAX_DEVICE_ATTRIBUTES} and cdi-gen "
                f"reserves {MAX_DEVICE_ATTRIBUTES - MAX_CLASS_ATTRIBUTES} for its built-in ones"
            )
        for key in value:
            # Checked first, for the message: a qualified name is a C identifier's mistake
            # only by accident, and the standard domain's names are the pool's own.
            if "/" in key:
                raise ValueError(
                    f"attribute name {quote(key)} has a domain: a class's attributes are in "
                    f"the driver's own; cdi-gen sets the {STANDARD_DOMAIN} ones itself "
                    f"({', '.join(n.partition('/')[2] for n in STANDARD)})"
                )
            if not _DRA_ATTRIBUTE_RE.fullmatch(key):
                raise ValueError(
                    f"attribute name {quote(key)} is not a C identifier of at most 32 "
                    "characters (what a ResourceSlice accepts)"
                )
            if key in OWN:
                raise ValueError(
                    f"attribute name {quote(key)} is one cdi-gen sets itself (built in: "
                    f"{', '.join(sorted(OWN))})"
                )
        return value

    @field_validator("match")
    @classmethod
    def _rules(cls, value: list[MatchRule]) -> list[MatchRule]:
        if not value:
            raise ValueError("needs at least one rule")
        return value

    @field_validator("cdi_version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is None or value == RUNTIME_PIN:
            return value
        try:
            return normalize(value)
        except ValueError:
            raise ValueError(
                f"unknown cdiVersion {value[:40]!r}, known: {', '.join(KNOWN_VERSIONS)} "
                f"or {RUNTIME_PIN!r}"
            ) from None

    @model_validator(mode="after")
    def _composite(self) -> ClassConfig:
        if self.group is None or self.group.offer != "both":
            return self
        # Only a class that says devicePlugin itself: one that leaves api out may be served
        # through DRA by the agent's --api, which the run's settings check (class_config).
        if self.api != "dra" and "api" in self.model_fields_set:
            raise FieldError(("group", "offer"), composite_refusal(self.api))
        if self.sharing.replicas > 1:
            raise FieldError(
                ("sharing", "replicas"),
                f"{self.sharing.replicas} with group offer 'both': a composite class's "
                "devices are held whole or in parts, never shared",
            )
        return self

    @model_validator(mode="after")
    def _group_field(self) -> ClassConfig:
        if self.group is None:
            for t in self.templates():
                if any(f.name == "group" for f in t.fields):
                    raise FieldError(
                        ("deviceName",) if t is self.device_name else (),
                        f"template {quote(t.source)} uses {{group}} but the class has no group",
                    )
        else:
            for loc, t in self.edit_templates():
                used = [str(f) for f in t.fields if f.name in PER_NODE_FIELDS]
                if used:
                    raise FieldError(
                        loc,
                        f"template {quote(t.source)} uses {used[0]}, one node's value, but the "
                        "class groups several nodes into one device and its containerEdits are "
                        "rendered once per device (the first node's value alone); use {group}, "
                        "or node.path for what differs per node",
                    )
        return self

    def edit_templates(self) -> Iterator[tuple[Loc, Template]]:
        """The templates of ``containerEdits``, each with its place (camelCase, as written)."""
        edits = self.container_edits
        for i, t in enumerate(edits.env):
            yield ("containerEdits", "env", i), t
        for i, n in enumerate(edits.device_nodes):
            yield ("containerEdits", "deviceNodes", i, "path"), n.path
            if n.host_path is not None:
                yield ("containerEdits", "deviceNodes", i, "hostPath"), n.host_path
        for i, m in enumerate(edits.mounts):
            yield ("containerEdits", "mounts", i, "hostPath"), m.host_path
            yield ("containerEdits", "mounts", i, "containerPath"), m.container_path
            for j, t in enumerate(m.options or ()):
                yield ("containerEdits", "mounts", i, "options", j), t
        for i, h in enumerate(edits.hooks):
            yield ("containerEdits", "hooks", i, "path"), h.path
            for j, t in enumerate(h.args or ()):
                yield ("containerEdits", "hooks", i, "args", j), t
            for j, t in enumerate(h.env or ()):
                yield ("containerEdits", "hooks", i, "env", j), t

    @property
    def keeps_gone(self) -> bool:
        """Whether a device whose node disappeared is kept (gone, unhealthy) until it comes
        back: ``whenGone`` other than ``withdraw``, or a DRA class whose ``whenBack`` is
        ``restart`` or ``follow``: its claims keep the device, so the slice keeps it, tainted
        ``gone``, rather than let the scheduler forget what running pods hold."""
        if self.when_gone != "withdraw":
            return True
        return self.api == "dra" and self.when_back != "keep"

    @property
    def wanted_attributes(self) -> frozenset[str]:
        """sysfs attributes of the device that rules or templates read."""
        keys = {k for r in self.match for k in r.attributes}
        if self.health is not None:
            keys |= set(self.health.attributes)
        keys |= {
            f.key for t in self.templates() for f in t.fields if f.name == "attribute" and f.key
        }
        return frozenset(keys)

    @property
    def wanted_parent_attributes(self) -> frozenset[str]:
        """sysfs attributes of parents that rules or templates read."""
        keys = {k for r in self.match for k in r.parent_attributes}
        if self.health is not None:
            keys |= set(self.health.parent_attributes)
        keys |= {
            f.key
            for t in self.templates()
            for f in t.fields
            if f.name == "parent_attribute" and f.key
        }
        return frozenset(keys)

    def templates(self) -> Iterator[Template]:
        yield self.device_name
        if self.group is not None and self.group.offer != "whole":
            yield self.group.part_name
        if self.node.path is not None:
            yield self.node.path
        yield self.net_device.name
        edits = self.container_edits
        yield from edits.env
        for n in edits.device_nodes:
            yield n.path
            if n.host_path is not None:
                yield n.host_path
        for m in edits.mounts:
            yield m.host_path
            yield m.container_path
            yield from m.options or ()
        for h in edits.hooks:
            yield h.path
            yield from h.args or ()
            yield from h.env or ()
        yield from self.attributes.values()


class AgentConfig(ConfigModel):
    """The whole agent config."""

    vendor: str = Field(default=DEFAULT_VENDOR, description="CDI vendor and resource domain")
    classes: list[ClassConfig] = Field(description="device classes")
    udev_source: Literal["auto", "udev", "kernel"] = Field(
        default="auto",
        description="netlink source: udev (processed, with ID_* properties; needs udevd and "
        "/run/udev), kernel (raw uevents), auto (udev when /run/udev exists)",
    )
    resync_seconds: float = Field(
        default=300.0,
        # A full enumeration walks all of sysfs: more often than every 10 s it is a busy
        # loop, not a safety net (1e-300 spun a core); a week bounds inf and typos.
        ge=MIN_RESYNC_SECONDS,
        le=MAX_RESYNC_SECONDS,
        description="full re-enumeration period, a safety net under the monitor "
        f"({MIN_RESYNC_SECONDS:g} to {MAX_RESYNC_SECONDS:g} seconds)",
    )

    @field_validator("vendor")
    @classmethod
    def _vendor(cls, value: str) -> str:
        names.validate_vendor(value)
        return value

    @model_validator(mode="after")
    def _classes(self) -> AgentConfig:
        try:
            # A valid CDI vendor may still be an invalid resource domain (upper case, "_").
            names.validate_resource_name(f"{self.vendor}/cdi-gen")
        except InvalidNameError as exc:
            raise FieldError(("vendor",), str(exc)) from None
        seen: dict[str, int] = {}
        for i, c in enumerate(self.classes):
            if c.name in seen:
                raise FieldError(
                    ("classes", i, "name"),
                    f"class {c.name!r} is already defined at classes[{seen[c.name]}]",
                )
            seen[c.name] = i
            try:
                names.validate_cdi_kind_as_resource(self.vendor, c.name)
            except InvalidNameError as exc:
                raise FieldError(("classes", i, "name"), str(exc)) from None
        return self

    def get_class(self, name: str) -> ClassConfig:
        """Return the class called ``name``; raise ConfigError listing the known ones."""
        for c in self.classes:
            if c.name == name:
                return c
        known = ", ".join(c.name for c in self.classes) or "none"
        raise ConfigError(f"unknown class {name!r}, the config defines: {known}")

    def with_vendor(self, vendor: str) -> AgentConfig:
        """A copy with another vendor, validated like a config value (ConfigError)."""
        try:
            for c in self.classes:
                names.validate_cdi_kind_as_resource(vendor, c.name)
        except InvalidNameError as exc:
            raise ConfigError(f"--vendor: {exc}") from None
        return self.model_copy(update={"vendor": vendor})

    @property
    def class_names(self) -> tuple[str, ...]:
        """Every class's name, in config order."""
        return tuple(c.name for c in self.classes)

    @property
    def subsystems(self) -> frozenset[str] | None:
        """Subsystems any rule can match, or None when some rule matches any subsystem."""
        out: set[str] = set()
        for c in self.classes:
            for r in c.match:
                if r.subsystem is None:
                    return None
                out.add(r.subsystem)
        return frozenset(out)
