"""The exception tree of cdi-gen, and the exit code each kind of failure maps to.

::

    CdiGenError                  exit 1
    ├── ConfigError              exit 2   bad config file, flag or name
    │   └── InvalidNameError              a name breaks the CDI or Kubernetes grammar
    ├── SpecError                exit 1   a CDI spec document breaks the rules
    │   └── VersionError                  a field needs a newer cdiVersion than allowed
    ├── SpecWriteError           exit 1   the spec folder could not be written
    ├── DiscoveryError           exit 1   udev could not be read
    └── RegistrationError        exit 3   the kubelet refused or never answered

Each error keeps its inputs as attributes and quotes them in its message, so that a log line
alone tells what value broke which rule.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass

#: Longest quoted value in a message: enough to recognise it, short enough for one log line.
QUOTE_LIMIT = 80

_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = QUOTE_LIMIT
_REPR.maxother = QUOTE_LIMIT
_REPR.maxlong = 40
for _name in ("maxdict", "maxlist", "maxtuple", "maxset", "maxfrozenset", "maxdeque", "maxarray"):
    setattr(_REPR, _name, 4)


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` cut to about ``limit`` characters, cheap even for huge or deep values.

    Used wherever a message quotes input: a 4 MB device ID or a config bomb must not become
    a 4 MB log line.
    """
    if isinstance(value, str | bytes) and len(value) <= limit:
        return repr(value)
    text = _REPR.repr(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    if isinstance(value, str | bytes):
        text += f" ({len(value)} long)"
    return text


class CdiGenError(Exception):
    """Base of every error this package raises on purpose."""

    exit_code = 1


class ConfigError(CdiGenError):
    """A configuration value is invalid; the CLI exits 2."""

    exit_code = 2


class InvalidNameError(ConfigError, ValueError):
    """A vendor, class, device or resource name breaks its grammar.

    ``kind`` says which grammar (``vendor``, ``class``, ``device name``...), ``value`` the
    offending text and ``rule`` what the grammar requires.
    """

    def __init__(self, kind: str, value: str, rule: str) -> None:
        super().__init__(kind, value, rule)
        self.kind = kind
        self.value = value
        self.rule = rule

    def __str__(self) -> str:
        return f"invalid {self.kind} {quote(self.value)}: {self.rule}"


@dataclass(frozen=True, slots=True)
class Problem:
    """One rule broken at one place of a document (``path`` like ``devices[1].name``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class SpecError(CdiGenError):
    """A CDI spec document is invalid; ``problems`` lists every rule it breaks."""

    def __init__(self, problems: list[Problem], source: str = "") -> None:
        super().__init__(problems, source)
        self.problems = problems
        self.source = source

    def __str__(self) -> str:
        prefix = f"{self.source}: " if self.source else ""
        return "\n".join(f"{prefix}{p}" for p in self.problems)


class VersionError(SpecError):
    """The spec uses a field that the pinned ``cdiVersion`` does not know."""


class SpecWriteError(CdiGenError):
    """Writing or removing a spec file failed (permissions, full disk, foreign file)."""


class DiscoveryError(CdiGenError):
    """udev or sysfs could not be read."""


class RegistrationError(CdiGenError):
    """The kubelet refused the registration or could not be reached."""

    exit_code = 3


class ClaimError(CdiGenError):
    """A ResourceClaim cannot be prepared: not found, another UID, not allocated, or the
    API server did not answer. The message names the claim and why; NodePrepareResources
    sends it as that claim's error."""
