"""Why the driver part refuses a claim it was given: the rules of this driver's devices.

Each value is also the ``reason`` of the prepare metrics hook and of the answer's line (the
generic part's own reasons are :class:`~cdi_gen.dra.plugin.claims.Refusal`).
"""

from __future__ import annotations

import enum

__all__ = ["DriverRefusal"]


class DriverRefusal(enum.StrEnum):
    """Why this driver does not prepare a claim that is the one the kubelet named."""

    TOO_MANY_RESULTS = "too-many-results"
    INVALID_REQUEST = "invalid-request"
    NOT_ALLOCATED = "not-allocated"
    NO_DEVICES = "no-devices"
    OTHER_POOL = "other-pool"
    UNKNOWN_DEVICE = "unknown-device"
    GONE = "gone"
    UNHEALTHY = "unhealthy"
    UNRESOLVED = "unresolved"
    IN_USE = "in-use"
    INVALID_CONFIG = "invalid-config"
    CLAIM_SPEC = "claim-spec"
    WIDENS_CLASS = "widens-class"
    INVALID_SHARE = "invalid-share"
