"""Parsing and semantic validation of CDI specs, agreement with the upstream schema, and
round trips of everything the writer can produce."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdi_gen.cdi import writer
from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.cdi.codec import dump_document, load_spec
from cdi_gen.cli.schema import cdi_spec_schema, dump_schema
from cdi_gen.errors import SpecError
from tests.conftest import REPO, examples, upstream_testdata, upstream_validator

GOOD = upstream_testdata("good")
BAD = upstream_testdata("bad")


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_upstream_good_files_are_accepted_by_us_and_the_schema(path: Path) -> None:
    load_spec(path.read_bytes())
    upstream_validator().validate(orjson.loads(path.read_bytes()))


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_upstream_bad_files_are_rejected_by_us_and_the_schema(path: Path) -> None:
    with pytest.raises(SpecError):
        load_spec(path.read_bytes())
    data = path.read_bytes()
    if data.strip():
        assert not upstream_validator().is_valid(orjson.loads(data))


def _doc(edits: dict[str, Any], **extra: Any) -> bytes:
    doc = {
        "cdiVersion": "0.3.0",
        "kind": "example.com/fpga",
        "devices": [{"name": "fpga0", "containerEdits": edits}],
        **extra,
    }
    return orjson.dumps(doc)


NODE = {"deviceNodes": [{"path": "/dev/x"}]}
CASES = [
    (
        "bad-env",
        _doc({"env": ["NOVALUE"]}),
        "devices[0].containerEdits.env[0]",
        "invalid environment variable 'NOVALUE'",
    ),
    ("empty-env-key", _doc({"env": ["=x"]}), "devices[0].containerEdits.env[0]", "KEY=VALUE"),
    (
        "relative-node",
        _doc({"deviceNodes": [{"path": "dev/x"}]}),
        "devices[0].containerEdits.deviceNodes[0].path",
        "absolute path",
    ),
    (
        "bad-type",
        _doc({"deviceNodes": [{"path": "/dev/x", "type": "x"}]}),
        "deviceNodes[0].type",
        "invalid device type 'x'",
    ),
    (
        "bad-perms",
        _doc({"deviceNodes": [{"path": "/dev/x", "permissions": "rwx"}]}),
        "deviceNodes[0].permissions",
        "invalid permissions 'rwx'",
    ),
    (
        "bad-hook",
        _doc({"hooks": [{"hookName": "preStart", "path": "/bin/h"}]}),
        "hooks[0].hookName",
        "invalid hook name 'preStart'",
    ),
    (
        "hook-timeout",
        _doc({"hooks": [{"hookName": "prestart", "path": "/h", "timeout": 0}]}),
        "hooks[0].timeout",
        "should be > 0",
    ),
    (
        "mount-no-host",
        _doc({"mounts": [{"hostPath": "", "containerPath": "/x"}]}),
        "mounts[0].hostPath",
        "must not be empty",
    ),
    ("empty-edits", _doc({}), "devices[0].containerEdits", "empty device edits"),
    (
        "unknown-field",
        _doc({"deviceNodes": [{"path": "/x", "major2": 1}]}),
        "deviceNodes[0].major2",
        "unknown field 'major2'",
    ),
    (
        "wrong-type",
        _doc({"deviceNodes": [{"path": "/x", "major": "8"}]}),
        "deviceNodes[0].major",
        "valid integer",
    ),
    (
        "version-too-low",
        _doc({"deviceNodes": [{"path": "/x", "hostPath": "/y"}]}),
        "cdiVersion",
        "must be at least v0.5.0",
    ),
    (
        "unknown-version",
        orjson.dumps(
            {
                "cdiVersion": "0.9.0",
                "kind": "example.com/fpga",
                "devices": [{"name": "d0", "containerEdits": NODE}],
            }
        ),
        "cdiVersion",
        "invalid version",
    ),
    (
        "no-devices",
        orjson.dumps({"cdiVersion": "0.3.0", "kind": "example.com/fpga", "devices": []}),
        "devices",
        "no devices",
    ),
    (
        "bad-kind",
        orjson.dumps(
            {
                "cdiVersion": "0.3.0",
                "kind": "example.com",
                "devices": [{"name": "d0", "containerEdits": NODE}],
            }
        ),
        "kind",
        "vendor/class",
    ),
    (
        "one-char-vendor",
        orjson.dumps(
            {
                "cdiVersion": "0.3.0",
                "kind": "x/fpga",
                "devices": [{"name": "d0", "containerEdits": NODE}],
            }
        ),
        "kind",
        "at least 2",
    ),
    (
        "duplicate-device",
        orjson.dumps(
            {
                "cdiVersion": "0.3.0",
                "kind": "example.com/fpga",
                "devices": [
                    {"name": "d0", "containerEdits": NODE},
                    {"name": "d0", "containerEdits": NODE},
                ],
            }
        ),
        "devices[1].name",
        "multiple device 'd0'",
    ),
    (
        "bad-device-name",
        orjson.dumps(
            {
                "cdiVersion": "0.3.0",
                "kind": "example.com/fpga",
                "devices": [{"name": "d0/", "containerEdits": NODE}],
            }
        ),
        "devices[0].name",
        "invalid character",
    ),
    (
        "bad-annotation",
        orjson.dumps(
            {
                "cdiVersion": "0.6.0",
                "kind": "example.com/fpga",
                "annotations": {"-x": "y"},
                "devices": [{"name": "d0", "containerEdits": NODE}],
            }
        ),
        "annotations",
        "invalid annotation key",
    ),
    (
        "dup-net",
        _doc(
            {
                "netDevices": [
                    {"hostInterfaceName": "a", "name": "n"},
                    {"hostInterfaceName": "a", "name": "m"},
                ]
            },
            cdiVersion="1.1.0",
        ),
        "netDevices[1].hostInterfaceName",
        "duplicate",
    ),
    (
        "bad-closid",
        _doc({"intelRdt": {"closID": ".."}}, cdiVersion="0.7.0"),
        "intelRdt.closID",
        "invalid closID",
    ),
]


@pytest.mark.parametrize(
    ("data", "path", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rule_violation_is_reported_with_path(data: bytes, path: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(data, source="spec.json")
    lines = str(info.value).splitlines()
    assert any(path in line and message in line for line in lines), lines
    assert all(line.startswith("spec.json: ") for line in lines)


def test_every_problem_is_reported_at_once() -> None:
    data = _doc({"env": ["A", "B"], "deviceNodes": [{"path": "x", "type": "q"}]})
    with pytest.raises(SpecError) as info:
        load_spec(data)
    assert len(info.value.problems) == 4


def test_yaml_round_trip() -> None:
    """`cdi-gen render --format yaml` reads back as the JSON it stands for."""
    yaml_bytes = dump_document(orjson.loads(_doc(NODE)), "yaml")
    assert yaml_bytes.startswith(b"---\n")
    assert load_spec(yaml_bytes, "yaml") == load_spec(_doc(NODE))


def test_committed_cdi_schema_is_in_sync() -> None:
    committed = (REPO / "schemas" / "cdi-spec.schema.json").read_bytes()
    assert committed == dump_schema(cdi_spec_schema()), "regenerate with `cdi-gen schema spec`"


# --- Property: whatever the writer produces is valid everywhere and round-trips. ---

_name = st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True)
# ".." components and control characters are refused by validation (see validation.py).
_path = st.from_regex(r"/[a-z0-9_]{1,8}(/[a-z0-9_.-]{1,8}){0,2}", fullmatch=True).filter(
    lambda p: ".." not in p.split("/")
)
_env = st.builds(
    lambda k, v: f"{k}={v}",
    st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True),
    st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=10),
)
_node = st.fixed_dictionaries(
    {"path": _path},
    optional={
        "hostPath": _path,
        "type": st.sampled_from(["b", "c"]),
        "major": st.integers(0, 511),
        "minor": st.integers(0, 2**20),
        "permissions": st.sampled_from(["r", "rw", "rwm"]),
        "fileMode": st.integers(0, 0o777),
        "uid": st.integers(0, 2**32 - 1),
        "gid": st.integers(0, 2**32 - 1),
    },
)
_mount = st.fixed_dictionaries(
    {"hostPath": _path, "containerPath": _path},
    optional={
        "options": st.lists(st.sampled_from(["ro", "bind", "rbind"]), max_size=2),
        "type": st.just("bind"),
    },
)
_edits = st.fixed_dictionaries(
    {"deviceNodes": st.lists(_node, min_size=1, max_size=3)},
    optional={"env": st.lists(_env, max_size=3), "mounts": st.lists(_mount, max_size=2)},
)


@settings(max_examples=examples(60), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.sampled_from(["example.com/fpga", "vendor.io/loop"]),
    st.dictionaries(_name, _edits, min_size=1, max_size=4),
)
def test_written_specs_validate_upstream_and_round_trip(
    tmp_path: Path, kind: str, devices: dict[str, dict[str, Any]]
) -> None:
    """What the agent writes (entries, assembled at their minimum cdiVersion, serialised,
    synced) passes the upstream schema, and what a reader loads back is that document."""
    doc = assemble(kind, [build_entry(n, e) for n, e in devices.items()])
    vendor, _, cls = kind.partition("/")
    assert writer.sync_spec(tmp_path, vendor, cls, dump_document(doc)) == "written"
    data = (tmp_path / f"{vendor}-{cls}.json").read_bytes()
    upstream_validator().validate(orjson.loads(data))
    assert load_spec(data).to_wire() == doc


def test_parsing_is_strict_about_duplicate_keys_but_takes_a_bom_like_runtimes() -> None:
    with pytest.raises(SpecError, match="duplicate key 'kind'"):
        load_spec(b'{"cdiVersion": "0.3.0", "kind": "a.com/bb", "kind": "a.com/cc", "devices": []}')
    with pytest.raises(SpecError, match="duplicate key 'kind'"):
        load_spec(b"kind: a.com/bb\nkind: a.com/cc\n", "yaml")
    with pytest.raises(SpecError, match="NaN is not valid JSON"):
        load_spec(b'{"cdiVersion": NaN}')
    load_spec(b"\xef\xbb\xbf" + _doc(NODE))  # the runtimes' YAML parser skips a BOM
