"""What the API server package fails with: one line naming the object (or what was tried)
and why, never a traceback.

:class:`ApiServerError` for a call, :class:`KubeConfigError` (exit 2) for a configuration
that cannot be loaded.
"""

from __future__ import annotations

from cdi_gen.errors import CdiGenError
from cdi_gen.errors import ConfigError as CdiConfigError

__all__ = ["ApiServerError", "KubeConfigError", "first_line"]


class KubeConfigError(CdiConfigError):
    """No usable API server configuration; the message says what was tried."""


class ApiServerError(CdiGenError):
    """A call to the API server failed; ``status`` is the HTTP status when it answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def first_line(exc: BaseException) -> str:
    """Why ``exc`` happened, in its first line and at most 200 characters (its type when it
    has no message)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
