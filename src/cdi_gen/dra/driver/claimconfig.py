"""A claim's opaque configuration for our DRA driver: the ``DeviceConfig`` model and its merge.

A DeviceClass and a ResourceClaim may carry ``opaque`` configuration for a driver; the
scheduler copies both into the allocation (``status.allocation.devices.config``, the class's
entries first). Ours is a ``DeviceConfig`` (``apiVersion: cdi-gen.io/v1alpha1``): the owner,
mode and cgroup permissions of every device node of the devices it selects, and environment
variables. The model is strict (unknown fields, strings for numbers, out-of-range values are
refused; a ``fileMode`` string is octal, by :mod:`cdi_gen.config.filemodes`), because a user
who wrote ``fileMod: 0600`` must learn it did nothing before the pod runs, not after.
:func:`parse_device_config` turns one entry's ``parameters`` into a :class:`DeviceConfig` or
one line naming the field; :func:`merge` lays entries over each other, later ones winning field
by field; :func:`selects` says whether an entry limited to some
requests applies to an allocation result. ``schemas/deviceconfig.schema.json`` is the model's
JSON Schema (a test keeps it in sync).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator

from cdi_gen.config.filemodes import PermissionMode
from cdi_gen.errors import quote
from cdi_gen.strictmodel import StrictModel, problems

__all__ = [
    "API_VERSION",
    "KIND",
    "MAX_ENV",
    "DeviceConfig",
    "DeviceConfigError",
    "DeviceNodesConfig",
    "Layered",
    "device_config_schema",
    "merge",
    "parse_device_config",
    "selects",
]

API_VERSION: Final = "cdi-gen.io/v1alpha1"
KIND: Final = "DeviceConfig"
#: Most environment variables one entry sets: a bound on what a claim adds to every spec.
MAX_ENV = 64
#: Longest environment value accepted (runtimes pass it to every process of the container).
MAX_ENV_VALUE = 4096
#: The cgroup device permissions CDI knows, each at most once (``rw``, ``rwm``, ``r``).
_PERMISSIONS = re.compile(r"(?!.*(.).*\1)[rwm]{1,3}")
#: POSIX portable environment names: a runtime splits ``NAME=value`` at the first ``=``.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: As the CDI spec's rule for environment entries: tab is the one control character allowed.
_ENV_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
#: A user or group ID; 4294967295 is (uid_t)-1, "no change" to chown, never an owner.
Id = Annotated[int, Field(ge=0, le=0xFFFFFFFE)]


class DeviceConfigError(ValueError):
    """A configuration entry that is not a valid ``DeviceConfig``; the message names the
    field (``parameters.deviceNodes.fileMode``), the value and the rule."""


class _ClaimModel(StrictModel):
    # Strict types too, unlike the config file's models: a uid written "1000" is refused,
    # as the JSON Schema published for claims says.
    model_config = ConfigDict(strict=True)


class DeviceNodesConfig(_ClaimModel):
    """Applied to every device node of the selected devices (CDI ``deviceNodes`` fields)."""

    uid: Id | None = None
    gid: Id | None = None
    #: Permission bits only (YAML ``0600``, JSON ``384``, or octal ``"0600"``): a claim sets
    #: no node type and no setuid, setgid or sticky bit. 600 is refused, naming 0o600 (384).
    file_mode: PermissionMode | None = None
    #: cgroup device access: a combination of r (read), w (write), m (mknod).
    permissions: Annotated[
        str | None, Field(json_schema_extra={"pattern": "^(?!.*(.).*\\1)[rwm]{1,3}$"})
    ] = None

    @field_validator("permissions")
    @classmethod
    def _permissions(cls, value: str | None) -> str | None:
        if value is not None and _PERMISSIONS.fullmatch(value) is None:
            raise ValueError(
                f"permissions {quote(value)}: want a combination of r, w, m, each at most once"
            )
        return value


class DeviceConfig(_ClaimModel):
    """One opaque configuration entry of our driver (``parameters``)."""

    api_version: Literal["cdi-gen.io/v1alpha1"]
    kind: Literal["DeviceConfig"]
    device_nodes: DeviceNodesConfig | None = None
    env: Annotated[
        dict[str, str] | None,
        Field(
            json_schema_extra={
                "maxProperties": MAX_ENV,
                "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]{0,127}$"},
                "additionalProperties": {"type": "string", "maxLength": MAX_ENV_VALUE},
            }
        ),
    ] = None

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if len(value) > MAX_ENV:
            raise ValueError(f"{len(value)} variables; at most {MAX_ENV}")
        for name, text in value.items():
            if _ENV_NAME.fullmatch(name) is None:
                raise ValueError(
                    f"name {quote(name)}: want a letter or _ then letters, digits or _ "
                    "(at most 128)"
                )
            if len(text) > MAX_ENV_VALUE:
                raise ValueError(f"{name}: value {quote(text)}: at most {MAX_ENV_VALUE} long")
            if (bad := _ENV_CONTROL.search(text)) is not None:
                raise ValueError(
                    f"{name}: value {quote(text)}: control character {bad.group()!r} (a "
                    "newline would add a variable, a NUL cut this one)"
                )
        return value


def _where(loc: Sequence[int | str]) -> str:
    out = "parameters"
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and _ENV_NAME.fullmatch(part):
            out += f".{part}"
        else:
            out += f"[{quote(part)}]"
    return out


def _message(err: Mapping[str, Any]) -> str:
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    msg = str(err["msg"])
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    if kind.startswith("literal_error"):
        return f"{quote(value)} is not known: {msg[0].lower()}{msg[1:]}"
    return f"{msg[0].lower()}{msg[1:]}, got {quote(value)}"


def parse_device_config(parameters: object) -> DeviceConfig:
    """``parameters`` of one opaque entry as a :class:`DeviceConfig`; raises
    :class:`DeviceConfigError` naming the first field at fault."""
    if not isinstance(parameters, dict):
        raise DeviceConfigError(f"parameters: want an object, got {quote(parameters)}")
    api_version, kind = parameters.get("apiVersion"), parameters.get("kind")
    if api_version != API_VERSION or kind != KIND:
        field = "parameters.apiVersion" if api_version != API_VERSION else "parameters.kind"
        raise DeviceConfigError(
            f"{field}: apiVersion {quote(api_version)}, kind {quote(kind)} is not a "
            f"configuration this driver knows: want apiVersion {API_VERSION}, kind {KIND}"
        )
    try:
        return DeviceConfig.model_validate(parameters)
    except ValidationError as exc:
        first, *others = problems(exc, where=_where, message=_message)
        more = f" (and {len(others)} more)" if others else ""
        raise DeviceConfigError(f"{first}{more}") from None


def merge(configs: Iterable[DeviceConfig]) -> DeviceConfig | None:
    """``configs`` laid over each other in order: a later entry's field replaces an earlier
    one's, each ``deviceNodes`` field and each environment variable on its own. None when
    there is none."""
    configs = list(configs)
    if len(configs) <= 1:  # the common case: nothing to lay over (and no model to rebuild)
        return configs[0] if configs else None
    nodes: dict[str, Any] = {}
    env: dict[str, str] = {}
    seen = False
    has_nodes = has_env = False
    for config in configs:
        seen = True
        if config.device_nodes is not None:
            has_nodes = True
            nodes.update(config.device_nodes.model_dump(exclude_none=True))
        if config.env is not None:
            has_env = True
            env.update(config.env)
    if not seen:
        return None
    return DeviceConfig(
        api_version=API_VERSION,
        kind=KIND,
        device_nodes=DeviceNodesConfig(**nodes) if has_nodes else None,
        env=env if has_env else None,
    )


@dataclass(frozen=True, slots=True)
class Layered:
    """One device's configuration as two layers: the DeviceClass's entries (``FromClass``,
    written by whoever may write DeviceClasses, the cluster's admin) and the claim's own
    (``FromClaim``, written by whoever may create claims in its namespace), each merged.
    The class's layer widens or narrows what the class's spec gives; the claim's may only
    narrow the result (:func:`cdi_gen.dra.driver.claimspec.configured_edits`)."""

    from_class: DeviceConfig | None = None
    from_claim: DeviceConfig | None = None

    def __bool__(self) -> bool:
        return self.from_class is not None or self.from_claim is not None


def selects(requests: Sequence[str], request: str) -> bool:
    """Whether an entry limited to ``requests`` (empty: all) applies to the allocation result
    of ``request``. A result of a subrequest (``main/sub``) is selected by ``main/sub`` and by
    its main request ``main``, as the API defines for prioritized lists."""
    if not requests:
        return True
    return request in requests or request.partition("/")[0] in requests


def device_config_schema() -> dict[str, Any]:
    """JSON Schema of a ``DeviceConfig`` (``schemas/deviceconfig.schema.json``)."""
    schema = DeviceConfig.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "cdi-gen DeviceConfig (opaque DRA configuration, cdi-gen.io/v1alpha1)"
    return schema
