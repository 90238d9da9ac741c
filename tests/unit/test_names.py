"""The CDI and Kubernetes name grammars: round trips and every way to break them."""

from __future__ import annotations

import contextlib
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen import names
from cdi_gen.errors import InvalidNameError

VENDOR = st.from_regex(r"[A-Za-z][A-Za-z0-9_.-]{0,20}[A-Za-z0-9]", fullmatch=True)
DEVICE = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_.:-]{0,30}[A-Za-z0-9])?", fullmatch=True)
VENDOR_ALPHABET = set(string.ascii_letters + string.digits + "_.-")
DEVICE_ALPHABET = VENDOR_ALPHABET | {":"}


@given(VENDOR, VENDOR, DEVICE)
def test_qualified_name_round_trip(vendor: str, cls: str, name: str) -> None:
    qualified = names.qualified_name(vendor, cls, name)
    assert names.parse_qualified_name(qualified) == (vendor, cls, name)
    assert names.is_qualified_name(qualified)


@given(VENDOR, st.characters().filter(lambda c: c not in VENDOR_ALPHABET), st.integers(0, 30))
def test_vendor_rejects_every_character_outside_alphabet(vendor: str, bad: str, at: int) -> None:
    broken = vendor[: at % len(vendor)] + bad + vendor[at % len(vendor) :]
    with pytest.raises(InvalidNameError) as info:
        names.validate_vendor(broken)
    assert repr(broken) in str(info.value)


@given(DEVICE, st.characters().filter(lambda c: c not in DEVICE_ALPHABET))
def test_device_name_rejects_every_character_outside_alphabet(name: str, bad: str) -> None:
    with pytest.raises(InvalidNameError):
        names.validate_device_name(name + bad + "x")


@given(st.text())
def test_parse_never_raises_anything_but_invalid_name(text: str) -> None:
    with contextlib.suppress(InvalidNameError):
        names.parse_qualified_name(text)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a", "must be at least 2 characters"),
        ("1abc", "should start with a letter"),
        ("abc-", "should end with a letter or digit"),
        ("ab c", "invalid character ' '"),
        ("", "must not be empty"),
        ("x" * 254, "longer than 253"),
    ],
    ids=["one-char", "digit-first", "dash-last", "space", "empty", "too-long"],
)
def test_vendor_errors_quote_value_and_rule(value: str, message: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        names.validate_vendor(value)
    assert message in str(info.value)
    # The value is quoted, cut short when long (a 254-character one is not repeated whole).
    assert repr(value)[:30] in str(info.value)
    assert len(str(info.value)) < 200


def test_one_character_class_is_refused() -> None:
    with pytest.raises(InvalidNameError, match="crashes podman"):
        names.validate_class("x")


def test_device_name_may_start_with_digit_and_contain_colon() -> None:
    names.validate_device_name("0000:3b:00.0")
    with pytest.raises(InvalidNameError, match="longer than 63"):
        names.validate_device_name("d" * 64)


@pytest.mark.parametrize(
    "qualified",
    ["", "/example.com/x=y", "example.com/fpga", "example.com=x", "ab/cd/ef=x", "ab/cd="],
)
def test_parse_qualified_name_refuses(qualified: str) -> None:
    with pytest.raises(InvalidNameError):
        names.parse_qualified_name(qualified)


@pytest.mark.parametrize("resource", ["vendor.com/gpu", "example.com/My_Dev.1", "a.b-c/x"])
def test_resource_name_valid(resource: str) -> None:
    names.validate_resource_name(resource)


@pytest.mark.parametrize(
    ("resource", "message"),
    [
        ("gpu", "domain/name"),
        ("kubernetes.io/x", "reserved"),
        ("foo.kubernetes.io/x", "reserved"),
        ("requests.vendor.com/x", "requests."),
        ("Vendor.com/gpu", "lowercase DNS subdomain"),
        ("a/b/c", "exactly one '/'"),
        ("vendor.com/-x", "starting and ending alphanumeric"),
        ("vendor.com/" + "x" * 64, "1-63 characters"),
    ],
)
def test_resource_name_invalid(resource: str, message: str) -> None:
    with pytest.raises(InvalidNameError, match=message):
        names.validate_resource_name(resource)


def test_kind_must_satisfy_both_grammars() -> None:
    assert names.validate_cdi_kind_as_resource("example.com", "fpga") == "example.com/fpga"
    with pytest.raises(InvalidNameError):
        names.validate_cdi_kind_as_resource("Example.com", "fpga")  # CDI ok, Kubernetes not
