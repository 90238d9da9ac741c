"""Device rules as a runtime writes them (an OCI spec's ``linux.resources.devices``) and as the
v1 controller prints them: read as runc reads them, each bad entry refused in one line quoting
the value and saying the rule, and the v1 text form round-tripped. And ``bpf(2)`` refused in one
line on a machine whose system call number is not known."""

from __future__ import annotations

import platform

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdi_gen.devcgroup.bpf import Bpf
from cdi_gen.devcgroup.errors import DeviceCgroupError, DeviceRuleError
from cdi_gen.devcgroup.rules import (
    RUNC_DEFAULTS,
    DeviceRule,
    parse_list_line,
    parse_oci_devices,
    with_runc_defaults,
)
from tests.conftest import examples


def test_a_containerd_style_list_is_read_in_order() -> None:
    rules = parse_oci_devices(
        [
            {"allow": False, "access": "rwm"},
            {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
            {"allow": True, "type": "c", "major": 136, "access": "rw"},
            {"allow": True, "type": "b", "major": 7, "minor": 0, "access": "mr"},
        ]
    )
    assert [r.text for r in rules] == ["a *:* rwm", "c 1:3 rwm", "c 136:* rw", "b 7:0 rm"]
    assert [r.allow for r in rules] == [False, True, True, True]
    assert parse_oci_devices(None) == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"devices": []}, "linux.resources.devices: {'devices': []} is not a list"),
        (["c 1:3 rwm"], "linux.resources.devices[0]: 'c 1:3 rwm' is not an object"),
        ([{"access": "rwm"}], "[0].allow: None is not true or false"),
        ([{"allow": "yes", "access": "rwm"}], "[0].allow: 'yes' is not true or false"),
        ([{"allow": True, "type": "u", "access": "r"}], "[0].type: 'u' is not 'a', 'b' or 'c'"),
        ([{"allow": True, "type": "c", "major": -1, "access": "r"}], "[0].major: -1 is not"),
        ([{"allow": True, "type": "c", "minor": 2**32, "access": "r"}], "[0].minor: 4294967296"),
        ([{"allow": True, "type": "c", "major": "1", "access": "r"}], "[0].major: '1' is not"),
        ([{"allow": True, "type": "c", "major": True, "access": "r"}], "[0].major: True is not"),
        ([{"allow": True, "type": "c", "major": 1.5, "access": "r"}], "[0].major: 1.5 is not"),
        ([{"allow": True, "type": "c"}], "[0].access: None is not a non-empty combination"),
        ([{"allow": True, "type": "c", "access": ""}], "[0].access: '' is not a non-empty"),
        ([{"allow": True, "type": "c", "access": "rwx"}], "[0].access: 'rwx' is not"),
        (
            [{"allow": True, "access": "r"}, {"allow": True, "access": "r" * 500 + "x"}],
            "linux.resources.devices[1].access: 'rrrr",
        ),
    ],
)
def test_a_bad_entry_is_refused_in_one_line_quoting_it(value: object, message: str) -> None:
    with pytest.raises(DeviceRuleError) as raised:
        parse_oci_devices(value)
    text = str(raised.value)
    assert message in text
    assert "\n" not in text and len(text) < 200


def test_numbers_on_an_a_rule_are_ignored_as_runc_ignores_them() -> None:
    (rule,) = parse_oci_devices([{"allow": True, "major": 4, "minor": 2, "access": "r"}])
    assert (rule.type, rule.major, rule.minor) == ("a", None, None)


list_rules = st.builds(
    DeviceRule,
    allow=st.just(True),
    type=st.sampled_from(["b", "c"]),
    major=st.none() | st.integers(0, 2**32 - 1),
    minor=st.none() | st.integers(0, 2**32 - 1),
    access=st.integers(1, 7),
)


@settings(max_examples=examples(200), deadline=None)
@given(list_rules)
def test_the_v1_text_form_round_trips(rule: DeviceRule) -> None:
    assert parse_list_line(rule.text) == rule


@pytest.mark.parametrize(
    "line", ["c 1:3", "x 1:3 rwm", "c 1-3 rwm", "c 1:3 rwx", "c -1:3 rwm", "c 1:3 rwm extra", ""]
)
def test_a_bad_list_line_is_refused_quoting_it(line: str) -> None:
    with pytest.raises(DeviceRuleError, match=r"devices\.list line") as raised:
        parse_list_line(line)
    assert repr(line) in str(raised.value)


def test_runc_leaves_out_a_default_whose_node_the_spec_lists() -> None:
    spec = (DeviceRule(False, "a", None, None, 7),)
    everything = with_runc_defaults(spec)
    assert everything[0] == spec[0]
    assert len(everything) == 1 + len(RUNC_DEFAULTS)
    fewer = with_runc_defaults(spec, ["/dev/null", "/dev/zero"])
    assert {r.text for r in everything} - {r.text for r in fewer} == {"c 1:3 rwm", "c 1:5 rwm"}


def test_bpf_refuses_a_machine_whose_system_call_number_it_does_not_know(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    with pytest.raises(DeviceCgroupError) as raised:
        Bpf()
    assert str(raised.value) == (
        "bpf(2) is not supported on 'riscv64': its system call number is known only for x86_64"
    )
