"""Templates rendered for one device: its name and its container edits.

udev values are not trusted: anyone who can name a USB serial number or a loop device's
backing file chooses them. A value substituted into a template must be at most
:data:`MAX_VALUE_BYTES` long and hold no control character; otherwise :class:`TemplateError`
names the field and quotes the value, truncated. The checks hold for the value as udev gives
it, before any ``|filter`` of the field (:data:`FILTERS`) turns it into a name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cdi_gen import names
from cdi_gen.config.models import ClassConfig
from cdi_gen.config.templates import Field_, Template
from cdi_gen.discovery.links import chosen_link
from cdi_gen.discovery.match import sysfs_value
from cdi_gen.errors import InvalidNameError, quote
from cdi_gen.model import (
    DeviceRecord,
)


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
    #: The ``devnode`` pattern of the rule the record matched, which picks its ``{devlink}``.
    devnode_pattern: str | None = None
    group: str | None = None
    name: str | None = None
    vendor: str = ""
    cls: str = ""
    numa: int | None = None


def _number(value: int | None) -> str | None:
    return None if value is None else str(value)


def _last(path: str | None) -> str | None:
    return None if path is None else path.rsplit("/", 1)[-1]


def _parent_attribute(record: DeviceRecord, key: str) -> str | None:
    for attrs in (record.attributes, *(p.attributes for p in record.parents)):
        if (v := attrs.get(key)) is not None:
            return v.rstrip()
    return None


#: What each template field stands for: ``(context, key) -> value`` (None: the device lacks it).
_FIELD_VALUES: dict[str, Callable[[RenderContext, str], str | None]] = {
    "kernel": lambda c, _: c.record.sys_name,
    "number": lambda c, _: c.record.sys_number,
    "major": lambda c, _: _number(c.record.major),
    "minor": lambda c, _: _number(c.record.minor),
    "devnode": lambda c, _: c.record.devnode,
    "devname": lambda c, _: c.record.devnode.removeprefix("/dev/") if c.record.devnode else None,
    "devlink": lambda c, _: chosen_link(c.record, c.devnode_pattern),
    "devlink_name": lambda c, _: _last(chosen_link(c.record, c.devnode_pattern)),
    "subsystem": lambda c, _: c.record.subsystem,
    "devtype": lambda c, _: c.record.devtype,
    "driver": lambda c, _: c.record.driver,
    "group": lambda c, _: c.group,
    "name": lambda c, _: c.name,
    "vendor": lambda c, _: c.vendor,
    "class": lambda c, _: c.cls,
    "numa": lambda c, _: "" if c.numa is None else str(c.numa),
    "property": lambda c, key: c.record.properties.get(key),
    "attribute": lambda c, key: sysfs_value(c.record.attributes.get(key)),
    "parent_attribute": lambda c, key: _parent_attribute(c.record, key),
}


def _value(f: Field_, ctx: RenderContext) -> str | None:
    value_of = _FIELD_VALUES.get(f.name)
    if value_of is None:  # pragma: no cover - the config refuses unknown fields
        raise TemplateError(f, "unknown field")
    return value_of(ctx, f.key or "")


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
    "devlink": "the device has no udev link (DEVLINKS; is /run/udev mounted?)",
    "devlink_name": "the device has no udev link (DEVLINKS; is /run/udev mounted?)",
    "devtype": "the device has no DEVTYPE",
    "driver": "no driver is bound to the device",
    "group": "the class has no group",
    "name": "not available in the device name itself",
}


def _basename(value: str) -> str:
    """The last element of a path (``/srv/img/disk.img`` → ``disk.img``), trailing ``/``
    ignored; ValueError when there is none (``/``, an empty value)."""
    last = value.rstrip("/").rsplit("/", 1)[-1]
    if not last:
        raise ValueError(f"|basename: value {quote(value)} has no last path element")
    return last


def _name(value: str) -> str:
    try:
        return names.as_device_name(value)
    except InvalidNameError as exc:
        raise ValueError(f"|name: {exc}") from None


#: What each ``|filter`` of a field does to its value; ValueError says why it cannot.
FILTERS: dict[str, Callable[[str], str]] = {"basename": _basename, "name": _name}


def _filtered(part: Field_, value: str) -> str:
    for name in part.filters:
        try:
            value = FILTERS[name](value)
        except ValueError as exc:
            raise TemplateError(part, str(exc)) from None
    return value


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
        out.append(_filtered(part, value) if part.filters else value)
    return "".join(out)


def render_edits(
    cls: ClassConfig,
    ctx: RenderContext,
    nodes: Sequence[dict[str, Any]] = (),
    nets: Sequence[dict[str, str]] = (),
) -> dict[str, Any]:
    """The ``containerEdits`` of one device in wire form: its own device ``nodes`` first,
    then the class's edits rendered for it, and its own network interfaces (``nets``).

    camelCase keys in the spec models' field order, unset fields left out: the dict the spec
    holds (and its bytes are those the models would dump), so a device keeps this one dict
    rather than models and their dumps.
    """
    e = cls.container_edits

    def r(t: Template) -> str:
        return render_template(t, ctx)

    edits: dict[str, Any] = {}
    if e.env:
        edits["env"] = [r(t) for t in e.env]
    if nodes or e.device_nodes:
        edits["deviceNodes"] = [
            *nodes,
            *(
                device_node(
                    r(n.path),
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
            ),
        ]
    # Rendered in the order the fields were always rendered (mounts before hooks), so the
    # same field is named when several fail; stored in the spec's order.
    mounts = [
        _present(
            hostPath=r(m.host_path),
            containerPath=r(m.container_path),
            options=None if m.options is None else [r(t) for t in m.options],
            type=m.type,
        )
        for m in e.mounts
    ]
    hooks = [
        _present(
            hookName=h.hook_name,
            path=r(h.path),
            args=None if h.args is None else [r(t) for t in h.args],
            env=None if h.env is None else [r(t) for t in h.env],
            timeout=h.timeout,
        )
        for h in e.hooks
    ]
    if hooks:
        edits["hooks"] = hooks
    if mounts:
        edits["mounts"] = mounts
    if nets:
        edits["netDevices"] = list(nets)
    if e.additional_gids:
        edits["additionalGids"] = list(e.additional_gids)
    return edits


def _present(**fields: Any) -> dict[str, Any]:
    """``fields`` without the unset (None) ones, in the order given (the spec's)."""
    return {k: v for k, v in fields.items() if v is not None}


def device_node(
    path: str,
    *,
    host_path: str | None = None,
    type: str | None = None,
    major: int | None = None,
    minor: int | None = None,
    file_mode: int | None = None,
    permissions: str | None = None,
    uid: int | None = None,
    gid: int | None = None,
) -> dict[str, Any]:
    """One wire ``deviceNodes`` entry, its keys in the spec's order, unset ones left out."""
    return _present(
        path=path,
        hostPath=host_path,
        type=type,
        major=major,
        minor=minor,
        fileMode=file_mode,
        permissions=permissions,
        uid=uid,
        gid=gid,
    )
