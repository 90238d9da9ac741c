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


# --- DNS labels and DRA driver names ---------------------------------------------------------

ANY_TEXT = st.text(max_size=80) | st.from_regex(r"[a-z0-9-]{1,70}", fullmatch=True)


@given(ANY_TEXT, ANY_TEXT)
def test_dns_label_is_a_label_and_kept_and_hashed_forms_never_meet(a: str, b: str) -> None:
    # A label kept as it is never contains "--" and a hashed one always does, so the label of
    # one text can only equal another's by an 80-bit hash collision.
    la, lb = names.dns_label(a), names.dns_label(b)
    assert names.is_dns_label(la) and names.is_dns_label(lb)
    assert (la == a) == names.is_kept_label(a)
    if a != b:
        assert la != lb, (a, b)


def test_a_label_that_looks_hashed_is_hashed_too() -> None:
    # Kept as it was, "x--<16 base32>" could be another name's hashed form.
    hashed = names.dns_label("X")
    assert "--" in hashed
    assert names.dns_label(hashed) != hashed


@given(st.binary(max_size=40), st.binary(max_size=40), st.text(max_size=80))
def test_hashed_label_tells_keys_apart(a: bytes, b: bytes, readable: str) -> None:
    la, lb = names.hashed_label(readable, a), names.hashed_label(readable, b)
    assert names.is_dns_label(la) and not names.is_kept_label(la)
    assert (la == lb) == (a == b)


@pytest.mark.parametrize(
    ("driver", "message"),
    [
        ("a" * 61 + ".io", "longer than 63 characters"),
        ("Gpu.example.com", "lowercase DNS subdomain"),
        ("gpu_x.example.com", "lowercase DNS subdomain"),
        ("", "lowercase DNS subdomain"),
    ],
)
def test_driver_name_is_a_subdomain_of_at_most_63(driver: str, message: str) -> None:
    with pytest.raises(InvalidNameError, match=message):
        names.validate_driver_name(driver)
    names.validate_driver_name("a" * 60 + ".io")  # 63: the limit itself is fine
