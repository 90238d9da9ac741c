"""The exception tree of cdi-gen, and the exit code each kind of failure maps to.

::

    CdiGenError                  exit 1
    ├── ConfigError              exit 2   bad config file, flag or name
    │   ├── InvalidNameError              a name breaks the CDI or Kubernetes grammar
    │   └── SocketInUseError              another running copy of this instance serves a socket
    ├── SpecError                exit 1   a CDI spec document breaks the rules
    │   └── VersionError                  a field needs a newer cdiVersion than allowed
    ├── SpecWriteError           exit 1   the spec folder could not be written
    ├── DiscoveryError           exit 1   udev could not be read
    ├── LeftOutError             exit 1   devices left out of a spec still written or printed
    └── RegistrationError        exit 3   the kubelet refused or never answered

Each error keeps its inputs as attributes and quotes them in its message, so that a log line
alone tells what value broke which rule.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Mapping
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


#: Most characters of a file's own text that :func:`fragment` quotes.
FRAGMENT_LIMIT = 24
_NAME_RUN = re.compile(r"[A-Za-z0-9_.-]*")


def fragment(value: object) -> str:
    """A short, redacted quote of a key or value read from a file that may not be what we
    expect (``--config /etc/shadow``): of a string, its leading run of name characters
    (``A-Z a-z 0-9 _ . -``), at most 24, and its length when that is not all of it; of
    anything else, its type and size. Where :func:`quote` shows the value, this shows just
    enough to find it in a file that is ours, and nothing of a secret in one that is not."""
    if isinstance(value, str):
        run = _NAME_RUN.match(value)
        head = run.group(0)[:FRAGMENT_LIMIT] if run else ""
        return repr(value) if head == value else f"'{head}...' ({len(value)} characters)"
    if isinstance(value, Mapping):
        return f"a mapping of {len(value)} key{'' if len(value) == 1 else 's'}"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    # Small scalars say nothing secret; a huge int would not even convert to text.
    if (
        value is None
        or isinstance(value, bool | float)
        or (isinstance(value, int) and abs(value) < 10**12)
    ):
        return repr(value)
    return f"a value of type {type(value).__name__}"


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


class LeftOutError(CdiGenError):
    """A command wrote or printed its specs, but left devices out of them (each named in a
    warning before): the exit status must say that not every device made it."""


class SocketInUseError(ConfigError):
    """A socket this instance would serve is held by another running copy of the same
    instance (one pod UID): a second copy started with the pod's environment. It is never
    taken from it; the agent exits, naming the socket."""


class RegistrationError(CdiGenError):
    """The kubelet refused the registration or could not be reached."""

    exit_code = 3


class ClaimError(CdiGenError):
    """A ResourceClaim cannot be prepared: not found, another UID, not allocated, or the
    API server did not answer. The message names the claim and why; NodePrepareResources
    sends it as that claim's error."""
