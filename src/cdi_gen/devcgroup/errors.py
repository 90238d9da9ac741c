"""The errors of the device-cgroup layer: a rule that cannot be read or applied, and a cgroup
that cannot be changed. Each is one line that quotes the value and says the rule it broke."""

from __future__ import annotations

from cdi_gen.errors import CdiGenError


class DeviceRuleError(CdiGenError, ValueError):
    """A device rule is malformed (an OCI ``linux.resources.devices`` entry, a
    ``devices.list`` line) or cannot be expressed (a hole punched in a wildcard rule)."""


class DeviceCgroupError(CdiGenError):
    """A cgroup's device access could not be read or changed: a path outside its hierarchy
    or through a link, a refused write, a failed ``bpf(2)`` call, an unexpected set of
    attached programs. ``errno`` is the system's error code when a call failed."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno
