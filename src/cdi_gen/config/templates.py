"""Templates of the class config: ``deviceName`` and every string of ``containerEdits``.

Parsed at load time, so that a typo in a field name is a config error and not a per-device
runtime surprise; the rendering itself is in :mod:`cdi_gen.discovery.render`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

from cdi_gen.errors import quote

__all__ = [
    "DEVICE_NAME_FIELDS",
    "EDIT_FIELDS",
    "FILTERS",
    "KEYED_FIELDS",
    "PER_NODE_FIELDS",
    "EditTemplate",
    "Field_",
    "NameTemplate",
    "Template",
    "parse_template",
]


#: Fields a device name may use. ``group`` is the group key (the grouping parent's kernel name
#: or the grouping property's value); the others describe the device (the first member of a
#: group). There is deliberately no enumeration ``{index}``: it renumbers on hotplug and so
#: breaks the names pods were allocated with. ``devlink_name`` is the last component of
#: ``{devlink}`` (e.g. ``usb-FTDI_FT232R_USB_UART_A10K5ABC-if00-port0``): a name that stays
#: with the hardware when its kernel name is renumbered.
DEVICE_NAME_FIELDS: frozenset[str] = frozenset(
    {
        "kernel",
        "number",
        "major",
        "minor",
        "devnode",
        "devname",
        "devlink_name",
        "subsystem",
        "devtype",
        "driver",
        "group",
        "property",
        "attribute",
        "parent_attribute",
    }
)
#: Container edits may also use the rendered device name and the kind, and ``devlink``: the
#: udev link the rule's ``devnode`` pattern matched, else the device's by-id link, else its
#: by-path link (``node: {path: "{devlink}"}`` puts the node at that stable path in the
#: container). A path is never a valid device name, so names get ``devlink_name``, or a
#: path-valued field through a filter (:data:`FILTERS`), never ``{devlink}`` itself.
EDIT_FIELDS: frozenset[str] = DEVICE_NAME_FIELDS | {"name", "vendor", "class", "numa", "devlink"}
#: Fields whose value is one device node's: in a grouped class a device has several nodes, and
#: a container edit rendered once per device would carry the first node's value alone (the
#: others' silently lost), so the config refuses them there (``node.path`` is per node).
PER_NODE_FIELDS: frozenset[str] = frozenset(
    {"kernel", "number", "major", "minor", "devnode", "devname", "devlink", "devlink_name"}
)
#: Fields that take a ``[key]``.
KEYED_FIELDS: frozenset[str] = frozenset({"property", "attribute", "parent_attribute"})
#: Filters a field's value can pass through, ``{field|filter}``, several applied left to right
#: (rendered in :mod:`cdi_gen.discovery.render`): ``basename`` keeps the last element of a path
#: (a loop device's ``{attribute[loop/backing_file]}`` is one), ``name`` makes any text a valid
#: device name (:func:`cdi_gen.names.as_device_name`). A path-valued field is otherwise no name.
FILTERS: frozenset[str] = frozenset({"basename", "name"})

_FIELD_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:\[([^\[\]{}]+)\])?((?:\|[^{}|\[\]]*)*)\}")
_ATTRIBUTE_KEY_RE = re.compile(r"[A-Za-z0-9_.:+-]+(/[A-Za-z0-9_.:+-]+)*")


@dataclass(frozen=True, slots=True)
class Field_:  # noqa: N801 - "Field" is pydantic's; the trailing underscore keeps both readable
    """A ``{name}`` or ``{name[key]}`` placeholder of a template, with its ``|filter``s."""

    name: str
    key: str | None = None
    filters: tuple[str, ...] = ()

    def __str__(self) -> str:
        key = f"[{self.key}]" if self.key is not None else ""
        return f"{{{self.name}{key}{''.join('|' + f for f in self.filters)}}}"


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed template: literal text and fields, in order. ``{{`` and ``}}`` are braces."""

    source: str
    parts: tuple[str | Field_, ...]

    @property
    def fields(self) -> tuple[Field_, ...]:
        return tuple(p for p in self.parts if isinstance(p, Field_))


# Complexity exception (C901): a tokenizer; one loop over the characters reads better
# than states split across functions.
def parse_template(text: str, allowed: frozenset[str] = EDIT_FIELDS) -> Template:  # noqa: C901
    """Parse ``text``; raise ValueError quoting the template and the offending position.

    Only fields in ``allowed`` are accepted; ``property``/``attribute``/``parent_attribute``
    need a key, the others take none. Each ``|filter`` must be one of :data:`FILTERS`.
    """
    parts: list[str | Field_] = []
    literal: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if text.startswith("{{", i) or text.startswith("}}", i):
            literal.append(c)
            i += 2
            continue
        if c == "}":
            raise ValueError(
                f"template {quote(text)}: unmatched '}}' at position {i} (write '}}}}')"
            )
        if c != "{":
            literal.append(c)
            i += 1
            continue
        m = _FIELD_RE.match(text, i)
        if m is None:
            raise ValueError(
                f"template {quote(text)}: malformed field at position {i}, expected {{name}}, "
                "{name[key]} or {name|filter} (write '{{' for a literal brace)"
            )
        name, key = m.group(1), m.group(2)
        if name not in allowed:
            raise ValueError(
                f"template {quote(text)}: unknown field {{{name}}}, known: "
                + ", ".join(f"{{{f}}}" for f in sorted(allowed))
            )
        if name in KEYED_FIELDS and key is None:
            raise ValueError(
                f"template {quote(text)}: {{{name}}} needs a key, e.g. {{{name}[NAME]}}"
            )
        if name not in KEYED_FIELDS and key is not None:
            raise ValueError(f"template {quote(text)}: {{{name}}} takes no key, got [{key}]")
        if (
            name in ("attribute", "parent_attribute")
            and key is not None
            and (not _ATTRIBUTE_KEY_RE.fullmatch(key) or ".." in key.split("/"))
        ):
            raise ValueError(f"template {quote(text)}: invalid sysfs attribute name {quote(key)}")
        filters = tuple(m.group(3).split("|")[1:])
        if (unknown := next((f for f in filters if f not in FILTERS), None)) is not None:
            raise ValueError(
                f"template {quote(text)}: unknown filter {quote('|' + unknown)} of {{{name}}}, "
                "known: " + ", ".join(f"|{f}" for f in sorted(FILTERS))
            )
        if literal:
            parts.append("".join(literal))
            literal = []
        parts.append(Field_(name, key, filters))
        i = m.end()
    if literal:
        parts.append("".join(literal))
    return Template(text, tuple(parts))


def _template(allowed: frozenset[str]) -> BeforeValidator:
    # Parsing happens before pydantic sees the value, so the model holds parsed templates.
    def parse(value: Any) -> Any:
        if isinstance(value, Template):
            return value
        if not isinstance(value, str):
            raise ValueError(f"should be a string, got {quote(value)}")
        return parse_template(value, allowed)

    return BeforeValidator(parse)


#: A template string in container edits / a device name template.
_AS_STRING = PlainSerializer(lambda t: t.source, return_type=str)
_STRING_SCHEMA = WithJsonSchema({"type": "string", "description": "template"})
EditTemplate = Annotated[Template, _template(EDIT_FIELDS), _AS_STRING, _STRING_SCHEMA]
NameTemplate = Annotated[Template, _template(DEVICE_NAME_FIELDS), _AS_STRING, _STRING_SCHEMA]
