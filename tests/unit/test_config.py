"""Agent config: the catalogue, error messages (exact), the template grammar, the schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen import names
from cdi_gen.config.deviceattributes import MAX_CLASS_ATTRIBUTES, MAX_DEVICE_ATTRIBUTES, OWN
from cdi_gen.config.loader import catalogue_text, config_json_schema, load_config, parse_config
from cdi_gen.config.models import DEFAULT_VENDOR
from cdi_gen.config.templates import (
    DEVICE_NAME_FIELDS,
    EDIT_FIELDS,
    KEYED_FIELDS,
    Field_,
    parse_template,
)
from cdi_gen.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _cfg(**cls: Any) -> dict[str, Any]:
    return {"vendor": "example.com", "classes": [{"name": "loop", **cls}]}


def test_catalogue_loads_with_valid_kinds_and_resources() -> None:
    config = load_config(None)
    assert config.vendor == DEFAULT_VENDOR
    wanted = {"kvm", "tun", "fuse", "serial", "loop", "fpga", "vhost-net", "vfio", "gpu"}
    assert wanted <= {c.name for c in config.classes}
    for c in config.classes:
        assert names.validate_cdi_kind_as_resource(config.vendor, c.name)
        assert c.sharing.replicas >= 1


def test_schema_file_in_sync_and_accepts_catalogue() -> None:
    on_disk = json.loads((ROOT / "schemas" / "config.schema.json").read_text())
    assert on_disk == config_json_schema(), "regenerate schemas/config.schema.json"
    jsonschema.validate(yaml.safe_load(catalogue_text()), on_disk)


def test_config_contract_example_from_issue(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        """
vendor: example.com
classes:
  - name: loop
    match:
      subsystem: block
      kernel: "loop2[0-9][0-9]"
      driver: "*"
      attributes: {ro: "0"}
      properties: {DEVTYPE: disk}
    deviceName: "{kernel}"
    containerEdits:
      env: ["DEMO_DEVICE_IDS={name}"]
      mounts: [{hostPath: /opt/x, containerPath: /opt/x, options: [ro, bind]}]
"""
    )
    config = load_config(path)
    cls = config.get_class("loop")
    assert cls.match[0].kernel == "loop2[0-9][0-9]"
    assert cls.match[0].attributes == {"ro": "0"}
    assert cls.wanted_attributes == frozenset({"ro"})
    assert cls.sharing.replicas == 1 and cls.sharing.policy == "spread"
    assert cls.container_edits.env[0].fields == (Field_("name"),)


def test_json_config(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_cfg(match={"subsystem": "block"})))
    assert load_config(path).classes[0].name == "loop"


BAD = [
    (
        "unknown-key",
        _cfg(match={"subsystem": "block", "kernal": "x"}),
        "config.yaml: classes[0].match: unknown key 'kernal', allowed: subsystem, kernel, "
        "devnode, driver, attributes, parentAttributes, properties",
    ),
    (
        "empty-glob",
        _cfg(match={"kernel": ""}),
        "config.yaml: classes[0].match.kernel: must not be empty (leave the key out to match "
        "anything)",
    ),
    (
        "rule-list-index",
        _cfg(match=[{"subsystem": "block"}, {"kernel": 3}]),
        "config.yaml: classes[0].match[1].kernel: input should be a valid string, got 3",
    ),
    (
        "empty-rule",
        _cfg(match={}),
        "config.yaml: classes[0].match: a rule needs at least one condition (subsystem, "
        "kernel, ...)",
    ),
    (
        "vendor-uppercase",
        {"vendor": "Example.com", "classes": [{"name": "loop", "match": {"subsystem": "b"}}]},
        "config.yaml: vendor: invalid extended resource name 'Example.com/cdi-gen': domain "
        "'Example.com' should be a lowercase DNS subdomain (a-z 0-9 - .)",
    ),
    (
        "class-one-char",
        {"vendor": "example.com", "classes": [{"name": "l", "match": {"subsystem": "b"}}]},
        "config.yaml: classes[0].name: invalid class 'l': must be at least 2 characters "
        "(1 crashes podman 4.3/containerd 1.7)",
    ),
    (
        "class-duplicate",
        {
            "vendor": "example.com",
            "classes": [
                {"name": "loop", "match": {"subsystem": "b"}},
                {"name": "loop", "match": {"subsystem": "c"}},
            ],
        },
        "config.yaml: classes[1].name: class 'loop' is already defined at classes[0]",
    ),
    (
        "template-field",
        _cfg(match={"subsystem": "block"}, deviceName="{kernal}"),
        "config.yaml: classes[0].deviceName: template '{kernal}': unknown field {kernal}, "
        "known: " + ", ".join(f"{{{f}}}" for f in sorted(DEVICE_NAME_FIELDS)),
    ),
    (
        "template-group-without-group",
        _cfg(match={"subsystem": "block"}, deviceName="{group}"),
        "config.yaml: classes[0].deviceName: template '{group}' uses {group} but the class "
        "has no group",
    ),
    (
        "replicas",
        _cfg(match={"subsystem": "block"}, sharing={"replicas": 0}),
        "config.yaml: classes[0].sharing.replicas: input should be greater than or equal to 1, "
        "got 0",
    ),
    (
        "policy",
        _cfg(match={"subsystem": "block"}, sharing={"policy": "fill"}),
        "config.yaml: classes[0].sharing.policy: input should be 'spread' or 'pack', got 'fill'",
    ),
    (
        "cdi-version",
        _cfg(match={"subsystem": "block"}, cdiVersion="0.9.0"),
        "config.yaml: classes[0].cdiVersion: unknown cdiVersion '0.9.0', known: 0.1.0, 0.2.0, "
        "0.3.0, 0.4.0, 0.5.0, 0.6.0, 0.7.0, 0.8.0, 1.0.0, 1.1.0 or 'runtime'",
    ),
    (
        "env-without-key",
        _cfg(match={"subsystem": "block"}, containerEdits={"env": ["{name}"]}),
        "config.yaml: classes[0].containerEdits.env: env entry '{name}' should be KEY=VALUE "
        "with a literal '=' after the key",
    ),
    (
        "mount-missing",
        _cfg(match={"subsystem": "block"}, containerEdits={"mounts": [{"hostPath": "/x"}]}),
        "config.yaml: classes[0].containerEdits.mounts[0].containerPath: required key is missing",
    ),
    (
        "permissions",
        _cfg(match={"subsystem": "block"}, node={"permissions": "rwx"}),
        "config.yaml: classes[0].node.permissions: permissions 'rwx' should be a non-empty "
        "subset of 'rwm'",
    ),
    (
        # Issue 37, trap 6: each device of a grouped class has several nodes; {devnode} in
        # its env took the first node's alone.
        "group-per-node-env",
        _cfg(
            match={"subsystem": "block"},
            group={"by": "parent"},
            containerEdits={"env": ["DEV={devnode}"]},
        ),
        "config.yaml: classes[0].containerEdits.env[0]: template 'DEV={devnode}' uses "
        "{devnode}, one node's value, but the class groups several nodes into one device and "
        "its containerEdits are rendered once per device (the first node's value alone); use "
        "{group}, or node.path for what differs per node",
    ),
    (
        "group-per-node-mount",
        _cfg(
            match={"subsystem": "block"},
            group={"by": "property", "property": "ID_PATH"},
            containerEdits={"mounts": [{"hostPath": "/sys/x", "containerPath": "/x/{kernel}"}]},
        ),
        "config.yaml: classes[0].containerEdits.mounts[0].containerPath: template "
        "'/x/{kernel}' uses {kernel}, one node's value, but the class groups several nodes "
        "into one device and its containerEdits are rendered once per device (the first "
        "node's value alone); use {group}, or node.path for what differs per node",
    ),
    (
        "group-property",
        _cfg(match={"subsystem": "block"}, group={"by": "property"}),
        "config.yaml: classes[0].group: by: property needs property: <NAME>",
    ),
    (
        "classes-type",
        {"classes": "x"},
        "config.yaml: classes: input should be a valid list, got 'x'",
    ),
    (
        # Issue 37, trap 1: 660 was rendered as 0o1224 (sticky, owner write-only).
        "file-mode-decimal",
        _cfg(match={"subsystem": "block"}, node={"fileMode": 660}),
        "config.yaml: classes[0].node.fileMode: 660 is 0o1224 read as a decimal number, more "
        "than the permission bits an integer mode may have (at most 0o777): did you mean 0o660 "
        '(432)? write "0o660", or 0660 in YAML',
    ),
    (
        "file-mode-special-bits-as-integer",
        _cfg(
            match={"subsystem": "block"},
            containerEdits={"deviceNodes": [{"path": "/dev/x", "fileMode": 1528}]},
        ),
        "config.yaml: classes[0].containerEdits.deviceNodes[0].fileMode: 1528 is 0o2770, more "
        "than the permission bits an integer mode may have (at most 0o777): write a mode with "
        'setuid, setgid or sticky bits as an octal string, "0o2770"',
    ),
    (
        "file-mode-not-octal",
        _cfg(match={"subsystem": "block"}, node={"fileMode": "0o668"}),
        "config.yaml: classes[0].node.fileMode: '0o668' is not an octal mode: want digits 0-7, "
        'optionally after 0o (e.g. "0o660")',
    ),
    (
        "file-mode-too-large",
        _cfg(match={"subsystem": "block"}, node={"fileMode": "0o17777"}),
        "config.yaml: classes[0].node.fileMode: '0o17777' is more than a file mode holds (at "
        "most 0o7777)",
    ),
]


@pytest.mark.parametrize(("data", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_config_errors_exact(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "config.yaml")
    assert str(info.value) == message
    assert info.value.exit_code == 2


def test_config_errors_one_line_each() -> None:
    data = _cfg(match={"subsystem": 1, "kernel": ""}, sharing={"replicas": 0})
    with pytest.raises(ConfigError) as info:
        parse_config(data, "config.yaml")
    lines = str(info.value).splitlines()
    assert len(lines) == 3
    assert all(line.startswith("config.yaml: classes[0].") for line in lines)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vendor: a\nvendor: b\n", "duplicate key 'vendor' (line 2)"),
        ("classes: [\n", "invalid YAML"),
        ("- 1\n", "should be a mapping with vendor and classes, got a list of 1 item"),
    ],
    ids=["duplicate-key", "syntax", "not-mapping"],
)
def test_config_file_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such file$"):
        load_config(tmp_path / "nope.yaml")


def test_with_vendor_validates() -> None:
    config = load_config(None)
    assert config.with_vendor("example.com").vendor == "example.com"
    with pytest.raises(ConfigError, match="--vendor: invalid extended resource name"):
        config.with_vendor("Upper.com")


# --- template grammar --------------------------------------------------------------------------

_literal = st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=8)
_plain = st.sampled_from(sorted(EDIT_FIELDS - KEYED_FIELDS))
_keyed = st.tuples(
    st.sampled_from(sorted(KEYED_FIELDS)), st.from_regex(r"[A-Za-z0-9_]{1,10}", fullmatch=True)
)
_field = st.one_of(_plain.map(Field_), _keyed.map(lambda kv: Field_(*kv)))


@given(st.lists(st.one_of(_literal, _field), max_size=6))
def test_template_round_trip(parts: list[str | Field_]) -> None:
    text = "".join(p.replace("{", "{{") if isinstance(p, str) else str(p) for p in parts)
    parsed = parse_template(text)
    assert parsed.source == text
    assert list(parsed.fields) == [p for p in parts if isinstance(p, Field_)]
    literal = "".join(p for p in parts if isinstance(p, str))
    assert "".join(p for p in parsed.parts if isinstance(p, str)) == literal


@given(st.text(max_size=30))
def test_template_any_text_parses_or_value_error(text: str) -> None:
    try:
        parse_template(text)
    except ValueError as exc:
        assert repr(text) in str(exc)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{property}", "{property} needs a key, e.g. {property[NAME]}"),
        ("{kernel[x]}", "{kernel} takes no key, got [x]"),
        ("a}b", "unmatched '}' at position 1"),
        ("{kernel", "malformed field at position 0"),
        ("{attribute[../x]}", "invalid sysfs attribute name '../x'"),
    ],
)
def test_template_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=r".*") as info:
        parse_template(text)
    assert message in str(info.value)
    assert repr(text) in str(info.value)


def _check_config(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str]:
    from cdi_gen.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(["check-config", str(path)])
    return int(info.value.code or 0), capsys.readouterr().err


def test_too_many_attributes_are_refused_naming_class_and_count(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Issue 26, item 11: 30 attributes passed check-config; with the built-in ones every device
    # carried 35, over the API server's 32, and every slice was refused.
    classes = [
        {"name": "loop", "match": {"subsystem": "block"}},
        {
            "name": "fpga",
            "match": {"subsystem": "fpga"},
            "attributes": {f"a{i}": "{kernel}" for i in range(30)},
        },
    ]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"vendor": "example.com", "classes": classes}))
    code, err = _check_config(capsys, path)
    assert code == 2
    assert err.strip() == (
        f"error: {path}: classes[1].attributes: class 'fpga' has 30 attributes, at most 22: "
        "a ResourceSlice device carries at most 32 and cdi-gen reserves 10 for its built-in ones"
    )
    classes[1]["attributes"] = {f"a{i}": "{kernel}" for i in range(MAX_CLASS_ATTRIBUTES)}
    path.write_text(yaml.safe_dump({"vendor": "example.com", "classes": classes}))
    assert _check_config(capsys, path)[0] == 0
    # The bound leaves room for every attribute the pool sets itself.
    # ``slot`` and ``part`` are never on one device (a composite class is never shared).
    assert MAX_CLASS_ATTRIBUTES + len(OWN) - 1 == MAX_DEVICE_ATTRIBUTES == 32


SHADOW = (
    "root:$6$Zx8Gq1Lm$Vq3kTg9w0SecretHashOfRootUser1234567890abcdefgh:19700:0:99999:7:::\n"
    "daemon:*:19700:0:99999:7:::\n"
    "alice:$y$j9T$salt$AnotherSecretHashValueXYZ0987654321:19700:0:99999:7:::\n"
)
SECRETS = ("Zx8Gq1Lm", "SecretHash", "AnotherSecret", "$6$", "$y$")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("shadow", SHADOW),  # one mapping key per line, as YAML reads it
        ("passwd", "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\n"),
        ("kv.yaml", "vendor: example.com\nclasses: []\n'root:$6$Zx8Gq1Lm$SecretHash': 1\n"),
        ("tag.yaml", "vendor: !<tag:root:$6$Zx8Gq1Lm$SecretHash> x\n"),
        ("dup.json", '{"root:$6$Zx8Gq1Lm$SecretHash": 1, "root:$6$Zx8Gq1Lm$SecretHash": 2}'),
        ("dup.yaml", "root:$6$Zx8Gq1Lm$SecretHash: 1\nroot:$6$Zx8Gq1Lm$SecretHash: 2\n"),
        ("bad.yaml", "vendor: [root:$6$Zx8Gq1Lm$SecretHash\n"),
        ("list.json", '["root:$6$Zx8Gq1Lm$SecretHash"]'),
        ("text.yaml", "root:$6$Zx8Gq1Lm$SecretHash\n"),
    ],
)
def test_errors_about_a_file_quote_no_secret_of_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, text: str
) -> None:
    # Issue 26, item 15: --config at a shadow-like file printed "unknown key 'root:$6$...'".
    # What a message quotes of a file is a short, redacted fragment: name characters only.
    # (A file with a config's own top-level keys is the user's config: its values are quoted
    # as every config value is.)
    path = tmp_path / name
    path.write_text(text)
    code, err = _check_config(capsys, path)
    assert code == 2
    assert err.startswith(f"error: {path}: ")
    assert not any(s in err for s in SECRETS), err
    assert all(len(line) < 300 for line in err.splitlines())


def test_a_mistyped_key_of_a_real_config_is_still_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("vendor: example.com\nclasses: []\nresyncSecond: 30\n")
    code, err = _check_config(capsys, path)
    assert code == 2 and "unknown key 'resyncSecond', allowed: vendor, classes" in err
    path.write_text("password: hunter2\ntoken: abc\n")
    code, err = _check_config(capsys, path)
    assert code == 2 and "hunter2" not in err and "token" not in err
    assert "not a cdi-gen config: none of its 2 top-level keys" in err


# --- file modes (issue 37, trap 1) ---------------------------------------------------------------

VM_RECORDS = str(ROOT / "tests" / "data" / "udev" / "export-db-vm.txt")


@pytest.mark.parametrize(
    ("written", "mode"),
    [
        ("0660", 0o660),  # YAML 1.1's own octal literal
        ("0o660", 0o660),  # the schema's example; a string to a YAML 1.1 loader
        ('"0660"', 0o660),  # was decimal 660 = 0o1224
        ('"660"', 0o660),  # a string is octal, as chmod reads it
        ("432", 0o660),  # JSON's way: the integer itself
        ('"0o2660"', 0o2660),  # setgid: only as a string
    ],
)
def test_the_rendered_spec_carries_the_mode_the_config_means(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, written: str, mode: int
) -> None:
    from cdi_gen.cli.main import main

    path = tmp_path / "config.yaml"
    path.write_text(
        "classes:\n  - name: tun\n    match: {kernel: tun}\n"
        f"    node: {{fileMode: {written}}}\n"
        f"    containerEdits: {{deviceNodes: [{{path: /dev/null, fileMode: {written}}}]}}\n"
    )
    with pytest.raises(SystemExit) as info:
        main(["render", "--records", VM_RECORDS, "--config", str(path), "--class", "tun"])
    out, err = capsys.readouterr()
    assert (info.value.code or 0, err) == (0, "")
    [device] = json.loads(out)["devices"]
    nodes = device["containerEdits"]["deviceNodes"]
    assert [(n["path"], n["fileMode"]) for n in nodes] == [
        ("/dev/net/tun", mode),
        ("/dev/null", mode),
    ]


def test_a_decimal_file_mode_exits_2_naming_the_field_and_the_octal_value(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "classes:\n  - name: tun\n    match: {kernel: tun}\n    node: {fileMode: 660}\n"
    )
    code, err = _check_config(capsys, path)
    assert code == 2
    assert err == (
        f"error: {path}: classes[0].node.fileMode: 660 is 0o1224 read as a decimal number, more "
        "than the permission bits an integer mode may have (at most 0o777): did you mean 0o660 "
        '(432)? write "0o660", or 0660 in YAML\n'
    )


@pytest.mark.parametrize(
    ("mode", "valid"),
    [
        ("0o660", True),
        ("0660", True),
        ("0o7777", True),
        (432, True),
        (660, False),
        ("0o668", False),
    ],
)
def test_the_config_schema_says_the_same_mode_rule(mode: object, valid: bool) -> None:
    schema = json.loads((ROOT / "schemas" / "config.schema.json").read_text())
    node = {"path": "/dev/x", "fileMode": mode}
    doc = _cfg(
        match={"subsystem": "block"},
        node={"fileMode": mode},
        containerEdits={"deviceNodes": [node]},
    )
    if valid:
        jsonschema.validate(doc, schema)
        parse_config(doc)
    else:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema)
        with pytest.raises(ConfigError):
            parse_config(doc)


def test_when_back_defaults_to_keep_and_loads_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``whenBack`` is additive: a config without it is read as before (``keep``); each
    value loads with no line at load (the agent says at start what it applies, see
    tests/unit/test_when_back.py); any other value is refused naming the field."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_cfg(match={"subsystem": "block"})))
    with caplog.at_level("WARNING"):
        assert load_config(path).classes[0].when_back == "keep"
    for value in ("restart", "follow"):
        path.write_text(json.dumps(_cfg(match={"subsystem": "block"}, whenBack=value)))
        with caplog.at_level("WARNING"):
            assert load_config(path).classes[0].when_back == value
    assert caplog.records == []
    path.write_text(json.dumps(_cfg(match={"subsystem": "block"}, whenBack="move")))
    with pytest.raises(ConfigError, match="whenBack"):
        load_config(path)
