"""The one backoff of every retry loop: waits bounded from below whatever is asked, a
repeated failure logged once per doubling of its attempts, and every failure named."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.retry import DESCRIBE_LIMIT, FLOOR_SECONDS, NEW_MESSAGES, Backoff, describe


@given(
    initial=st.floats(allow_nan=True, allow_infinity=False),
    maximum=st.floats(allow_nan=True, allow_infinity=False),
    failures=st.integers(min_value=1, max_value=200),
)
def test_no_wait_is_below_the_floor_or_above_the_bound(
    initial: float, maximum: float, failures: int
) -> None:
    """1e-9, 0, negative, NaN: a wait is never shorter than the floor (a setting of 1e-9 s
    made 46,765 start attempts in 2 s); never longer than the bound once that is above it."""
    backoff = Backoff(initial, maximum)
    for _ in range(failures):
        backoff.failed("x")
        assert FLOOR_SECONDS <= backoff.delay <= backoff.maximum
        assert not math.isnan(backoff.delay)
    if not math.isnan(maximum) and maximum >= FLOOR_SECONDS and not initial > maximum:
        assert backoff.maximum == maximum


def test_the_wait_doubles_up_to_the_bound_and_starts_over_after_a_success() -> None:
    backoff = Backoff(0.5, 3.0)
    waits = []
    for _ in range(5):
        backoff.failed("x")
        waits.append(backoff.delay)
    assert waits == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.succeeded()
    backoff.failed("x")
    assert (backoff.attempts, backoff.delay) == (1, 0.5)


def test_a_repeated_failure_is_logged_once_per_doubling_of_its_attempts() -> None:
    backoff = Backoff(0.1, 0.1)
    logged = [n for n in range(1, 1001) if backoff.failed("refused")]
    assert logged == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def test_a_new_failure_is_logged_at_once() -> None:
    backoff = Backoff()
    assert [backoff.failed(why) for why in ["a", "a", "a", "b", "b", "a", "a", "a"]] == [
        True,
        True,  # attempt 2
        False,
        True,  # attempt 4, and new
        False,
        False,  # seen before
        False,
        True,  # attempt 8
    ]
    backoff.succeeded()
    assert backoff.failed("a")  # after a success a failure is new


def test_causes_taking_turns_or_changing_text_do_not_log_every_attempt() -> None:
    """Two causes alternating, or a message quoting something that changes each time: the
    new ones are logged up to a few, then one line per doubling again."""
    turns = Backoff()
    logged = [n for n in range(1, 101) if turns.failed("ab"[n % 2])]
    assert logged == [1, 2, 4, 8, 16, 32, 64]
    changing = Backoff()
    logged = [n for n in range(1, 101) if changing.failed(f"port {n} refused")]
    assert logged == [*range(1, NEW_MESSAGES + 1), 16, 32, 64]


class _SilentError(Exception):
    def __str__(self) -> str:
        return ""


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (AssertionError(), "AssertionError without a message: AssertionError()"),
        (OSError(), "OSError without a message: OSError()"),
        (_SilentError(1), "_SilentError without a message: _SilentError(1)"),
        (ValueError("  \n "), "ValueError without a message: ValueError('  \\n ')"),
        (RuntimeError("first\nsecond\x1b[31m"), "first; second\\x1b[31m"),
    ],
)
def test_every_failure_is_named(exc: BaseException, text: str) -> None:
    assert describe(exc) == text


def test_a_huge_message_is_cut() -> None:
    text = describe(RuntimeError("x" * 1_000_000))
    assert len(text) < DESCRIBE_LIMIT + 40
    assert text.endswith("(1000000 characters)")
