"""The Allocate metrics hook counts every outcome without a labels() lookup per call."""

from __future__ import annotations

import pytest

from cdi_gen.metrics import Metrics


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_outcomes_and_reasons_are_counted_without_a_lookup_per_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    metrics = Metrics()
    hook = metrics.allocate_hook("example.com/loop", ["unknown", "internal"])

    def no_lookup(*args: object) -> None:
        raise AssertionError(f"labels{args} looked up on an Allocate")

    monkeypatch.setattr(metrics.allocations, "labels", no_lookup)
    monkeypatch.setattr(metrics.allocation_failures, "labels", no_lookup)
    for _ in range(3):
        hook("ok", "")
    hook("error", "unknown")
    hook("error", "internal")
    monkeypatch.undo()
    hook("error", "same-physical")  # a reason not named up front still counts
    total = "cdi_gen_allocations_total"
    failures = "cdi_gen_allocation_failures_total"
    resource = "example.com/loop"
    assert _value(metrics, total, resource=resource, outcome="ok") == 3
    assert _value(metrics, total, resource=resource, outcome="error") == 3
    assert _value(metrics, failures, resource=resource, reason="unknown") == 1
    assert _value(metrics, failures, resource=resource, reason="internal") == 1
    assert _value(metrics, failures, resource=resource, reason="same-physical") == 1
