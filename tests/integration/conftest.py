"""Fixtures of the integration tests: kernel devices, and the thread boundary watched.

Every test here that drives the real gRPC handlers over a unix socket fails when a handler
changed loop-owned state (a board, the pool) from its server thread: the boundary's guard
refuses the change, and :func:`thread_boundary_kept` finds it counted."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from cdi_gen.kubelet.boundary import wrong_thread_changes
from tests.loopdev import LoopDevices


@pytest.fixture(autouse=True)
def thread_boundary_kept() -> Iterator[None]:
    """Fail the test if loop-owned state was changed off its loop's thread during it (a
    handler may swallow the guard's error into an answer the test does not look at)."""
    before = len(wrong_thread_changes())
    yield
    refused = wrong_thread_changes()[before:]
    assert not refused, f"loop-owned state changed off its loop's thread: {refused}"


@pytest.fixture
def loops() -> Iterator[LoopDevices]:
    """Loop devices numbered 700-999, removed at the end: below 700 are the ranges of the
    agents under test in this tier (test_agent.py, test_agent_failures.py), which would
    take a device of this fixture, made on another worker, for one of theirs."""
    if not os.path.exists("/dev/loop-control"):
        pytest.fail("/dev/loop-control is missing: these tests need the loop driver and root")
    created = LoopDevices(low=700, high=999)
    try:
        yield created
    finally:
        created.cleanup()
