"""File modes as configs write them: octal strings read as octal, integers that were meant
as octal refused with the value they meant.

The one rule of every ``fileMode`` cdi-gen reads (a class's ``node`` and extra
``deviceNodes``, a claim's ``DeviceConfig``):

- an integer is the mode itself and holds permission bits only (at most ``0o777``). YAML's own
  octal literal ``0660`` is an integer already (432), as JSON's ``432`` is; a bare ``660`` is
  decimal, which is ``0o1224`` (sticky, owner write-only): nobody means that, so an integer
  above ``0o777`` is refused, naming the octal value its digits meant;
- a string is octal, as ``chmod`` reads it: ``"0o660"``, ``"0660"`` and ``"660"`` are all
  ``0o660`` (YAML 1.1 loaders give ``0o660`` unquoted as this string too). Only a string may
  carry setuid, setgid or sticky bits (up to ``0o7777``, where the field allows them), because
  after loading, YAML's ``02660`` and a decimal ``1456`` are the same integer and the decimal
  mistake is far the likelier one.

:data:`FileMode` and :data:`PermissionMode` are the two field types; their JSON Schema says
the same rule.
"""

from __future__ import annotations

import functools
import re
from typing import Annotated, Any, Final

from pydantic import BeforeValidator, Field, WithJsonSchema

from cdi_gen.errors import quote

__all__ = [
    "MODE_BITS",
    "PERMISSION_BITS",
    "FileMode",
    "PermissionMode",
    "mode_json_schema",
    "parse_mode",
]

#: rwx for owner, group and others: all an integer mode may hold.
PERMISSION_BITS: Final = 0o777
#: With setuid, setgid and sticky: all ``mknod`` takes besides the node's type.
MODE_BITS: Final = 0o7777

#: An octal string: digits 0-7, optionally after ``0o`` (``0O`` as Python allows).
_OCTAL = re.compile(r"(?:0[oO])?([0-7]+)")
#: Larger integers are quoted, not spelled out in octal: a YAML integer may have thousands
#: of digits, and a message is one short line.
_SPELLED_LIMIT = 2**32


#: Said of an integer above 0o777 wherever it stands.
_INTEGER_RULE = (
    f"more than the permission bits an integer mode may have (at most {PERMISSION_BITS:#o})"
)


def _too_many_bits(limit: int) -> str:
    if limit == PERMISSION_BITS:
        return f"more than the permission bits a mode may have here (at most {limit:#o})"
    return f"more than a file mode holds (at most {limit:#o})"


def _integer(value: int, limit: int) -> int:
    if value < 0:
        raise ValueError(f"{quote(value)} is not a mode: want 0 to {PERMISSION_BITS:#o}")
    if value <= PERMISSION_BITS:
        return value
    if value >= _SPELLED_LIMIT:
        raise ValueError(f"{quote(value)} is {_too_many_bits(limit)}")
    digits = str(value)
    meant = int(digits, 8) if set(digits) <= set("01234567") else None
    decimal = f"{value} is {value:#o} read as a decimal number"
    if meant is not None and meant <= PERMISSION_BITS:
        # The usual slip: 660 or 600 written as chmod reads it, without YAML's leading 0.
        raise ValueError(
            f'{decimal}, {_INTEGER_RULE}: did you mean {meant:#o} ({meant})? write "{meant:#o}", '
            f"or 0{meant:o} in YAML"
        )
    if limit == PERMISSION_BITS:
        raise ValueError(f"{value} is {value:#o}, {_too_many_bits(limit)}")
    if value > limit:
        if meant is not None and meant <= limit:
            raise ValueError(
                f'{decimal}, {_too_many_bits(limit)}: did you mean {meant:#o}? write "{meant:#o}"'
            )
        raise ValueError(f"{value} is {value:#o}, {_too_many_bits(limit)}")
    special = (
        f"{_INTEGER_RULE}: write a mode with setuid, setgid or sticky bits as an octal string, "
        f'"{value:#o}"'
    )
    if meant is not None and meant <= limit:
        # 1456 is YAML's 02660 or 2660 meant as octal: the loaded integer cannot tell which.
        raise ValueError(f'{decimal}, {special}; or "{meant:#o}" if {value} was meant as octal')
    raise ValueError(f"{value} is {value:#o}, {special}")


def _string(value: str, limit: int) -> int:
    found = _OCTAL.fullmatch(value)
    if found is None:
        raise ValueError(
            f"{quote(value)} is not an octal mode: want digits 0-7, optionally after 0o "
            '(e.g. "0o660")'
        )
    mode = int(found.group(1), 8)
    if mode > limit:
        raise ValueError(f"{quote(value)} is {_too_many_bits(limit)}")
    return mode


def parse_mode(value: object, limit: int = MODE_BITS) -> int:
    """``value`` as a mode of at most ``limit`` (:data:`PERMISSION_BITS` or :data:`MODE_BITS`)
    by the module's rule; raises ValueError quoting the value and the rule, and, for an
    integer that reads as a mistaken decimal, the value it meant."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        # bool first: True is an int to Python, never a mode to a user.
        raise ValueError(
            f"{quote(value)} is not a mode: want an integer (at most {PERMISSION_BITS:#o}) or "
            'an octal string (e.g. "0o660")'
        )
    if isinstance(value, str):
        return _string(value, limit)
    return _integer(value, limit)


def mode_json_schema(limit: int) -> dict[str, Any]:
    """The rule as JSON Schema: an integer of permission bits, or an octal string whose
    value is at most ``limit`` (:data:`PERMISSION_BITS` or :data:`MODE_BITS`)."""
    if limit not in (PERMISSION_BITS, MODE_BITS):
        raise ValueError(f"limit {limit:#o}: want {PERMISSION_BITS:#o} or {MODE_BITS:#o}")
    # Both limits are all sevens, so "at most limit" is "at most so many digits after the
    # leading zeros".
    width = len(f"{limit:o}")
    return {
        "anyOf": [
            {"type": "integer", "minimum": 0, "maximum": PERMISSION_BITS},
            {"type": "string", "pattern": f"^(0[oO])?0*[0-7]{{1,{width}}}$"},
        ]
    }


def _mode(limit: int) -> BeforeValidator:
    # Before pydantic's own int check: strict models refuse strings, lax ones read "0660" as
    # decimal 660, and neither knows a mistaken decimal.
    return BeforeValidator(functools.partial(parse_mode, limit=limit))


#: A mode that may carry setuid, setgid and sticky bits (a class's device nodes).
FileMode = Annotated[
    int, _mode(MODE_BITS), Field(ge=0, le=MODE_BITS), WithJsonSchema(mode_json_schema(MODE_BITS))
]
#: Permission bits only (a claim's device nodes: the node's type and special bits are the
#: class's).
PermissionMode = Annotated[
    int,
    _mode(PERMISSION_BITS),
    Field(ge=0, le=PERMISSION_BITS),
    WithJsonSchema(mode_json_schema(PERMISSION_BITS)),
]
