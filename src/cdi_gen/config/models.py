"""The agent configuration: which udev devices form which CDI class, and how they are named.

Frozen, strict pydantic models (unknown keys are errors); :mod:`cdi_gen.config.loader` reads
a file or the embedded catalogue into them, one line per problem.

Templates (``deviceName``, every string of ``containerEdits``) are parsed at load time by
:mod:`cdi_gen.config.templates`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from cdi_gen import names
from cdi_gen.cdi.version import KNOWN_VERSIONS, normalize
from cdi_gen.config.filemodes import FileMode
from cdi_gen.config.templates import (
    DEVICE_NAME_FIELDS,
    EditTemplate,
    NameTemplate,
    Template,
    parse_template,
)
from cdi_gen.errors import ConfigError, InvalidNameError, quote

__all__ = [
    "BUILTIN_DRA_ATTRIBUTES",
    "DEFAULT_VENDOR",
    "MAX_CLASS_ATTRIBUTES",
    "MAX_DEVICE_ATTRIBUTES",
    "AgentConfig",
    "ClassConfig",
    "ContainerEditsConfig",
    "DeviceNodeConfig",
    "FieldError",
    "GroupConfig",
    "HealthConfig",
    "HookConfig",
    "MatchRule",
    "MountConfig",
    "NodeOptions",
    "SharingConfig",
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


#: Largest value a runtime reads into a Go int64 (device numbers, hook timeouts).
INT64_MAX = 2**63 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        arbitrary_types_allowed=True,
        # Validators built on first use, not at import: only what is validated is built
        # (AgentConfig builds the classes' models inside its own), which start-up sees.
        defer_build=True,
    )


#: A DRA attribute name without a domain (the driver's is implied): a C identifier.
_DRA_ATTRIBUTE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
#: The attributes every published device carries (cdi_gen.dra.plugin.pool); a class's own
#: ``attributes`` may not reuse them, so a device's ``class`` always is its class.
BUILTIN_DRA_ATTRIBUTES: frozenset[str] = frozenset(
    {
        "class",
        "cdiName",
        "subsystem",
        "driver",
        "kernelName",
        "numaNode",
        "vendor",
        "model",
        "serial",
        "physical",
        "slot",
    }
)
#: Most attributes and capacities one device of a ResourceSlice may carry
#: (ResourceSliceMaxAttributesAndCapacitiesPerDevice); one more and the slice is refused.
MAX_DEVICE_ATTRIBUTES = 32
#: Most attributes of a class's own: what is left once every built-in one is counted (the
#: pool sets at most those), so that no device can go over the limit.
MAX_CLASS_ATTRIBUTES = MAX_DEVICE_ATTRIBUTES - len(BUILTIN_DRA_ATTRIBUTES)
_SYSFS_NAME_RE = re.compile(r"[A-Za-z0-9_.:+-]+(/[A-Za-z0-9_.:+-]+)*")
_PROPERTY_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")


def _check_globs(values: Mapping[str, str], key_re: re.Pattern[str], what: str) -> None:
    for key in values:
        if not key_re.fullmatch(key) or ".." in key.split("/"):
            raise ValueError(f"invalid {what} name {quote(key)}")


class MatchRule(_Strict):
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


def _as_rule_list(value: Any) -> Any:
    # One rule may be written as a mapping; the error formatter drops the synthetic [0].
    return [value] if isinstance(value, Mapping) else value


class GroupConfig(_Strict):
    """Make one CDI device of every set of matched nodes that share a parent or a property.

    Example: a DFL FPGA's ``dfl-fme.0`` and ``dfl-port.0`` nodes are both children of
    ``fpga_region`` ``region0``; grouping by that parent hands both nodes to one container.
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

    @model_validator(mode="after")
    def _consistent(self) -> GroupConfig:
        if self.by == "property" and not self.property:
            raise ValueError("by: property needs property: <NAME>")
        if self.by == "parent" and self.property is not None:
            raise ValueError(f"property {self.property!r} only applies with by: property")
        if self.by == "property" and self.subsystem is not None:
            raise ValueError(f"subsystem {self.subsystem!r} only applies with by: parent")
        return self


def _check_permissions(value: str | None) -> str | None:
    if value is not None and (not value or set(value) - set("rwm")):
        raise ValueError(f"permissions {quote(value)} should be a non-empty subset of 'rwm'")
    return value


class NodeOptions(_Strict):
    """How each matched device node appears in the spec (``deviceNodes`` entry)."""

    path: EditTemplate | None = Field(
        default=None,
        description="path inside the container (template); default: the host path. A different "
        "path adds hostPath, which needs cdiVersion 0.5.0",
    )
    permissions: str | None = Field(default=None, description="cgroup access, a subset of 'rwm'")
    file_mode: FileMode | None = Field(
        default=None,
        description="mode of the node: an integer of permission bits (YAML 0660, JSON 432) or "
        'an octal string ("0o660", "0660", "660"; up to "0o7777" with setuid, setgid, sticky)',
    )
    uid: int | None = Field(default=None, ge=0, le=0xFFFFFFFF)
    gid: int | None = Field(default=None, ge=0, le=0xFFFFFFFF)
    pin_numbers: bool = Field(
        default=False,
        description="write type/major/minor into the spec. Off by default: the runtime reads "
        "them from the host node at injection, and pinned numbers go stale when a device is "
        "re-plugged",
    )

    @field_validator("permissions")
    @classmethod
    def _perms(cls, value: str | None) -> str | None:
        return _check_permissions(value)


class DeviceNodeConfig(_Strict):
    """An extra device node (templates allowed), e.g. ``/dev/vfio/vfio`` next to a group."""

    path: EditTemplate
    host_path: EditTemplate | None = None
    type: Literal["b", "c", "u", "p"] | None = None
    # Bounded as the runtimes read them (Go int64): the rendered edits go to the spec as
    # they are, no model judges them per device.
    major: int | None = Field(default=None, ge=0, le=INT64_MAX)
    minor: int | None = Field(default=None, ge=0, le=INT64_MAX)
    file_mode: FileMode | None = Field(
        default=None, description="mode of the node, as the class's node.fileMode"
    )
    permissions: str | None = None
    uid: int | None = Field(default=None, ge=0, le=0xFFFFFFFF)
    gid: int | None = Field(default=None, ge=0, le=0xFFFFFFFF)

    @field_validator("permissions")
    @classmethod
    def _perms(cls, value: str | None) -> str | None:
        return _check_permissions(value)


class MountConfig(_Strict):
    host_path: EditTemplate
    container_path: EditTemplate
    options: list[EditTemplate] | None = None
    type: str | None = None


class HookConfig(_Strict):
    hook_name: Literal[
        "prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"
    ]
    path: EditTemplate
    args: list[EditTemplate] | None = None
    env: list[EditTemplate] | None = None
    timeout: int | None = Field(default=None, gt=0, le=INT64_MAX)


class ContainerEditsConfig(_Strict):
    """Edits added to every device of the class; every string is a template."""

    env: list[EditTemplate] = Field(default_factory=list, description="KEY=VALUE entries")
    device_nodes: list[DeviceNodeConfig] = Field(default_factory=list)
    mounts: list[MountConfig] = Field(default_factory=list)
    hooks: list[HookConfig] = Field(default_factory=list)
    additional_gids: list[Annotated[int, Field(ge=0, le=0xFFFFFFFF)]] = Field(
        default_factory=list, description="needs cdiVersion 0.7.0"
    )

    @field_validator("env")
    @classmethod
    def _env(cls, value: list[Template]) -> list[Template]:
        for t in value:
            literal_eq = any(isinstance(p, str) and "=" in p for p in t.parts)
            if not literal_eq or t.source.startswith("="):
                raise ValueError(
                    f"env entry {quote(t.source)} should be KEY=VALUE "
                    "with a literal '=' after the key"
                )
        return value


class SharingConfig(_Strict):
    """How many containers may share one device (slots); the slot feature reads this."""

    replicas: int = Field(default=1, ge=1, le=1024, description="IDs advertised per device")
    policy: Literal["spread", "pack"] = Field(
        default="spread",
        description="spread: prefer slots of the least used devices; pack: the most used",
    )
    fail_requests_greater_than_one: bool = Field(
        default=False, description="refuse a request for more than one slot of a shared device"
    )


class HealthConfig(_Strict):
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


class ClassConfig(_Strict):
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
                f"reserves {len(BUILTIN_DRA_ATTRIBUTES)} for its built-in ones"
            )
        for key in value:
            if not _DRA_ATTRIBUTE_RE.fullmatch(key):
                raise ValueError(
                    f"attribute name {quote(key)} is not a C identifier of at most 32 "
                    "characters (what a ResourceSlice accepts)"
                )
            if key in BUILTIN_DRA_ATTRIBUTES:
                raise ValueError(
                    f"attribute name {quote(key)} is one cdi-gen sets itself (built in: "
                    f"{', '.join(sorted(BUILTIN_DRA_ATTRIBUTES))})"
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
    def _group_field(self) -> ClassConfig:
        if self.group is None:
            for t in self.templates():
                if any(f.name == "group" for f in t.fields):
                    raise FieldError(
                        ("deviceName",) if t is self.device_name else (),
                        f"template {quote(t.source)} uses {{group}} but the class has no group",
                    )
        return self

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
        if self.node.path is not None:
            yield self.node.path
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


class AgentConfig(_Strict):
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


class FieldError(ValueError):
    """A problem found by a whole-model validator but belonging to one field."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message
