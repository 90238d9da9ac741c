"""Template filters that turn a path-valued udev value into a device name (issue 55):
``{field|basename}`` keeps a path's last element, ``{field|name}`` makes any text a valid
device name. The recorded loop devices (tests/data/udev/loop-backing.json, ``cdi-gen record``
on this machine's loop devices, their image folder renamed to /srv) have these backing files:

=========  =====================================
loop741    /srv/images/model-cache.img
loop791    /srv/backup/postgres-data.img
loop908    /srv/images/postgres-data.img
loop919    /srv/My Images/Disk 1 (copy).img
loop969    (none: no file attached)
loop973    /srv/images/gone.img (deleted)
=========  =====================================
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.config.loader import parse_config
from cdi_gen.config.templates import DEVICE_NAME_FIELDS, FILTERS, Field_, parse_template
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.discovery.render import FILTERS as RENDERED_FILTERS
from cdi_gen.discovery.render import RenderContext, TemplateError, render_template
from cdi_gen.errors import ConfigError, InvalidNameError
from cdi_gen.model import DeviceRecord
from cdi_gen.names import MAX_SEGMENT_LEN, as_device_name, validate_device_name
from cdi_gen.sources.records import load_recording

RECORDED = Path(__file__).resolve().parents[1] / "data" / "udev" / "loop-backing.json"
BY_BACKING_FILE = "{attribute[loop/backing_file]|basename}"


@pytest.fixture(scope="module")
def loop_records() -> tuple[DeviceRecord, ...]:
    return load_recording(RECORDED).records


def _discover(records: tuple[DeviceRecord, ...], device_name: str) -> Any:
    config = parse_config(
        {
            "vendor": "example.com",
            "classes": [
                {
                    "name": "image",
                    "match": {
                        "subsystem": "block",
                        "kernel": "loop*",
                        "attributes": {"loop/backing_file": "?*"},
                    },
                    "deviceName": device_name,
                    "containerEdits": {"env": ["IMAGE={attribute[loop/backing_file]|basename}"]},
                }
            ],
        },
        "test.yaml",
    )
    (change,) = Discovery(config).replace(list(records))
    return change


# --- |name: any text gives a valid device name or a refusal ------------------------------------


@given(st.text(max_size=200))
def test_name_filter_gives_a_valid_name_or_refuses(text: str) -> None:
    try:
        name = as_device_name(text)
    except InvalidNameError as exc:
        # Refused only when nothing of the grammar's letters and digits is left.
        assert not any(c.isascii() and c.isalnum() for c in text)
        assert "has no letter or digit" in str(exc)
        return
    validate_device_name(name)
    assert as_device_name(name) == name  # idempotent
    assert as_device_name(text) == name  # stable: the same text, the same name


@given(st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_.:-]{0,61}[A-Za-z0-9])?", fullmatch=True))
def test_name_filter_keeps_a_valid_name(name: str) -> None:
    assert as_device_name(name) == name


@given(st.text(alphabet="ab/ _", min_size=MAX_SEGMENT_LEN + 1, max_size=150))
def test_long_values_cut_with_a_hash_of_the_whole_value(text: str) -> None:
    try:
        name = as_device_name(text)
    except InvalidNameError:
        return
    validate_device_name(name)
    # Two values equal up to the cut still get two names.
    other = text + "a"
    if len(name) == MAX_SEGMENT_LEN:
        assert as_device_name(other) != name


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("/srv/My Images/Disk 1 (copy).img", "srv-My-Images-Disk-1-copy-.img"),
        ("Disk 1 (copy).img", "Disk-1-copy-.img"),
        ("gone.img (deleted)", "gone.img-deleted"),
        ("__x__", "x"),
        ("usb:1-2.3", "usb:1-2.3"),
        ("/dev/bus/usb/001/004", "dev-bus-usb-001-004"),
        ("é/ü/x", "x"),
    ],
)
def test_name_filter_examples(value: str, name: str) -> None:
    assert as_device_name(value) == name


def test_name_filter_cuts_to_the_grammar_length() -> None:
    value = "/srv/images/" + "a" * 100 + ".img"
    name = as_device_name(value)
    assert len(name) == MAX_SEGMENT_LEN
    assert name.startswith("srv-images-aaaa")
    assert name[-11] == "-" and name[-10:].isalnum()


# --- |basename ----------------------------------------------------------------------------------


def _render(template: str, value: str) -> str:
    record = DeviceRecord(
        sys_path="/sys/devices/virtual/block/loop1",
        subsystem="block",
        sys_name="loop1",
        attributes={"loop/backing_file": value},
    )
    return render_template(parse_template(template, DEVICE_NAME_FIELDS), RenderContext(record))


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("/srv/images/disk.img", "disk.img"),
        ("/srv/images/disk.img\n", "disk.img"),  # sysfs values end in a newline
        ("/srv/images/", "images"),
        ("disk.img", "disk.img"),
    ],
)
def test_basename_is_the_last_path_element(value: str, name: str) -> None:
    assert _render(BY_BACKING_FILE, value) == name


@pytest.mark.parametrize("value", ["/", "///"])
def test_basename_of_a_path_without_elements_refuses(value: str) -> None:
    with pytest.raises(TemplateError) as info:
        _render(BY_BACKING_FILE, value)
    assert str(info.value) == (
        f"{BY_BACKING_FILE}: |basename: value {value!r} has no last path element"
    )


def test_filters_apply_left_to_right() -> None:
    template = "{attribute[loop/backing_file]|basename|name}"
    assert _render(template, "/srv/My Images/Disk 1 (copy).img") == "Disk-1-copy-.img"
    with pytest.raises(TemplateError, match=r"\|name: invalid device name '\(\)'"):
        _render(template, "/srv/()")


def test_a_hostile_value_is_refused_before_any_filter() -> None:
    # The value checks hold for the value udev gives, so |name never launders a newline.
    with pytest.raises(TemplateError, match="control character"):
        _render("{attribute[loop/backing_file]|name}", "/srv/a\nB=1")


@given(st.text(max_size=60))
def test_rendered_name_with_name_filter_is_valid_or_refused(value: str) -> None:
    try:
        name = _render("{attribute[loop/backing_file]|basename|name}", value)
    except TemplateError as exc:
        assert exc.field.filters == ("basename", "name")
        return
    validate_device_name(name)


# --- parsing ------------------------------------------------------------------------------------


def test_every_filter_parsed_is_one_rendered() -> None:
    assert set(RENDERED_FILTERS) == FILTERS


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (BY_BACKING_FILE, Field_("attribute", "loop/backing_file", ("basename",))),
        ("{kernel|name}", Field_("kernel", None, ("name",))),
        ("{devname|basename|name}", Field_("devname", None, ("basename", "name"))),
    ],
)
def test_filters_parse_and_print_back(text: str, field: Field_) -> None:
    (parsed,) = parse_template(text, DEVICE_NAME_FIELDS).parts
    assert parsed == field
    assert str(parsed) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{kernel|upper}", "unknown filter '|upper' of {kernel}, known: |basename, |name"),
        ("{kernel|}", "unknown filter '|' of {kernel}, known: |basename, |name"),
        ("{kernel|name|Name}", "unknown filter '|Name' of {kernel}"),
        ("{kernal|x}", "unknown field {kernal}"),  # the field is named first
        ("{attribute[a]|base name}", "unknown filter '|base name' of {attribute}"),
        ("{kernel|name[x]}", "malformed field at position 0"),
        ("{kernel|name", "malformed field at position 0"),
    ],
)
def test_filter_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=r".*") as info:
        parse_template(text)
    assert message in str(info.value)
    assert repr(text) in str(info.value)


def test_an_unknown_filter_is_one_config_error_line_naming_the_field() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "vendor": "example.com",
                "classes": [
                    {"name": "image", "match": {"kernel": "loop*"}, "deviceName": "{kernel|base}"}
                ],
            },
            "config.yaml",
        )
    assert str(info.value) == (
        "config.yaml: classes[0].deviceName: template '{kernel|base}': unknown filter '|base' "
        "of {kernel}, known: |basename, |name"
    )


# --- rendering recorded loop devices ------------------------------------------------------------


def test_recorded_loop_devices_are_named_after_their_backing_file(
    loop_records: tuple[DeviceRecord, ...],
) -> None:
    change = _discover(loop_records, BY_BACKING_FILE)
    names = {d.name: d.physical.rsplit("/", 1)[-1] for d in change.devices}
    # loop791 (/srv/backup/postgres-data.img) holds the name its twin loop908 renders too.
    assert names == {"model-cache.img": "loop741", "postgres-data.img": "loop791"}
    (device,) = [d for d in change.devices if d.name == "model-cache.img"]
    assert device.edits["env"] == ["IMAGE=model-cache.img"]
    assert device.edits["deviceNodes"] == [{"path": "/dev/loop741"}]
    messages = sorted(f"{w.sys_path}: {w.message}" for w in change.warnings)
    assert messages == [
        "/sys/devices/virtual/block/loop908: device name 'postgres-data.img' is already used by "
        "/sys/devices/virtual/block/loop791; device skipped (make deviceName "
        "'{attribute[loop/backing_file]|basename}' unique, e.g. with {number} or "
        "{property[ID_SERIAL]})",
        "/sys/devices/virtual/block/loop919: deviceName "
        "'{attribute[loop/backing_file]|basename}' renders invalid device name "
        "'Disk 1 (copy).img': invalid character ' ', allowed: A-Z a-z 0-9 _.:-; device skipped",
        "/sys/devices/virtual/block/loop973: deviceName "
        "'{attribute[loop/backing_file]|basename}' renders invalid device name "
        "'gone.img (deleted)': invalid character ' ', allowed: A-Z a-z 0-9 _.:-; device skipped",
    ]


def test_recorded_loop_devices_with_the_name_filter(
    loop_records: tuple[DeviceRecord, ...],
) -> None:
    change = _discover(loop_records, "{attribute[loop/backing_file]|basename|name}")
    assert sorted(d.name for d in change.devices) == [
        "Disk-1-copy-.img",
        "gone.img-deleted",
        "model-cache.img",
        "postgres-data.img",
    ]
    # The collision is the one the name filter cannot remove: same basename, two folders.
    (warning,) = change.warnings
    assert warning.sys_path.endswith("/loop908")
    assert "already used by /sys/devices/virtual/block/loop791" in warning.message
    # The whole path as a name tells the twins apart.
    change = _discover(loop_records, "{attribute[loop/backing_file]|name}")
    assert "srv-backup-postgres-data.img" in {d.name for d in change.devices}
    assert "srv-images-postgres-data.img" in {d.name for d in change.devices}
    assert change.warnings == ()


def test_a_twin_that_arrives_later_never_takes_the_name(
    loop_records: tuple[DeviceRecord, ...],
) -> None:
    # The device advertised first keeps its name when one that sorts before it renders the
    # same: a pod's allocation never moves to another image.
    images = next(r for r in loop_records if r.sys_name == "loop908")
    backup = next(r for r in loop_records if r.sys_name == "loop791")
    config = parse_config(
        {
            "vendor": "example.com",
            "classes": [
                {"name": "image", "match": {"kernel": "loop*"}, "deviceName": BY_BACKING_FILE}
            ],
        },
        "test.yaml",
    )
    discovery = Discovery(config)
    (first,) = discovery.replace([images])
    assert [(d.name, d.physical) for d in first.devices] == [("postgres-data.img", images.sys_path)]
    (second,) = discovery.apply([dataclasses.replace(backup, action="add")])
    assert [d.physical for d in second.devices] == [images.sys_path]
    (warning,) = second.warnings
    assert warning.sys_path == backup.sys_path
    assert f"'postgres-data.img' is already used by {images.sys_path}" in warning.message
    # The skipped twin gets the name when the holder leaves.
    (third,) = discovery.apply([dataclasses.replace(images, action="remove")])
    assert [(d.name, d.physical) for d in third.devices] == [("postgres-data.img", backup.sys_path)]
    assert third.warnings == ()
