"""call_hook: a metrics hook is called with its arguments, and what it raises is logged with
its traceback and never reaches the call it counts."""

from __future__ import annotations

import logging

import pytest

from cdi_gen.logs import call_hook

log = logging.getLogger("cdi_gen.test_call_hook")


def test_the_hook_gets_the_arguments() -> None:
    seen: list[tuple[str, str]] = []
    call_hook(lambda *args: seen.append(args), "ok", "", what="prepare hook of d", logger=log)
    assert seen == [("ok", "")]


def test_no_hook_is_nothing_to_call() -> None:
    call_hook(None, "ok", "", what="prepare hook of d", logger=log)


def test_what_a_hook_raises_is_logged_and_goes_no_further(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(outcome: str, reason: str) -> None:
        raise RuntimeError(f"counter gone ({outcome})")

    with caplog.at_level(logging.ERROR, logger=log.name):
        call_hook(broken, "error", "in-use", what="allocate hook of example.com/fpga", logger=log)
    [record] = caplog.records
    assert record.name == log.name
    assert record.getMessage() == "allocate hook of example.com/fpga failed"
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "counter gone (error)"
