"""``cdi-gen record`` on real loop devices: what it writes, ``--records`` reads, and
``discover --records`` finds there what ``discover`` finds on the machine (issue 37, trap 5).

Loop devices come from /dev/loop-control (numbers 300-999, see conftest); one gets a backing
file, so that its ``size`` attribute differs from the other's.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from loopdev import LoopDevices

from cdi_gen.cli.main import main

pytestmark = pytest.mark.kernel


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def _config(path: Path, kernels: str) -> Path:
    path.write_text(
        f"""\
classes:
  - name: sized
    match: {{subsystem: block, kernel: "{kernels}", attributes: {{size: "[1-9]*"}}}}
  - name: writable
    match: {{subsystem: block, kernel: "{kernels}"}}
    deviceName: "{{kernel}}-ro{{attribute[ro]}}"
    health: {{parentAttributes: {{ro: "0"}}}}
"""
    )
    return path


def test_record_then_discover_finds_what_discover_finds_live(
    capsys: pytest.CaptureFixture[str], loops: LoopDevices, tmp_path: Path
) -> None:
    backed, empty = loops.add(), loops.add()
    backing = tmp_path / "backing.img"
    backing.write_bytes(b"\0" * (1 << 20))
    loops.attach(backed, backing)
    config = str(_config(tmp_path / "config.yaml", f"{backed.name}|{empty.name}"))
    recording = tmp_path / "recording.json"

    code, out, _ = _cli(
        capsys, "record", "--config", config, "--subsystem", "block", "-o", str(recording)
    )
    assert (code, out) == (0, "")
    code, live, err = _cli(capsys, "discover", "--config", config, "--json")
    assert (code, err) == (0, "")
    code, replayed, err = _cli(
        capsys, "discover", "--config", config, "--json", "--records", str(recording)
    )
    assert (code, err) == (0, "")
    assert orjson.loads(replayed) == orjson.loads(live)
    # Not two empty answers: the attributes were read and matched.
    classes = orjson.loads(live)["classes"]
    assert [d["name"] for d in classes["sized"]["devices"]] == [backed.name]
    # The kernel decides whether a loop device without a backing file is read-only.
    ro = {d.name: Path(f"/sys/block/{d.name}/ro").read_text().strip() for d in (backed, empty)}
    assert sorted((d["name"], d["healthy"]) for d in classes["writable"]["devices"]) == sorted(
        (f"{name}-ro{value}", value == "0") for name, value in ro.items()
    )
    doc = orjson.loads(recording.read_bytes())
    assert (doc["format"], doc["version"]) == ("cdi-gen records", 1)
    assert (doc["attributes"], doc["parent_attributes"]) == (["ro", "size"], ["ro"])


def test_a_recording_without_the_attributes_says_so(
    capsys: pytest.CaptureFixture[str], loops: LoopDevices, tmp_path: Path
) -> None:
    dev = loops.add()
    config = str(_config(tmp_path / "config.yaml", dev.name))
    recording = tmp_path / "recording.json"
    # The catalogue reads no sysfs attribute, so none is recorded.
    code, _, _ = _cli(capsys, "record", "--subsystem", "block", "-o", str(recording))
    assert code == 0
    code, out, err = _cli(capsys, "discover", "--config", config, "--records", str(recording))
    assert code == 0
    assert "cdi-gen.io/sized: no device" in out.splitlines()
    # The writable device cannot be named without its attribute: it is left out too.
    assert "cdi-gen.io/writable: no device: 1 matched, 1 left out" in out
    warnings = [w for w in err.splitlines() if "sysfs attributes" in w]
    assert [w.split(":", 2)[:2] for w in warnings] == [
        ["warning", " class 'sized'"],
        ["warning", " class 'writable'"],
    ]
    assert warnings[0].startswith(
        "warning: class 'sized': match[0].attributes.size: the recording read only these "
        "sysfs attributes: none; of parents: none, "
    )
    assert (
        "health.parentAttributes.ro, {attribute[ro]} in '{kernel}-ro{attribute[ro]}'"
        in (warnings[1])
    )
    assert all("`cdi-gen record --config CONFIG -o FILE`" in w for w in warnings)
