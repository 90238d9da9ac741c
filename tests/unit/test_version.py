"""One case per row of the CDI version table, in both directions."""

from __future__ import annotations

from typing import Any

import pytest

from cdi_gen.cdi.spec import Spec
from cdi_gen.cdi.version import apply_version, minimum_version, parse_version, version_problems
from cdi_gen.errors import VersionError


def _spec(device_edits: dict[str, Any], **top: Any) -> Spec:
    doc: dict[str, Any] = {
        "cdiVersion": "0.3.0",
        "kind": top.pop("kind", "example.com/fpga"),
        "devices": [
            {"name": top.pop("name", "fpga0"), "containerEdits": device_edits, **top.pop("dev", {})}
        ],
        **top,
    }
    return Spec.model_validate(doc)


NODE = {"deviceNodes": [{"path": "/dev/x"}]}

# (id, spec, minimum, field that needs it)
ROWS = [
    ("base", _spec(NODE), "0.3.0", None),
    (
        "mount-type",
        _spec({"mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]}),
        "0.4.0",
        "devices[0].containerEdits.mounts[0].type",
    ),
    (
        "host-path",
        _spec({"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/y"}]}),
        "0.5.0",
        "devices[0].containerEdits.deviceNodes[0].hostPath",
    ),
    ("digit-name", _spec(NODE, name="0dev"), "0.5.0", "devices[0].name"),
    ("spec-annotations", _spec(NODE, annotations={"a": "b"}), "0.6.0", "annotations"),
    (
        "device-annotations",
        _spec(NODE, dev={"annotations": {"a": "b"}}),
        "0.6.0",
        "devices[0].annotations",
    ),
    ("dotted-class", _spec(NODE, kind="example.com/fpga.v2"), "0.6.0", "kind"),
    (
        "intel-rdt",
        _spec({"intelRdt": {"closID": "c1"}}),
        "0.7.0",
        "devices[0].containerEdits.intelRdt",
    ),
    (
        "additional-gids",
        _spec({"additionalGids": [44]}),
        "0.7.0",
        "devices[0].containerEdits.additionalGids",
    ),
    (
        "net-devices",
        _spec({"netDevices": [{"hostInterfaceName": "eth1", "name": "net1"}]}),
        "1.1.0",
        "devices[0].containerEdits.netDevices",
    ),
    (
        "rdt-schemata",
        _spec({"intelRdt": {"schemata": []}}),
        "1.1.0",
        "devices[0].containerEdits.intelRdt.schemata",
    ),
    (
        "rdt-monitoring",
        _spec({"intelRdt": {"enableMonitoring": True}}),
        "1.1.0",
        "devices[0].containerEdits.intelRdt.enableMonitoring",
    ),
    (
        "spec-level-edits",
        _spec(NODE, containerEdits={"additionalGids": [5]}),
        "0.7.0",
        "containerEdits.additionalGids",
    ),
]


@pytest.mark.parametrize(
    ("spec", "minimum", "field"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_minimum_version_row(spec: Spec, minimum: str, field: str | None) -> None:
    assert minimum_version(spec) == minimum
    # Upward: the minimum and every newer version accept it.
    assert apply_version(spec).cdi_version == minimum
    assert apply_version(spec, "1.1.0").cdi_version == "1.1.0"
    # Downward: the version just below refuses, naming the field and the version it needs.
    below = {
        "0.3.0": None,
        "0.4.0": "0.3.0",
        "0.5.0": "0.4.0",
        "0.6.0": "0.5.0",
        "0.7.0": "0.6.0",
        "1.1.0": "1.0.0",
    }[minimum]
    if below is None:
        return
    with pytest.raises(VersionError) as info:
        apply_version(spec, below)
    text = str(info.value)
    assert field in text
    assert f"needs cdiVersion {minimum}" in text
    assert f"the target is {below}" in text


def test_removed_fields_cap_the_version() -> None:
    spec = _spec({"intelRdt": {"closID": "c", "enableCMT": True}})
    assert minimum_version(spec) == "0.7.0"
    assert apply_version(spec, "1.0.0").cdi_version == "1.0.0"
    problems = version_problems(spec, "1.1.0")
    assert [p.path for p in problems] == ["devices[0].containerEdits.intelRdt.enableCMT"]
    assert "only valid up to cdiVersion 1.0.0" in problems[0].message


def test_unknown_target_and_leading_v() -> None:
    spec = _spec(NODE)
    assert apply_version(spec, "v0.5.0").cdi_version == "0.5.0"
    with pytest.raises(VersionError, match=r"invalid version '0\.9\.0'"):
        apply_version(spec, "0.9.0")
    assert parse_version("v1.0.0") == (1, 0, 0)
