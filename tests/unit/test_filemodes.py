"""The one file-mode rule (cdi_gen.config.filemodes): octal strings, integers of permission
bits, a mistaken decimal refused with the value it meant, and a JSON Schema that agrees."""

from __future__ import annotations

import re

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.cdi.codec import load_yaml
from cdi_gen.config.filemodes import MODE_BITS, PERMISSION_BITS, mode_json_schema, parse_mode

LIMITS = (PERMISSION_BITS, MODE_BITS)


@given(st.sampled_from(LIMITS).flatmap(lambda lim: st.tuples(st.just(lim), st.integers(0, lim))))
def test_every_octal_spelling_of_a_mode_parses_back_to_it(limit_mode: tuple[int, int]) -> None:
    limit, mode = limit_mode
    for text in (f"{mode:o}", f"0{mode:o}", f"{mode:#o}", f"0O{mode:o}", f"0o000{mode:o}"):
        assert parse_mode(text, limit) == mode, text


@given(st.integers(0, PERMISSION_BITS), st.sampled_from(LIMITS))
def test_an_integer_of_permission_bits_is_the_mode_itself(mode: int, limit: int) -> None:
    assert parse_mode(mode, limit) == mode


@given(st.integers(0, PERMISSION_BITS))
def test_yaml_octal_literals_and_0o_strings_load_as_the_mode(mode: int) -> None:
    # What the config loader (YAML 1.1) gives for each form a user writes unquoted.
    for text in (f"0{mode:o}", f"{mode:#o}"):
        assert parse_mode(load_yaml(f"m: {text}")["m"]) == mode, text


@given(st.integers(PERMISSION_BITS + 1, 2**40), st.sampled_from(LIMITS))
def test_an_integer_above_0o777_is_refused_naming_its_octal_value(value: int, limit: int) -> None:
    with pytest.raises(ValueError) as caught:
        parse_mode(value, limit)
    message = str(caught.value)
    assert message.startswith(str(value))
    if value < 2**32:
        assert f"{value:#o}" in message
    digits = str(value)
    if set(digits) <= set("01234567") and int(digits, 8) <= limit:
        assert f'"0o{int(digits, 8):o}"' in message  # the value its digits meant, as octal


@pytest.mark.parametrize(
    ("value", "limit", "message"),
    [
        (
            660,
            MODE_BITS,
            "660 is 0o1224 read as a decimal number, more than the permission bits an integer "
            'mode may have (at most 0o777): did you mean 0o660 (432)? write "0o660", or 0660 in '
            "YAML",
        ),
        (
            600,
            PERMISSION_BITS,
            "600 is 0o1130 read as a decimal number, more than the permission bits an integer "
            'mode may have (at most 0o777): did you mean 0o600 (384)? write "0o600", or 0600 in '
            "YAML",
        ),
        (
            1456,  # YAML's 02660 loads as 1456: both readings are named
            MODE_BITS,
            "1456 is 0o2660 read as a decimal number, more than the permission bits an integer "
            "mode may have (at most 0o777): write a mode with setuid, setgid or sticky bits as "
            'an octal string, "0o2660"; or "0o1456" if 1456 was meant as octal',
        ),
        (
            1528,
            MODE_BITS,
            "1528 is 0o2770, more than the permission bits an integer mode may have (at most "
            '0o777): write a mode with setuid, setgid or sticky bits as an octal string, "0o2770"',
        ),
        (
            4755,
            MODE_BITS,
            "4755 is 0o11223 read as a decimal number, more than a file mode holds (at most "
            '0o7777): did you mean 0o4755? write "0o4755"',
        ),
        (9999, MODE_BITS, "9999 is 0o23417, more than a file mode holds (at most 0o7777)"),
        (
            4095,
            PERMISSION_BITS,
            "4095 is 0o7777, more than the permission bits a mode may have here (at most 0o777)",
        ),
        (-1, MODE_BITS, "-1 is not a mode: want 0 to 0o777"),
        (
            True,
            MODE_BITS,
            'True is not a mode: want an integer (at most 0o777) or an octal string (e.g. "0o660")',
        ),
        (
            432.0,
            MODE_BITS,
            "432.0 is not a mode: want an integer (at most 0o777) or an octal string "
            '(e.g. "0o660")',
        ),
        (
            "0o668",
            MODE_BITS,
            "'0o668' is not an octal mode: want digits 0-7, optionally after 0o (e.g. \"0o660\")",
        ),
        (
            " 0660",
            MODE_BITS,
            "' 0660' is not an octal mode: want digits 0-7, optionally after 0o (e.g. \"0o660\")",
        ),
        ("0o17777", MODE_BITS, "'0o17777' is more than a file mode holds (at most 0o7777)"),
        (
            "01777",
            PERMISSION_BITS,
            "'01777' is more than the permission bits a mode may have here (at most 0o777)",
        ),
    ],
)
def test_refusals_exact(value: object, limit: int, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_mode(value, limit)
    assert str(caught.value) == message


@given(st.sampled_from(LIMITS), st.text(alphabet="0123456789oOx_+- ", max_size=7))
def test_the_schema_accepts_exactly_the_strings_the_model_accepts(limit: int, text: str) -> None:
    schema = mode_json_schema(limit)
    try:
        parse_mode(text, limit)
        accepted = True
    except ValueError:
        accepted = False
    assert _valid(text, schema) == accepted


@given(st.sampled_from(LIMITS), st.integers(-(2**12), 2**14))
def test_the_schema_accepts_exactly_the_integers_the_model_accepts(limit: int, value: int) -> None:
    accepted = 0 <= value <= PERMISSION_BITS
    assert _valid(value, mode_json_schema(limit)) == accepted
    if accepted:
        assert parse_mode(value, limit) == value
    else:
        with pytest.raises(ValueError):
            parse_mode(value, limit)


def test_the_schema_refuses_a_boolean_as_the_model_does() -> None:
    assert not _valid(True, mode_json_schema(MODE_BITS))


def test_the_schema_has_only_the_two_limits() -> None:
    with pytest.raises(ValueError, match=re.escape("limit 0o1777: want 0o777 or 0o7777")):
        mode_json_schema(0o1777)


def test_a_quoted_yaml_mode_is_a_string_read_as_octal() -> None:
    assert parse_mode(yaml.safe_load('m: "0660"')["m"]) == 0o660
    assert parse_mode(yaml.safe_load('m: "660"')["m"]) == 0o660


def _valid(value: object, schema: dict[str, object]) -> bool:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True
