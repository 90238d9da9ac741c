"""Recordings as ``--records`` reads them: which form, what each can answer, and the warning
a class gets when it reads what its recording lacks (issue 37, trap 5). The JSON recording's
round trip is in test_udev_records.py, beside the record's."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from cdi_gen.cli.main import main
from cdi_gen.sources.records import (
    EXPORT_DB,
    JSON_LIST,
    parse_recording,
    record_to_json,
    recording_to_json,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "udev"
VM = str(DATA / "export-db-vm.txt")
HW = str(DATA / "hardware.json")

#: A class of the VM's tun device that reads sysfs attributes four ways.
CONFIG = """\
classes:
  - name: tun
    match:
      - {subsystem: misc, kernel: tun, attributes: {dev: "10:*"}}
      - {subsystem: misc, kernel: tun, parentAttributes: {vendor: "0x*"}}
    health: {attributes: {uevent: "*"}}
    containerEdits: {env: ["TUN_NUMA={numa}"]}
  - name: kvm
    match: {subsystem: misc, kernel: kvm}
"""


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def _config(tmp_path: Path, text: str = CONFIG) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_each_form_says_what_it_can_answer() -> None:
    export_db = parse_recording(Path(VM).read_bytes())
    assert export_db.format == EXPORT_DB
    assert export_db.records and not export_db.numa
    assert not export_db.answers("size")
    assert not export_db.answers("vendor", parent=True)
    listed = parse_recording(Path(HW).read_bytes())
    assert listed.format == JSON_LIST
    assert listed.answers("size") and listed.answers("vendor", parent=True)
    recorded = parse_recording(recording_to_json(listed.records, ["size"], ["vendor"]))
    assert recorded.answers("size") and not recorded.answers("ro")
    assert recorded.answers("vendor", parent=True) and not recorded.answers("size", parent=True)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"records": []}, "an object whose format is 'cdi-gen records' (this one has no format)"),
        ({"format": "cdi-gen records", "version": 2, "records": []}, "version: should be 1"),
        ({"format": "cdi-gen records", "version": True, "records": []}, "version: should be 1"),
        ({"format": "cdi-gen records", "version": 1}, "records: should be a list of records"),
        (
            {"format": "cdi-gen records", "version": 1, "attributes": "size", "records": []},
            "attributes: should be a list of strings",
        ),
        (
            {"format": "cdi-gen records", "version": 1, "records": [{"subsystem": "block"}]},
            "records[0]: sys_path: missing",
        ),
    ],
)
def test_bad_recording_header(doc: object, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_recording(orjson.dumps(doc))
    assert message in str(info.value)


EXPORT_DB_WARNING = (
    "warning: class 'tun': match[0].attributes.dev, match[1].parentAttributes.vendor, "
    "health.attributes.uevent, {numa} in 'TUN_NUMA={numa}': udevadm info --export-db holds "
    "udev properties only, no sysfs attributes and no NUMA node, so a rule reading them "
    "matches nothing here, a health check fails and a template lacks them; record this "
    "machine with `cdi-gen record --config CONFIG -o FILE` (JSON with the sysfs attributes "
    "the config reads) and pass that FILE to --records"
)


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["discover"], 0),
        # Nothing matches tun in an export-db: render keeps its exit status for that.
        (["render", "--class", "tun"], 1),
        (["slices", "--node", "n"], 0),
    ],
)
def test_export_db_cannot_answer_attribute_rules(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], code: int
) -> None:
    got, _, err = _cli(capsys, *argv, "--config", _config(tmp_path), "--records", VM)
    assert got == code
    warnings = [line for line in err.splitlines() if "sysfs attributes" in line]
    # One line for the class that reads attributes, none for kvm.
    assert warnings == [EXPORT_DB_WARNING]


def test_write_warns_too(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    code, _, err = _cli(
        capsys,
        "write",
        "--config",
        _config(tmp_path),
        "--records",
        VM,
        "--spec-dir",
        str(spec_dir),
    )
    assert code == 0
    assert err.splitlines()[0] == EXPORT_DB_WARNING
    assert (spec_dir / "cdi-gen.io-kvm.json").is_file()


def test_json_recording_names_what_it_did_not_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    records = parse_recording(Path(VM).read_bytes()).records
    path = tmp_path / "recording.json"
    path.write_bytes(recording_to_json(records, ["dev", "uevent"], ["dev"]))
    code, _, err = _cli(capsys, "discover", "--config", _config(tmp_path), "--records", str(path))
    assert code == 0
    assert err.splitlines() == [
        "warning: class 'tun': match[1].parentAttributes.vendor: the recording read only "
        "these sysfs attributes: dev, uevent; of parents: dev, so a rule reading them matches "
        "nothing here, a health check fails and a template lacks them; record this machine "
        "with `cdi-gen record --config CONFIG -o FILE` (JSON with the sysfs attributes the "
        "config reads) and pass that FILE to --records"
    ]


def test_no_warning_when_the_recording_answers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The catalogue reads no sysfs attribute: an export-db answers it all.
    code, _, err = _cli(capsys, "discover", "--records", VM)
    assert (code, err) == (0, "")
    # A JSON list of records is taken as complete.
    listed = tmp_path / "listed.json"
    records = parse_recording(Path(VM).read_bytes()).records
    listed.write_bytes(orjson.dumps([record_to_json(r) for r in records]))
    code, _, err = _cli(capsys, "discover", "--config", _config(tmp_path), "--records", str(listed))
    assert (code, err) == (0, "")
