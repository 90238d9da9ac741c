"""discover, render, write and check-config through the real entry point, on recorded data."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from cdi_gen.cli.main import main

DATA = Path(__file__).resolve().parents[1] / "data" / "udev"
HW = str(DATA / "hardware.json")
VM = str(DATA / "export-db-vm.txt")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_discover_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "discover", "--records", HW, "--class", "fpga", "--json")
    assert (code, err) == (0, "")
    doc = orjson.loads(out)
    (region0, _) = doc["classes"]["fpga"]["devices"]
    assert region0["qualifiedName"] == "cdi-gen.io/fpga=region0"
    assert region0["numaNode"] == 0
    assert [(n["hostPath"], n["major"], n["minor"]) for n in region0["nodes"]] == [
        ("/dev/dfl-fme.0", 509, 0),
        ("/dev/dfl-port.0", 508, 0),
    ]
    assert region0["rules"][0] == 'SUBSYSTEM=="platform", KERNEL=="dfl-fme.*", DRIVERS=="dfl-fme"'


def test_discover_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "discover", "--records", VM, "--class", "tun", "--class", "vfio")
    assert code == 0
    assert out.splitlines() == [
        "cdi-gen.io/tun: 1 device",
        "  tun  /dev/net/tun(10:200)  numa=-  slots=110 (tun-0..tun-109)  "
        '[SUBSYSTEM=="misc", KERNEL=="tun"]',
        "cdi-gen.io/vfio: no device",
    ]


def test_render_yaml_with_vendor(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(
        capsys,
        "render",
        "--records",
        HW,
        "--class",
        "serial",
        "--vendor",
        "example.com",
        "--format",
        "yaml",
    )
    assert code == 0
    doc = yaml.safe_load(out)
    assert doc["kind"] == "example.com/serial"
    assert [d["name"] for d in doc["devices"]] == ["ttyACM0", "ttyUSB0", "ttyUSB1"]


def test_render_yaml_of_a_shared_class_has_no_anchors(capsys: pytest.CaptureFixture[str]) -> None:
    # tun is shared (sharing: {replicas: 110}): its slots share one edits object, which a
    # plain safe_dump writes as &id001 once and *id001 in every other slot.
    code, out, _ = _cli(capsys, "render", "--records", VM, "--class", "tun", "--format", "yaml")
    assert code == 0
    assert "&id" not in out
    assert "*id" not in out
    code, as_json, _ = _cli(capsys, "render", "--records", VM, "--class", "tun")
    assert code == 0
    doc = yaml.safe_load(out)
    assert doc == orjson.loads(as_json)
    assert len(doc["devices"]) == 110
    assert doc["devices"][109]["containerEdits"] == {"deviceNodes": [{"path": "/dev/net/tun"}]}


def test_render_without_device_one_line_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "render", "--records", VM, "--class", "serial")
    assert (code, out) == (1, "")
    assert err == (
        "error: class 'serial' (cdi-gen.io/serial) has no device: nothing matches "
        'SUBSYSTEM=="tty", KERNEL=="ttyUSB[0-9]*" | SUBSYSTEM=="tty", KERNEL=="ttyACM[0-9]*"\n'
    )


def test_render_cdi_version_too_old(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "classes:\n  - name: tun\n    match: {kernel: tun}\n    node: {path: /dev/tun}\n"
    )
    code, _, err = _cli(
        capsys, "render", "--records", VM, "--config", str(config), "--class", "tun"
    )
    assert code == 0, err
    code, _, err = _cli(
        capsys,
        "render",
        "--records",
        VM,
        "--config",
        str(config),
        "--class",
        "tun",
        "--cdi-version",
        "0.4.0",
    )
    assert code == 1
    assert "needs cdiVersion 0.5.0" in err


def test_write_removes_classes_without_devices(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec_dir = tmp_path / "cdi"
    code, out, _ = _cli(capsys, "write", "--records", HW, "--spec-dir", str(spec_dir))
    assert code == 0
    assert (spec_dir / "cdi-gen.io-fpga.json").exists()
    foreign = spec_dir / "vendor.com-gpu.json"
    foreign.write_text("{}")
    code, out, _ = _cli(capsys, "write", "--records", VM, "--spec-dir", str(spec_dir))
    assert code == 0
    assert f"cdi-gen.io/fpga: no device, removed {spec_dir}/cdi-gen.io-fpga.json" in out
    assert sorted(p.name for p in spec_dir.glob("*.json")) == [
        "cdi-gen.io-fuse.json",
        "cdi-gen.io-kvm.json",
        "cdi-gen.io-loop.json",
        "cdi-gen.io-tun.json",
        "vendor.com-gpu.json",
    ]
    code, out, _ = _cli(capsys, "write", "--records", VM, "--spec-dir", str(spec_dir))
    assert "cdi-gen.io/tun: 1 device (110 slots), " in out and out.count(" unchanged") == 4


def test_check_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("vendor: example.com\nclasses:\n  - name: tun\n    match: {kernel: tun}\n")
    code, out, _ = _cli(capsys, "check-config", str(good))
    assert (code, out) == (0, f"{good}: OK, vendor example.com, 1 class: tun\n")
    bad = tmp_path / "config.yaml"
    bad.write_text("classes:\n  - name: tun\n    match: {kernel: tun, subsytem: misc}\n")
    code, out, err = _cli(capsys, "check-config", str(bad))
    assert code == 2
    assert err == (
        f"error: {bad}: classes[0].match: unknown key 'subsytem', allowed: subsystem, kernel, "
        "devnode, driver, attributes, parentAttributes, properties\n"
    )


def test_discover_counts_what_matched_but_was_left_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Every tty device of the recording matches, and none has the property the name needs:
    # "no device" alone read as "nothing matched" (issue 37, trap 6).
    config = tmp_path / "c.yaml"
    config.write_text(
        "classes:\n  - name: serial\n    match: {subsystem: tty}\n"
        "    deviceName: '{property[NO_SUCH_PROPERTY]}'\n"
    )
    code, out, err = _cli(capsys, "discover", "--records", HW, "--config", str(config))
    assert code == 0
    assert out == "cdi-gen.io/serial: no device: 3 matched, 3 left out (why: the warnings below)\n"
    lines = err.splitlines()
    assert len(lines) == 3
    assert all(
        line.startswith("warning: class 'serial': device ")
        and "the device has no udev property NO_SUCH_PROPERTY" in line
        for line in lines
    )


def test_discover_no_device_when_nothing_matched(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "discover", "--records", VM, "--class", "serial")
    assert (code, out, err) == (0, "cdi-gen.io/serial: no device\n", "")
