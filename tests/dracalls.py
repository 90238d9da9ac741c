"""The generic part of the DRA calls around a driver part, as the tests build it without the
gRPC server: what DraPlugin makes of its preparer, claim reader and status writer."""

from __future__ import annotations

from cdi_gen.dra.driver.preparer import PoolPreparer
from cdi_gen.dra.plugin.calls import ClaimCalls
from cdi_gen.dra.plugin.claims import ClaimReader
from cdi_gen.dra.plugin.claimstatus import ClaimStatus


def claim_calls(
    driver_part: PoolPreparer,
    claims: ClaimReader,
    *,
    max_reading_calls: int = 4,
    status: ClaimStatus | None = None,
) -> ClaimCalls:
    """``driver_part`` behind the generic part, reading claims through ``claims``."""
    return ClaimCalls(
        driver_part.driver,
        driver_part,
        claims,
        pool=driver_part.pool,
        max_reading_calls=max_reading_calls,
        status=status,
    )


def driver_part_of(calls: ClaimCalls) -> PoolPreparer:
    """The node's driver part behind ``calls`` (its checkpoint, its claim specs)."""
    driver_part = calls.preparer
    assert isinstance(driver_part, PoolPreparer)
    return driver_part
