"""Device rules: one allow or deny of a device type, major, minor and access, read from an
OCI spec's ``linux.resources.devices`` (what the runtime gave a container) or from a cgroup v1
``devices.list`` line, and written in the v1 text form (``c 1:3 rwm``).

A rule list also gets the change ``follow`` makes to it: the rules that name one device
exactly are moved to its new numbers, and every other rule stays as it was, in its place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from cdi_gen.devcgroup.errors import DeviceRuleError
from cdi_gen.errors import quote

__all__ = [
    "ACCESS_BITS",
    "RUNC_DEFAULTS",
    "DeviceRule",
    "access_bits",
    "access_text",
    "moved",
    "parse_list_line",
    "parse_oci_devices",
    "with_runc_defaults",
]

DeviceType = Literal["a", "b", "c"]

#: The kernel's access bits (``BPF_DEVCG_ACC_*``, the same in the v1 controller).
ACCESS_BITS: Mapping[str, int] = {"m": 1, "r": 2, "w": 4}
ALL_ACCESS = 7
#: Majors and minors are unsigned 32-bit in the OCI spec as runc reads it.
NUMBER_LIMIT = 2**32
_ORDER = "rwm"


def access_bits(text: str) -> int:
    """``"rw"`` → the kernel's bits; the caller has checked the text."""
    bits = 0
    for letter in text:
        bits |= ACCESS_BITS[letter]
    return bits


def access_text(bits: int) -> str:
    """The kernel's bits → ``"rwm"`` order, as the v1 controller prints them."""
    return "".join(letter for letter in _ORDER if bits & ACCESS_BITS[letter])


@dataclass(frozen=True, slots=True)
class DeviceRule:
    """One rule: ``allow`` or deny ``access`` (bits of :data:`ACCESS_BITS`) on devices of
    ``type`` (``a``: every device) with this ``major`` and ``minor`` (``None``: any)."""

    allow: bool
    type: DeviceType
    major: int | None
    minor: int | None
    access: int

    def __post_init__(self) -> None:
        if self.type == "a" and (self.major, self.minor) != (None, None):
            raise DeviceRuleError(f"device rule {self.text!r}: type 'a' takes no numbers")
        for number in (self.major, self.minor):
            if number is not None and not 0 <= number < NUMBER_LIMIT:
                raise DeviceRuleError(f"device rule: number {number} is not in 0..2^32-1")
        if not 0 < self.access <= ALL_ACCESS:
            raise DeviceRuleError(f"device rule: access bits {self.access} are not in 1..7")

    @property
    def text(self) -> str:
        """The v1 form, as ``devices.allow`` takes it and ``devices.list`` prints it."""
        major = "*" if self.major is None else str(self.major)
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.type} {major}:{minor} {access_text(self.access)}"

    def __str__(self) -> str:
        return f"{'allow' if self.allow else 'deny'} {self.text}"

    def names(self, type_: DeviceType, major: int, minor: int) -> bool:
        """Whether this rule names exactly this one device (no wildcard)."""
        return (self.type, self.major, self.minor) == (type_, major, minor)


def _access(value: object, where: str) -> int:
    if not isinstance(value, str) or not value or set(value) - set(_ORDER):
        raise DeviceRuleError(
            f"{where}.access: {quote(value)} is not a non-empty combination of 'r', 'w', 'm'"
        )
    return access_bits(value)


def _number(entry: Mapping[str, object], key: str, where: str) -> int | None:
    value = entry.get(key)
    if value is None:
        return None
    # bool is an int to Python, never to JSON's writer of a spec.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < NUMBER_LIMIT:
        raise DeviceRuleError(
            f"{where}.{key}: {quote(value)} is not a device number (an integer 0..2^32-1)"
        )
    return value


def _oci_rule(entry: object, where: str) -> DeviceRule:
    if not isinstance(entry, Mapping):
        raise DeviceRuleError(f"{where}: {quote(entry)} is not an object")
    allow = entry.get("allow")
    if not isinstance(allow, bool):
        raise DeviceRuleError(f"{where}.allow: {quote(allow)} is not true or false")
    # The spec's default type is "a", as runc reads an entry without one.
    type_ = entry.get("type", "a")
    if type_ not in ("a", "b", "c"):
        raise DeviceRuleError(f"{where}.type: {quote(type_)} is not 'a', 'b' or 'c'")
    major, minor = _number(entry, "major", where), _number(entry, "minor", where)
    access = _access(entry.get("access"), where)
    if type_ == "a":
        # runc reads numbers on an "a" rule and ignores them: every device is every device.
        major = minor = None
    return DeviceRule(allow, type_, major, minor, access)


def parse_oci_devices(
    value: object, where: str = "linux.resources.devices"
) -> tuple[DeviceRule, ...]:
    """An OCI spec's ``linux.resources.devices`` (the decoded JSON list) → rules in order.

    Read as runc reads it: a missing type is ``a``, a missing major or minor any; an empty
    access is refused (runc refuses it too). The first bad entry raises one line naming it.
    """
    if value is None:
        return ()
    if not isinstance(value, list):
        raise DeviceRuleError(f"{where}: {quote(value)} is not a list")
    return tuple(_oci_rule(entry, f"{where}[{i}]") for i, entry in enumerate(value))


def _list_number(text: str, line: str) -> int | None:
    if text == "*":
        return None
    if not text.isdigit() or int(text) >= NUMBER_LIMIT:
        raise DeviceRuleError(f"devices.list line {quote(line)}: {quote(text)} is not a number")
    return int(text)


def parse_list_line(line: str) -> DeviceRule:
    """One line of a v1 ``devices.list`` (``c 1:3 rwm``; ``a *:* rwm`` when all is allowed)
    → an allow rule."""
    fields = line.split(" ")
    numbers = fields[1].split(":") if len(fields) == 3 else []
    if len(numbers) != 2 or fields[0] not in ("a", "b", "c"):
        raise DeviceRuleError(f"devices.list line {quote(line)} is not 'TYPE MAJOR:MINOR ACCESS'")
    type_: DeviceType = "a" if fields[0] == "a" else "b" if fields[0] == "b" else "c"
    major, minor = (_list_number(n, line) for n in numbers)
    access = _access(fields[2], f"devices.list line {quote(line)}")
    if type_ == "a":
        major = minor = None
    return DeviceRule(True, type_, major, minor, access)


def _rwm(type_: DeviceType, major: int, minor: int | None) -> DeviceRule:
    return DeviceRule(True, type_, major, minor, ALL_ACCESS)


#: What runc adds after a container's own rules, each with the path of the node it stands
#: for (None: no node). runc leaves out a default whose path the spec's ``linux.devices``
#: lists. From runc 1.4's ``specconv.AllowedDevices`` (facts, not its code).
RUNC_DEFAULTS: tuple[tuple[str | None, DeviceRule], ...] = (
    (None, DeviceRule(True, "c", None, None, ACCESS_BITS["m"])),
    (None, DeviceRule(True, "b", None, None, ACCESS_BITS["m"])),
    ("/dev/null", _rwm("c", 1, 3)),
    ("/dev/random", _rwm("c", 1, 8)),
    ("/dev/full", _rwm("c", 1, 7)),
    ("/dev/tty", _rwm("c", 5, 0)),
    ("/dev/zero", _rwm("c", 1, 5)),
    ("/dev/urandom", _rwm("c", 1, 9)),
    (None, _rwm("c", 136, None)),
    (None, _rwm("c", 5, 2)),
    (None, _rwm("c", 10, 200)),
)


def with_runc_defaults(
    rules: Sequence[DeviceRule], device_paths: Iterable[str] = ()
) -> tuple[DeviceRule, ...]:
    """The rule list runc applies for a spec: the spec's own rules, then its defaults but
    those whose node the spec's ``linux.devices`` lists (``device_paths``)."""
    listed = set(device_paths)
    return (*rules, *(rule for path, rule in RUNC_DEFAULTS if path is None or path not in listed))


def moved(
    rules: Sequence[DeviceRule],
    type_: DeviceType,
    old: tuple[int, int],
    new: tuple[int, int],
) -> tuple[DeviceRule, ...]:
    """``rules`` with every rule that names the device ``type_ old`` exactly now naming
    ``new``: same place, same allow or deny, same access; every other rule unchanged.

    A device reached only through a wildcard has no rule of its own to move: refused, so
    that a caller never widens a wildcard by guessing.
    """
    if not any(rule.names(type_, *old) for rule in rules):
        raise DeviceRuleError(
            f"no rule names {type_} {old[0]}:{old[1]} exactly: nothing to move to {new[0]}:{new[1]}"
        )
    return tuple(
        replace(rule, major=new[0], minor=new[1]) if rule.names(type_, *old) else rule
        for rule in rules
    )
