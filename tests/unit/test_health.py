"""The health seam: a class names sysfs attribute values a healthy device has (recorded data)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from cdi_gen.config.loader import parse_config
from cdi_gen.config.models import AgentConfig
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.errors import ConfigError
from cdi_gen.model import DeviceRecord
from cdi_gen.sources.records import record_from_json, records_from_export_db

DATA = Path(__file__).resolve().parents[1] / "data" / "udev"


def _config(health: dict[str, Any] | None, **cls: Any) -> AgentConfig:
    entry: dict[str, Any] = {"name": "loop", "match": {"subsystem": "block", "kernel": "loop[0-9]"}}
    if health is not None:
        entry["health"] = health
    entry.update(cls)
    return parse_config({"vendor": "example.com", "classes": [entry]}, "test.yaml")


@pytest.fixture(scope="module")
def loops() -> list[DeviceRecord]:
    """loop0-loop7 as `udevadm info --export-db` recorded them on a VM."""
    records = records_from_export_db((DATA / "export-db-vm.txt").read_text())
    found = [r for r in records if r.subsystem == "block" and r.sys_name[:4] == "loop"]
    assert len(found) >= 2, "the recording has loop devices"
    return found


def _with_size(record: DeviceRecord, size: str) -> DeviceRecord:
    # sysfs ends attribute values with a newline; udev compares without trailing whitespace.
    return dataclasses.replace(record, attributes={**record.attributes, "size": size + "\n"})


def test_without_a_health_check_a_present_node_is_healthy(loops: list[DeviceRecord]) -> None:
    discovery = Discovery(_config(None))
    discovery.replace([_with_size(r, "0") for r in loops])
    assert all(d.healthy for d in discovery.devices("loop"))


def test_attribute_check_decides_health(loops: list[DeviceRecord]) -> None:
    config = _config({"attributes": {"size": "[1-9]*"}})
    attached, detached = loops[0], loops[1]
    discovery = Discovery(config)
    discovery.replace([_with_size(attached, "2048"), _with_size(detached, "0")])
    health = {d.name: d.healthy for d in discovery.devices("loop")}
    assert health == {attached.sys_name: True, detached.sys_name: False}
    # An unhealthy device stays advertised (as Unhealthy) and in the spec.
    assert {d.id: d.healthy for d in discovery.advertised("loop")} == health
    doc = discovery.class_spec("loop").document
    assert doc is not None and [d["name"] for d in doc["devices"]] == sorted(health)

    # A change uevent with the new value flips it, and is reported as a change.
    (change,) = discovery.apply(
        [dataclasses.replace(_with_size(detached, "4096"), action="change")]
    )
    assert change.changed == (detached.sys_name,)
    assert all(d.healthy for d in discovery.devices("loop"))


def test_the_health_attribute_is_read_from_sysfs(loops: list[DeviceRecord]) -> None:
    """The class's health attributes are among those udev reads for it (see RecordWants)."""
    discovery = Discovery(
        _config({"attributes": {"size": "[1-9]*"}, "parentAttributes": {"x": "1"}})
    )
    assert "size" in discovery.wants.attributes
    assert "x" in discovery.wants.parent_attributes


def test_a_missing_attribute_is_unhealthy(loops: list[DeviceRecord]) -> None:
    discovery = Discovery(_config({"attributes": {"size": "*"}}))
    discovery.replace([loops[0]])  # recorded without sysfs attributes
    assert [d.healthy for d in discovery.devices("loop")] == [False]


def test_parent_attributes_follow_attrs_semantics() -> None:
    """ATTRS: the device or one parent holds every attribute (recorded FPGA port: PCI vendor)."""
    records = [record_from_json(r) for r in json.loads((DATA / "hardware.json").read_text())]
    port = next(r for r in records if r.sys_name.startswith("dfl-port"))
    cls = {"name": "fpga", "match": {"kernel": "dfl-port.*"}}
    for glob, healthy in (("0x8086", True), ("0x1172", False)):
        config = parse_config(
            {
                "vendor": "example.com",
                "classes": [{**cls, "health": {"parentAttributes": {"vendor": glob}}}],
            },
            "test.yaml",
        )
        discovery = Discovery(config)
        discovery.replace([port])
        assert [d.healthy for d in discovery.devices("fpga")] == [healthy], glob


@pytest.mark.parametrize(
    ("health", "message"),
    [
        ({}, "test.yaml: classes[0].health: a health check needs attributes or parentAttributes"),
        (
            {"attributes": {"../x": "1"}},
            "classes[0].health.attributes: invalid sysfs attribute name '../x'",
        ),
        (
            {"attribute": {"size": "1"}},
            "classes[0].health: unknown key 'attribute', allowed: attributes, parentAttributes",
        ),
    ],
    ids=["empty", "bad-name", "unknown-key"],
)
def test_bad_health_config_names_the_field(health: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        _config(health)
    assert message in str(exc.value)


def test_the_documented_health_example_is_a_valid_config() -> None:
    """docs/configuration.md's health example parses and reads the attribute it names."""
    import yaml

    from tests.conftest import REPO

    text = (REPO / "docs" / "configuration.md").read_text()
    start = text.index("```yaml\nvendor: example.org")
    block = text[start + len("```yaml\n") : text.index("```", start + 8)]
    config = parse_config(yaml.safe_load(block), "docs/configuration.md")
    health = config.classes[0].health
    assert health is not None and health.attributes == {"size": "[1-9]*"}
    assert "size" in config.classes[0].wanted_attributes
