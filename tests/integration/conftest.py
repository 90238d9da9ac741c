"""Fixtures of the integration tests that create kernel devices."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.loopdev import LoopDevices


@pytest.fixture
def loops() -> Iterator[LoopDevices]:
    """Loop devices numbered 300-999 (other suites use other ranges), removed at the end."""
    if not os.path.exists("/dev/loop-control"):
        pytest.fail("/dev/loop-control is missing: these tests need the loop driver and root")
    created = LoopDevices(low=300, high=999)
    try:
        yield created
    finally:
        created.cleanup()
