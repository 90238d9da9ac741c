"""A claim's own CDI spec: the class's devices with the claim's configuration applied."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.cdi.codec import dump_document, load_spec
from cdi_gen.cdi.validation import check_document
from cdi_gen.config.claimconfig import API_VERSION, KIND, DeviceConfig, parse_device_config
from cdi_gen.discovery.claimspec import (
    MAX_PLAIN_TAG,
    claim_device_name,
    claim_spec,
    claim_tag,
    configured_edits,
)
from cdi_gen.errors import SpecError
from cdi_gen.names import validate_device_name

UID = "5d1c7c2e-9a43-4a57-8d1e-0c0a6f1f2b3c"


def config(**fields: Any) -> DeviceConfig:
    return parse_device_config({"apiVersion": API_VERSION, "kind": KIND, **fields})


def class_spec(**spec_level: Any) -> dict[str, Any]:
    """A class spec as the agent writes it: root-owned 0660 nodes, one env variable."""
    edits = {
        "deviceNodes": [
            {"path": "/dev/loop3", "uid": 0, "gid": 0, "fileMode": 0o660},
            {"path": "/dev/loop-control"},
        ],
        "env": ["LOOP=3", "MODE=class"],
    }
    doc = assemble(
        "example.com/loop",
        [build_entry("loop3", edits), build_entry("loop4", {"deviceNodes": [{"path": "/dev/x"}]})],
    )
    doc.update(spec_level)
    return doc


def test_every_device_node_gets_the_claims_owner_and_mode() -> None:
    spec = claim_spec(
        class_spec(),
        [
            (
                "loop3",
                claim_device_name(UID, 0),
                config(
                    deviceNodes={"uid": 1000, "gid": 1000, "fileMode": 0o600, "permissions": "rw"},
                    env={"MODE": "claim", "EXTRA": "1"},
                ),
            )
        ],
    )
    assert spec["kind"] == "example.com/loop"
    [device] = spec["devices"]
    assert device["name"] == f"claim-{UID}-0"
    wanted = {"uid": 1000, "gid": 1000, "fileMode": 0o600, "permissions": "rw"}
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/loop3", **wanted},
        {"path": "/dev/loop-control", **wanted},
    ]
    assert device["containerEdits"]["env"] == ["LOOP=3", "MODE=claim", "EXTRA=1"]
    assert not check_document(spec)
    load_spec(dump_document(spec))  # the strict models read it back


def test_fields_the_config_leaves_out_stay_the_classs() -> None:
    edits = class_spec()["devices"][0]["containerEdits"]
    out = configured_edits(edits, config(deviceNodes={"uid": 7}))
    assert out["deviceNodes"][0] == {"path": "/dev/loop3", "uid": 7, "gid": 0, "fileMode": 0o660}
    assert out["env"] == edits["env"]
    assert edits["deviceNodes"][0]["uid"] == 0  # the class's own edits are not changed


def test_spec_level_edits_and_version_come_from_the_class() -> None:
    base = class_spec(containerEdits={"env": ["ALL=1"]}, cdiVersion="0.5.0")
    spec = claim_spec(base, [("loop4", claim_device_name(UID, 1), config(env={"A": "b"}))])
    assert spec["containerEdits"] == {"env": ["ALL=1"]}
    assert spec["cdiVersion"] == "0.5.0"


def test_a_device_no_longer_in_the_class_spec_is_named() -> None:
    with pytest.raises(SpecError, match=r"devices\['loop9'\]: not in the class's spec"):
        claim_spec(class_spec(), [("loop9", claim_device_name(UID, 0), config())])


def test_a_name_the_class_spec_uses_is_refused() -> None:
    with pytest.raises(SpecError, match="is taken by the class's spec"):
        claim_spec(class_spec(), [("loop3", "loop4", config())])


@given(st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,126}[A-Za-z0-9])?", fullmatch=True))
def test_device_names_are_cdi_names_for_any_claim_uid(uid: str) -> None:
    for index in (0, 31):
        validate_device_name(claim_device_name(uid, index))
    assert claim_tag(uid) == uid or len(uid) > MAX_PLAIN_TAG
