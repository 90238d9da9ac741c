"""The device access an ordered rule list grants, computed as runc computes it before it
builds a container's cgroup v2 device program (its v1 "emulator"), so that a program built
here allows exactly what the runtime's allowed.

The list is read in order. An ``a`` rule resets everything: allow makes the default allow,
deny the default deny, and drops every exception. Any other rule changes the exception of its
exact (type, major, minor), wildcards included: one that goes against the default adds its
access to that exception, one that goes with it takes its access away. Taking access away
from a device that a wildcard exception still covers ("punching a hole", which v1 silently
ignores) is refused, as runc refuses it. A request matches an exception when the type is the
same, each number is equal or the exception's is a wildcard, and the exception's access holds
every bit asked for; the first match decides against the default, no match gives the
default. In the default-allow mode this means a request that asks for more than a deny
exception names is allowed (runc's program does the same; the v1 kernel would deny it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cdi_gen.devcgroup.errors import DeviceRuleError
from cdi_gen.devcgroup.rules import DeviceRule, DeviceType, access_text

__all__ = ["DeviceAccess", "Key"]

#: An exception's device: type (``b`` or ``c``), major and minor (``None``: any).
Key = tuple[DeviceType, int | None, int | None]


def _wildcard_first(key: Key) -> tuple[str, int, int]:
    type_, major, minor = key
    return (type_, -1 if major is None else major, -1 if minor is None else minor)


def _covering(key: Key) -> tuple[Key, ...]:
    """The wildcard exceptions that cover ``key``, itself left out."""
    type_, major, minor = key
    wider = ((type_, None, minor), (type_, major, None), (type_, None, None))
    return tuple(w for w in dict.fromkeys(wider) if w != key)


@dataclass(frozen=True, slots=True)
class DeviceAccess:
    """A default (``default_allow``) and the exceptions to it, each with its access bits."""

    default_allow: bool = False
    exceptions: Mapping[Key, int] = field(default_factory=dict)

    @classmethod
    def of(cls, rules: Iterable[DeviceRule]) -> DeviceAccess:
        """The access ``rules`` grant, in order; a hole punched in a wildcard raises one
        line naming the rule, its place and the wildcard."""
        default_allow = False
        exceptions: dict[Key, int] = {}
        for i, rule in enumerate(rules):
            if rule.type == "a":
                default_allow, exceptions = rule.allow, {}
                continue
            key: Key = (rule.type, rule.major, rule.minor)
            if rule.allow != default_allow:
                exceptions[key] = exceptions.get(key, 0) | rule.access
                continue
            for wider in _covering(key):
                held = exceptions.get(wider, 0) & rule.access
                if held:
                    raise DeviceRuleError(
                        f"rule {i} ({rule}) takes {access_text(held)!r} from a device that "
                        f"the wildcard {DeviceRule(True, *wider, held).text!r} still "
                        "grants; the kernel would ignore it: withdraw the wildcard instead"
                    )
            left = exceptions.get(key, 0) & ~rule.access
            if left:
                exceptions[key] = left
            else:
                exceptions.pop(key, None)
        return cls(default_allow, exceptions)

    def ordered(self) -> list[tuple[Key, int]]:
        """The exceptions in a stable order (type, then numbers, wildcards first)."""
        return sorted(self.exceptions.items(), key=lambda item: _wildcard_first(item[0]))

    def allows(self, type_: DeviceType, major: int, minor: int, access: int) -> bool:
        """Whether a request for ``access`` bits on this device is allowed."""
        for (t, ma, mi), bits in self.exceptions.items():
            if (
                t == type_
                and ma in (None, major)
                and mi in (None, minor)
                and access & bits == access
            ):
                return not self.default_allow
        return self.default_allow
