"""The DeviceConfig model of a claim's opaque configuration: parsing, refusals, merge, schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.cli.schema import dump_schema
from cdi_gen.dra.driver.claimconfig import (
    API_VERSION,
    KIND,
    DeviceConfig,
    DeviceConfigError,
    device_config_schema,
    merge,
    parse_device_config,
    selects,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "schemas" / "deviceconfig.schema.json").read_text())

_ids = st.integers(min_value=0, max_value=0xFFFFFFFE)
_env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
_env_values = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zl", "Zp", "Cf", "Co", "Cn")),
    max_size=40,
)
_nodes = st.fixed_dictionaries(
    {},
    optional={
        "uid": _ids,
        "gid": _ids,
        "fileMode": st.integers(min_value=0, max_value=0o777),
        "permissions": st.sampled_from(["r", "w", "m", "rw", "rwm", "wr", "mr", "rm"]),
    },
)
_docs = st.fixed_dictionaries(
    {"apiVersion": st.just(API_VERSION), "kind": st.just(KIND)},
    optional={
        "deviceNodes": _nodes,
        "env": st.dictionaries(_env_names, _env_values, max_size=5),
    },
)


def _doc(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, **fields}


def test_schema_file_in_sync() -> None:
    committed = (ROOT / "schemas" / "deviceconfig.schema.json").read_bytes()
    assert committed == dump_schema(device_config_schema()), (
        "regenerate with `cdi-gen schema deviceconfig > schemas/deviceconfig.schema.json`"
    )


def test_issue_contract_example_parses_from_yaml() -> None:
    # The issue's example as a user writes it: YAML's 0600 is an integer (384 in JSON).
    doc = yaml.safe_load(
        """
apiVersion: cdi-gen.io/v1alpha1
kind: DeviceConfig
deviceNodes: {uid: 1000, gid: 1000, fileMode: 0600, permissions: rw}
env: {NAME: value}
"""
    )
    config = parse_device_config(doc)
    assert config.device_nodes is not None
    assert (config.device_nodes.uid, config.device_nodes.gid) == (1000, 1000)
    assert config.device_nodes.file_mode == 0o600
    assert config.device_nodes.permissions == "rw"
    assert config.env == {"NAME": "value"}
    jsonschema.validate(doc, SCHEMA)


@given(_docs)
def test_round_trip(doc: dict[str, Any]) -> None:
    config = parse_device_config(doc)
    wire = config.model_dump(by_alias=True, exclude_none=True)
    assert wire == {k: v for k, v in doc.items() if v is not None}
    assert parse_device_config(wire) == config
    jsonschema.validate(doc, SCHEMA)


_KNOWN = {"apiVersion", "kind", "deviceNodes", "env", "uid", "gid", "fileMode", "permissions"}


@given(_docs, st.text(min_size=1, max_size=12).filter(lambda k: k not in _KNOWN), st.booleans())
def test_unknown_fields_refused_naming_the_field(doc: dict[str, Any], key: str, deep: bool) -> None:
    if deep:
        doc = {**doc, "deviceNodes": {**doc.get("deviceNodes", {}), key: 1}}
    else:
        doc = {**doc, key: 1}
    with pytest.raises(DeviceConfigError, match="unknown field") as caught:
        parse_device_config(doc)
    assert ("parameters.deviceNodes" in str(caught.value)) == deep
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ({"uid": -1}, "parameters.deviceNodes.uid: input should be greater than or equal to 0"),
        ({"uid": 0xFFFFFFFF}, "parameters.deviceNodes.uid: input should be less than or equal"),
        (
            {"gid": "1000"},
            "parameters.deviceNodes.gid: input should be a valid integer, got '1000'",
        ),
        ({"uid": True}, "parameters.deviceNodes.uid: input should be a valid integer"),
        (
            {"fileMode": 0o1000},
            "parameters.deviceNodes.fileMode: 512 is 0o1000 read as a decimal number, more than "
            "the permission bits an integer mode may have (at most 0o777)",
        ),
        (
            {"fileMode": 4095},
            "parameters.deviceNodes.fileMode: 4095 is 0o7777, more than the permission bits a "
            "mode may have here (at most 0o777)",
        ),
        (
            # Special bits are the class's, even in the octal string form.
            {"fileMode": "0o1777"},
            "parameters.deviceNodes.fileMode: '0o1777' is more than the permission bits a mode "
            "may have here (at most 0o777)",
        ),
        ({"fileMode": "rw-------"}, "parameters.deviceNodes.fileMode: 'rw-------' is not an octal"),
        (
            {"fileMode": 1.5},
            "parameters.deviceNodes.fileMode: 1.5 is not a mode: want an integer (at most 0o777) "
            'or an octal string (e.g. "0o660")',
        ),
        ({"fileMode": True}, "parameters.deviceNodes.fileMode: True is not a mode"),
        (
            {"permissions": "rwx"},
            "parameters.deviceNodes.permissions: permissions 'rwx': want a combination of r, w, m",
        ),
        (
            {"permissions": "rr"},
            "parameters.deviceNodes.permissions: permissions 'rr': want a combination of r, w, m",
        ),
        (
            {"permissions": ""},
            "parameters.deviceNodes.permissions: permissions '': want a combination of r, w, m",
        ),
    ],
)
def test_out_of_range_values_refused(nodes: dict[str, Any], message: str) -> None:
    with pytest.raises(DeviceConfigError) as caught:
        parse_device_config(_doc(deviceNodes=nodes))
    assert str(caught.value).startswith(message)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_doc(deviceNodes=nodes), SCHEMA)


def test_a_claim_mode_written_as_decimal_600_is_refused_suggesting_0o600() -> None:
    # JSON's 384 is 0o600; 600 is 0o1130 and was refused as "less than or equal to 511".
    with pytest.raises(DeviceConfigError) as caught:
        parse_device_config(_doc(deviceNodes={"fileMode": 600}))
    assert str(caught.value) == (
        "parameters.deviceNodes.fileMode: 600 is 0o1130 read as a decimal number, more than the "
        "permission bits an integer mode may have (at most 0o777): did you mean 0o600 (384)? "
        'write "0o600", or 0600 in YAML'
    )
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_doc(deviceNodes={"fileMode": 600}), SCHEMA)


@given(st.integers(min_value=0, max_value=0o777), st.sampled_from(["{:o}", "0{:o}", "{:#o}"]))
def test_a_claim_mode_as_an_octal_string_is_that_mode(mode: int, spelling: str) -> None:
    # The model is strict, but a string mode is octal by the one rule (config.filemodes): a
    # claim written in YAML as "0600" or 0o600 (a string to YAML 1.1) means 0o600.
    text = spelling.format(mode)
    written = parse_device_config(_doc(deviceNodes={"fileMode": text}))
    assert written == parse_device_config(_doc(deviceNodes={"fileMode": mode}))
    assert written.model_dump(by_alias=True)["deviceNodes"]["fileMode"] == mode
    jsonschema.validate(_doc(deviceNodes={"fileMode": text}), SCHEMA)


def test_a_claim_in_yaml_may_write_0o600() -> None:
    doc = yaml.safe_load(
        "apiVersion: cdi-gen.io/v1alpha1\nkind: DeviceConfig\ndeviceNodes: {fileMode: 0o600}\n"
    )
    config = parse_device_config(doc)
    assert config.device_nodes is not None and config.device_nodes.file_mode == 0o600


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"1A": "x"}, "parameters.env: name '1A': want a letter or _"),
        ({"A=B": "x"}, "parameters.env: name 'A=B'"),
        ({"A": "x\ny"}, "parameters.env: A: value 'x\\ny': control character"),
        ({"A": 1}, "parameters.env.A: input should be a valid string, got 1"),
        ({f"V{i}": "x" for i in range(65)}, "parameters.env: 65 variables; at most 64"),
    ],
)
def test_bad_environment_refused(env: dict[str, Any], message: str) -> None:
    with pytest.raises(DeviceConfigError) as caught:
        parse_device_config(_doc(env=env))
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"apiVersion": "cdi-gen.io/v1", "kind": KIND}, "parameters.apiVersion"),
        ({"apiVersion": API_VERSION, "kind": "GpuConfig"}, "parameters.kind"),
        ({"kind": KIND}, "parameters.apiVersion"),
    ],
)
def test_unknown_kind_or_version_refused(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(DeviceConfigError) as caught:
        parse_device_config(doc)
    assert str(caught.value).startswith(f"{field}: ")
    assert f"want apiVersion {API_VERSION}, kind {KIND}" in str(caught.value)


def test_parameters_not_an_object() -> None:
    with pytest.raises(DeviceConfigError, match=r"^parameters: want an object, got \['x'\]"):
        parse_device_config(["x"])


def test_merge_later_entries_win_field_by_field() -> None:
    cls = parse_device_config(
        _doc(deviceNodes={"uid": 0, "gid": 0, "fileMode": 0o660}, env={"A": "class", "B": "b"})
    )
    claim = parse_device_config(_doc(deviceNodes={"uid": 1000, "fileMode": 0o600}, env={"A": "c"}))
    merged = merge([cls, claim])
    assert merged is not None and merged.device_nodes is not None
    assert merged.device_nodes.model_dump() == {
        "uid": 1000,
        "gid": 0,
        "file_mode": 0o600,
        "permissions": None,
    }
    assert merged.env == {"A": "c", "B": "b"}
    assert merge([]) is None
    only_env = merge([parse_device_config(_doc(env={"X": "1"}))])
    assert only_env is not None and only_env.device_nodes is None


@given(st.lists(_docs, max_size=4))
def test_merge_is_the_last_value_of_each_field(docs: list[dict[str, Any]]) -> None:
    merged = merge(parse_device_config(d) for d in docs)
    if not docs:
        assert merged is None
        return
    assert isinstance(merged, DeviceConfig)
    for key in ("uid", "gid", "fileMode", "permissions"):
        values = [d["deviceNodes"][key] for d in docs if key in d.get("deviceNodes", {})]
        got = merged.model_dump(by_alias=True)["deviceNodes"]
        assert (got or {}).get(key) == (values[-1] if values else None)


def test_selects_requests_and_subrequests() -> None:
    assert selects([], "any")
    assert selects(["gpu"], "gpu")
    assert selects(["gpu"], "gpu/small")
    assert selects(["gpu/small"], "gpu/small")
    assert not selects(["gpu/large"], "gpu/small")
    assert not selects(["other"], "gpu")
