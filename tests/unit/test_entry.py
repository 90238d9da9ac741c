"""Pre-validated entries assemble into the same document the models produce."""

from __future__ import annotations

import pytest

from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.cdi.codec import dump_document, load_spec
from cdi_gen.errors import SpecError, VersionError


def test_assembled_document_matches_model_path() -> None:
    entries = [
        build_entry("fpga-0", {"deviceNodes": [{"path": "/dev/dfl-port.0"}]}),
        build_entry("fpga-1", {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/dfl-port.1"}]}),
    ]
    doc = assemble("example.com/fpga", entries)
    assert doc["cdiVersion"] == "0.5.0"
    data = dump_document(doc)
    assert load_spec(data).to_wire() == doc


def test_bad_entry_reports_every_problem_by_device_name() -> None:
    with pytest.raises(SpecError) as info:
        build_entry("fpga-0", {"env": ["NOPE"], "deviceNodes": [{"path": "dev/x"}]})
    text = str(info.value)
    assert "devices['fpga-0'].containerEdits.env[0]" in text
    assert "devices['fpga-0'].containerEdits.deviceNodes[0].path" in text


def test_assemble_refuses_duplicates_empty_and_old_target() -> None:
    entry = build_entry("fpga-0", {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/y"}]})
    with pytest.raises(SpecError, match="multiple device 'fpga-0'"):
        assemble("example.com/fpga", [entry, entry])
    with pytest.raises(SpecError, match="no devices"):
        assemble("example.com/fpga", [])
    with pytest.raises(VersionError, match=r"hostPath needs cdiVersion 0\.5\.0"):
        assemble("example.com/fpga", [entry], target_version="0.4.0")
    with pytest.raises(SpecError, match="at least 2 characters"):
        assemble("e/fpga", [entry])
