"""A claim reader for two DRA instances sharing one node's state: claims c1 and c2, both
allocated the pool's fpga-0, and how many claims were read."""

from __future__ import annotations

from collections.abc import Sequence

from cdi_gen.errors import ClaimError
from cdi_gen.model import AllocatedDevice, ClaimView


class CountingClaims:
    """Claims c1 and c2 of ``driver``'s ``pool``, both allocated fpga-0; counts reads."""

    def __init__(self, driver: str, pool: str) -> None:
        self.driver = driver
        self.pool = pool
        self.reads = 0

    def read_claims(
        self, refs: Sequence[tuple[str, str]], timeout: float
    ) -> list[ClaimView | ClaimError]:
        self.reads += len(refs)
        result = AllocatedDevice("fpga", self.driver, self.pool, "fpga-0")
        return [ClaimView(ns, name, f"uid-{name[1:]}", (result,)) for ns, name in refs]
