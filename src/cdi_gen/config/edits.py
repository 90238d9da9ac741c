"""What a class adds to each of its devices' spec entries, in the config: how each matched
device node is written, and the container edits (extra nodes, mounts, hooks, environment,
group IDs), every string a template (:mod:`cdi_gen.config.templates`) rendered per device.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from cdi_gen import names
from cdi_gen.config.configmodel import ConfigModel
from cdi_gen.config.filemodes import FileMode
from cdi_gen.config.templates import EditTemplate, Template, parse_template
from cdi_gen.errors import InvalidNameError, quote

__all__ = [
    "INT64_MAX",
    "ContainerEditsConfig",
    "DeviceNodeConfig",
    "HookConfig",
    "MountConfig",
    "NetDeviceOptions",
    "NodeOptions",
]

#: Largest value a runtime reads into a Go int64 (device numbers, hook timeouts).
INT64_MAX = 2**63 - 1


#: Never written into the spec (CDI has no such key): it only keeps the host path check quiet.
_OPTIONAL = (
    "the host path may be missing when the spec is written (a node that appears later, on "
    "hotplug): no warning, and the device is not left out for it. Otherwise a device whose "
    "host path is missing is left out of the spec, since a container asking for it would "
    "fail at creation"
)


def _check_permissions(value: str | None) -> str | None:
    if value is not None and (not value or set(value) - set("rwm")):
        raise ValueError(f"permissions {quote(value)} should be a non-empty subset of 'rwm'")
    return value


class NodeOptions(ConfigModel):
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


class NetDeviceOptions(ConfigModel):
    """How each matched network interface (a ``net`` record: no device node) appears in the
    spec: a ``netDevices`` entry moving the interface, by its current kernel name, into the
    container under ``name`` (needs cdiVersion 1.1.0)."""

    name: EditTemplate = Field(
        default_factory=lambda: parse_template("{kernel}"),
        description="the interface's name inside the container (template; at most 15 bytes, "
        "no '/', ':' or whitespace, not '.' or '..'); default: its name on the host",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: Template) -> Template:
        # The literal text is known now: a '/' or a space in it breaks every rendered name,
        # and a template without fields renders exactly itself.
        literal = "".join(p for p in value.parts if isinstance(p, str))
        try:
            if not value.fields:
                names.validate_interface_name(literal)
            elif literal:
                # Each field renders at least one character.
                names.validate_interface_name(literal.replace(".", "_") + "x" * len(value.fields))
        except InvalidNameError as exc:
            raise ValueError(
                f"template {quote(value.source)} renders no valid interface name: {exc.rule}"
            ) from None
        return value


class DeviceNodeConfig(ConfigModel):
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
    optional: bool = Field(default=False, description=_OPTIONAL)

    @field_validator("permissions")
    @classmethod
    def _perms(cls, value: str | None) -> str | None:
        return _check_permissions(value)


class MountConfig(ConfigModel):
    host_path: EditTemplate
    container_path: EditTemplate
    options: list[EditTemplate] | None = None
    type: str | None = None
    optional: bool = Field(default=False, description=_OPTIONAL)


class HookConfig(ConfigModel):
    hook_name: Literal[
        "prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"
    ]
    path: EditTemplate
    args: list[EditTemplate] | None = None
    env: list[EditTemplate] | None = None
    timeout: int | None = Field(default=None, gt=0, le=INT64_MAX)


class ContainerEditsConfig(ConfigModel):
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
