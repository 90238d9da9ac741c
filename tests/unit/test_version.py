"""One case per row of the CDI version table, in both directions: what the agent writes
(:func:`~cdi_gen.cdi.builder.assemble`) and what a reader accepts
(:func:`~cdi_gen.cdi.validation.check_document`)."""

from __future__ import annotations

from typing import Any

import pytest

from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.cdi.validation import check_document
from cdi_gen.cdi.version import parse_version
from cdi_gen.errors import VersionError


def _spec(device_edits: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "cdiVersion": "0.3.0",
        "kind": top.pop("kind", "example.com/fpga"),
        "devices": [
            {"name": top.pop("name", "fpga0"), "containerEdits": device_edits, **top.pop("dev", {})}
        ],
        **top,
    }


def _assemble(doc: dict[str, Any], target: str | None = None) -> str:
    """The cdiVersion the agent writes for ``doc``'s one device (no spec-level fields)."""
    (device,) = doc["devices"]
    entry = build_entry(device["name"], device["containerEdits"])
    return str(assemble(doc["kind"], [entry], target_version=target)["cdiVersion"])


def _declared(doc: dict[str, Any], version: str) -> dict[str, Any]:
    return {**doc, "cdiVersion": version}


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


BELOW = {"0.3.0": None, "0.4.0": "0.3.0", "0.5.0": "0.4.0", "0.6.0": "0.5.0", "0.7.0": "0.6.0"}
BELOW["1.1.0"] = "1.0.0"
#: Rows the agent cannot produce: it writes no annotations and no spec-level edits.
READ_ONLY = {"spec-annotations", "device-annotations", "spec-level-edits"}


@pytest.mark.parametrize(("row", "spec", "minimum", "field"), ROWS, ids=[r[0] for r in ROWS])
def test_minimum_version_row(
    row: str, spec: dict[str, Any], minimum: str, field: str | None
) -> None:
    below = BELOW[minimum]
    # A reader: the minimum and every newer version accept it; the one below refuses.
    assert check_document(_declared(spec, minimum)) == []
    assert check_document(_declared(spec, "1.1.0")) == []
    if below is not None:
        (problem,) = check_document(_declared(spec, below))
        assert f"must be at least v{minimum}" in problem.message
    if row in READ_ONLY:
        return
    # The agent: writes the minimum, or a newer pin; a pin just below refuses, naming the
    # field and the version it needs.
    assert _assemble(spec) == minimum
    assert _assemble(spec, "1.1.0") == "1.1.0"
    if below is None:
        return
    with pytest.raises(VersionError) as info:
        _assemble(spec, below)
    text = str(info.value)
    assert field is not None
    # The builder names a device by its name, where a document names it by its index.
    assert field.replace("devices[0]", f"devices[{spec['devices'][0]['name']!r}]") in text
    assert f"needs cdiVersion {minimum}" in text
    assert f"the target is {below}" in text


def test_removed_fields_cap_the_version() -> None:
    spec = _spec({"intelRdt": {"closID": "c", "enableCMT": True}})
    assert _assemble(spec) == "0.7.0"
    assert _assemble(spec, "1.0.0") == "1.0.0"
    with pytest.raises(VersionError) as info:
        _assemble(spec, "1.1.0")
    assert "devices['fpga0'].containerEdits.intelRdt.enableCMT" in str(info.value)
    (problem,) = check_document(_declared(spec, "1.1.0"))
    assert problem.path == "devices[0].containerEdits.intelRdt.enableCMT"
    assert "only valid up to cdiVersion 1.0.0" in problem.message


def test_unknown_target_and_leading_v() -> None:
    spec = _spec(NODE)
    assert _assemble(spec, "v0.5.0") == "0.5.0"
    with pytest.raises(VersionError, match=r"invalid version '0\.9\.0'"):
        _assemble(spec, "0.9.0")
    assert parse_version("v1.0.0") == (1, 0, 0)
