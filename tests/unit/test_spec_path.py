"""One spec path: ``run``, ``write``, ``render`` and ``slices`` leave out the same devices.

The agent left out a device needing more than its class's cdiVersion pin, while ``write``
and ``render`` failed the whole class on it: the CLI previewed something else than what the
agent wrote. Here the four run on one recorded device set (``ttyACM0`` needs cdiVersion 0.5.0
for its hostPath, the class is pinned to 0.4.0) and must agree; then
:func:`~cdi_gen.discovery.spec.class_spec` itself, the function they share.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import orjson
import pytest
import yaml

from cdi_gen.agent.agent import Agent
from cdi_gen.cdi.spec import ContainerEdits
from cdi_gen.cdi.validation import check_document
from cdi_gen.cli.main import main
from cdi_gen.config.loader import load_config, parse_config
from cdi_gen.config.settings import Settings
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.discovery.spec import Verdicts, class_spec, spec_devices
from cdi_gen.errors import SpecError
from cdi_gen.model import DiscoveredDevice
from cdi_gen.sources.records import load_recording
from tests.fakes.source import DATA, PipeSource

HW = str(DATA / "hardware.json")
SERIALS = {"ttyUSB0", "ttyUSB1", "ttyACM0"}
#: Every serial device seen in the container as /dev/ttyUSB<number>: ttyACM0 becomes
#: /dev/ttyUSB0, which needs a hostPath (cdiVersion 0.5.0); the class is pinned to 0.4.0.
PINNED = """\
vendor: example.com
classes:
  - name: serial
    match:
      - {subsystem: tty, kernel: "ttyUSB[0-9]*"}
      - {subsystem: tty, kernel: "ttyACM[0-9]*"}
    node: {path: "/dev/ttyUSB{number}"}
    cdiVersion: "0.4.0"
"""
FILE = "example.com-serial.json"
FIELD = "devices['ttyACM0'].containerEdits.deviceNodes[0].hostPath"
WARNING = (
    "warning: class 'serial': device 'ttyACM0' left out of the spec (version): "
    f"{FIELD}: device node hostPath needs cdiVersion 0.5.0 or newer, the target is 0.4.0"
)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err.splitlines()


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(PINNED)
    return path


async def _run_agent(config: Path, spec_dir: Path) -> tuple[bytes, list[str], float]:
    """The agent on the same records: its spec file, its list, its ``version`` failures."""
    source = PipeSource.from_data("hardware.json", only=SERIALS)
    settings = Settings(spec_dir=spec_dir, no_kubelet=True, metrics_address=None)
    agent = Agent(load_config(config), settings, source=source)
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.started.wait(), 5)
        data = (spec_dir / FILE).read_bytes()
        listed = list(agent.runners["serial"].board.devices)
        failures = agent.metrics.failures.labels("example.com/serial", "version")._value.get()
    finally:
        agent.stop()
        await asyncio.wait_for(task, 5)
        source.release()
    return data, listed, failures


def test_run_write_render_and_slices_leave_out_the_same_device(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path
) -> None:
    # render: the spec of the others on stdout, the device named on stderr, exit 1.
    code, rendered, err = _cli(
        capsys, "render", "--records", HW, "--config", str(config), "--class", "serial"
    )
    assert code == 1, err
    assert err == [
        WARNING,
        "error: 1 device left out (named in the warnings above); the spec holds the others",
    ]
    doc = orjson.loads(rendered)
    assert doc["cdiVersion"] == "0.4.0"
    assert [d["name"] for d in doc["devices"]] == ["ttyUSB0", "ttyUSB1"]
    assert check_document(doc) == []

    # write: the same bytes on disk, the same warning, exit 1.
    spec_dir = tmp_path / "write"
    code, out, err = _cli(
        capsys, "write", "--records", HW, "--config", str(config), "--spec-dir", str(spec_dir)
    )
    assert code == 1, err
    assert err[0] == WARNING and len(err) == 2, err
    assert out == f"example.com/serial: 3 devices, 1 left out, {spec_dir}/{FILE} written\n"
    written = (spec_dir / FILE).read_bytes()
    assert written == rendered.encode()

    # run: the agent writes those bytes too, and lists only what is in them.
    data, listed, failures = asyncio.run(_run_agent(config, tmp_path / "run"))
    assert data == written
    assert listed == ["ttyUSB0", "ttyUSB1"]
    assert failures == 1

    # slices: the pool offers only the devices in the spec, as the agent publishes it.
    code, out, err = _cli(
        capsys, "slices", "--records", HW, "--config", str(config), "--node", "n1"
    )
    assert code == 1, err
    assert err[0] == WARNING
    (pool,) = yaml.safe_load_all(out)
    offered = [d["attributes"]["cdiName"]["string"] for d in pool["spec"]["devices"]]
    assert offered == ["example.com/serial=ttyUSB0", "example.com/serial=ttyUSB1"]


def test_write_removes_its_spec_when_every_device_is_left_out_as_the_agent_does(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path
) -> None:
    spec_dir = tmp_path / "cdi"
    argv = ["write", "--records", HW, "--config", str(config), "--spec-dir", str(spec_dir)]
    # Unpinned, and every device needs a hostPath (cdiVersion 0.5.0): /dev/s<number>.
    unpinned = PINNED.replace('    cdiVersion: "0.4.0"\n', "")
    config.write_text(unpinned.replace("/dev/ttyUSB{number}", "/dev/s{number}"))
    code, _, err = _cli(capsys, *argv)
    assert (code, err) == (0, [])
    assert (spec_dir / FILE).exists()
    code, out, err = _cli(capsys, *argv, "--cdi-version", "0.4.0")
    assert code == 1
    assert out == f"example.com/serial: every device left out, removed {spec_dir}/{FILE}\n"
    assert [e.split(":")[2] for e in err[:3]] == [
        " device 'ttyACM0' left out of the spec (version)",
        " device 'ttyUSB0' left out of the spec (version)",
        " device 'ttyUSB1' left out of the spec (version)",
    ]
    assert err[3] == (
        "error: 3 devices left out (named in the warnings above); the other devices are written"
    )
    assert not (spec_dir / FILE).exists()


def test_a_device_whose_slot_names_are_too_long_is_named_and_counted_as_the_agent_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A shared device's slot ``<name>-1`` over 63 characters: the agent skips the device
    with a warning; render said "0 devices left out" and named none."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "vendor: example.com\nclasses:\n  - name: tun\n    match: {kernel: tun}\n"
        f'    deviceName: "{"t" * 60}{{kernel}}"\n    sharing: {{replicas: 2}}\n'
    )
    vm = str(DATA / "export-db-vm.txt")
    code, out, err = _cli(
        capsys, "render", "--records", vm, "--config", str(config), "--class", "tun"
    )
    assert (code, out) == (1, "")
    assert (
        len(err) == 2 and "slot name " in err[0] and "-1 is not a valid CDI device name" in err[0]
    )
    assert err[1].startswith("error: 1 device left out (named in the warnings above)")

    async def agent_skips() -> tuple[float, list[str]]:
        source = PipeSource.from_data("export-db-vm.txt", only={"tun"})
        settings = Settings(spec_dir=tmp_path / "cdi", no_kubelet=True, metrics_address=None)
        agent = Agent(load_config(config), settings, source=source)
        task = asyncio.create_task(agent.run())
        try:
            await asyncio.wait_for(agent.started.wait(), 5)
            skipped = agent.metrics.failures.labels("example.com/tun", "device-skipped")
            return skipped._value.get(), list(agent.runners["tun"].board.devices)
        finally:
            agent.stop()
            await asyncio.wait_for(task, 5)
            source.release()

    assert asyncio.run(agent_skips()) == (1, [])
    assert not (tmp_path / "cdi" / "example.com-tun.json").exists()


# --- class_spec, the function the four share ---------------------------------------------------


def _serials(cdi_version: str | None = None) -> tuple[Discovery, list[DiscoveredDevice]]:
    """The three serial devices of the recording, in spec order (class pinned or not)."""
    text = PINNED if cdi_version is None else PINNED.replace('"0.4.0"', f'"{cdi_version}"')
    discovery = Discovery(parse_config(yaml.safe_load(text), "test.yaml"))
    discovery.replace(
        r for r in load_recording(DATA / "hardware.json").records if r.sys_name in SERIALS
    )
    return discovery, spec_devices(discovery.config_of("serial"), discovery.devices("serial"))


def _with_edits(device: DiscoveredDevice, **edits: object) -> DiscoveredDevice:
    return dataclasses.replace(device, edits=ContainerEdits.model_validate(edits).to_wire())


def test_an_invalid_device_is_left_out_with_every_rule_it_breaks() -> None:
    discovery, (acm, usb0, usb1) = _serials("0.5.0")
    config = discovery.config_of("serial")
    bad = _with_edits(usb0, env=["NOPE"], deviceNodes=[{"path": "dev/x"}])
    spec = class_spec("example.com", config, [acm, bad, usb1])
    assert spec.document is not None
    assert [d["name"] for d in spec.document["devices"]] == ["ttyACM0", "ttyUSB1"]
    (left,) = spec.left_out
    assert (left.device, left.physical, left.reason) == ("ttyUSB0", usb0.physical, "invalid-device")
    assert [p.path for p in left.problems] == [
        "devices['ttyUSB0'].containerEdits.env[0]",
        "devices['ttyUSB0'].containerEdits.deviceNodes[0].path",
    ]
    assert "'NOPE'" in str(left) and "\n" not in str(left)
    assert spec.fresh == spec.left_out


def test_the_pin_is_the_class_s_unless_given_and_the_minimum_without() -> None:
    discovery, devices = _serials("0.4.0")
    config = discovery.config_of("serial")
    pinned = class_spec("example.com", config, devices)
    assert [d.device for d in pinned.left_out] == ["ttyACM0"]
    over = class_spec("example.com", config, devices, cdi_version="0.5.0")
    assert over.left_out == () and over.document is not None
    assert over.document["cdiVersion"] == "0.5.0"
    unpinned = class_spec("example.com", config.model_copy(update={"cdi_version": None}), devices)
    assert unpinned.left_out == () and unpinned.document is not None
    assert unpinned.document["cdiVersion"] == "0.5.0"  # the minimum: the hostPath


def test_a_spec_field_the_pin_cannot_state_leaves_out_each_device_naming_it() -> None:
    """A dot in the class name needs 0.6.0: under a 0.5.0 pin no device can be in the spec,
    and each says why, rather than the class failing with no device named."""
    discovery, devices = _serials("0.5.0")
    config = discovery.config_of("serial")
    spec = class_spec("example.com", config.model_copy(update={"name": "serial.v2"}), devices)
    assert spec.document is None
    assert [(d.device, d.reason) for d in spec.left_out] == [
        ("ttyACM0", "version"),
        ("ttyUSB0", "version"),
        ("ttyUSB1", "version"),
    ]
    assert all(p.path == "kind" for d in spec.left_out for p in d.problems)


def test_a_device_whose_fields_exclude_each_other_is_left_out_even_unpinned() -> None:
    """intelRdt schemata (1.1.0) beside enableCMT (up to 1.0.0): no version states both."""
    discovery, (acm, usb0, usb1) = _serials()
    config = discovery.config_of("serial").model_copy(update={"cdi_version": None})
    both = _with_edits(acm, intelRdt={"schemata": ["L3:0=f"], "enableCMT": True})
    spec = class_spec("example.com", config, [both, usb0, usb1])
    assert [(d.device, d.reason) for d in spec.left_out] == [("ttyACM0", "version")]
    assert spec.document is not None and spec.document["cdiVersion"] == "0.3.0"


def test_the_cache_judges_a_device_once_per_edits_and_target() -> None:
    discovery, devices = _serials("0.4.0")
    config = discovery.config_of("serial")
    cache: Verdicts = {}
    first = class_spec("example.com", config, devices, cache=cache)
    assert [d.device for d in first.fresh] == ["ttyACM0"]
    assert set(cache) == {"ttyACM0", "ttyUSB0", "ttyUSB1"}
    # Unchanged devices: nothing judged again, the same entries reused, nothing fresh.
    again = class_spec("example.com", config, devices, cache=cache)
    assert again.fresh == () and again.left_out == first.left_out
    assert first.document is not None and again.document is not None
    assert list(map(id, again.document["devices"])) == list(map(id, first.document["devices"]))
    # New edits are judged again: ttyACM0 at its own path needs no hostPath and comes in.
    acm, usb0, usb1 = devices
    fixed = _with_edits(acm, deviceNodes=[{"path": "/dev/ttyACM0"}])
    mended = class_spec("example.com", config, [fixed, usb0, usb1], cache=cache)
    assert mended.left_out == () and mended.document is not None
    assert [d["name"] for d in mended.document["devices"]] == ["ttyACM0", "ttyUSB0", "ttyUSB1"]
    # So is a device under another target: its verdict under 0.4.0 does not hold for 0.5.0.
    cache.clear()
    assert [d.device for d in class_spec("example.com", config, devices, cache=cache).fresh] == [
        "ttyACM0"
    ]
    other = class_spec("example.com", config, devices, cdi_version="0.5.0", cache=cache)
    assert other.left_out == () and other.document is not None
    assert cache["ttyACM0"][1] == "0.5.0"


def test_devices_that_cannot_share_a_document_fail_the_class() -> None:
    discovery, (acm, usb0, _) = _serials("0.5.0")
    twin = dataclasses.replace(usb0, name="ttyACM0")
    with pytest.raises(SpecError, match="multiple device 'ttyACM0'"):
        class_spec("example.com", discovery.config_of("serial"), [acm, twin])


def test_no_device_no_document() -> None:
    discovery, _ = _serials()
    spec = class_spec("example.com", discovery.config_of("serial"), [])
    assert (spec.document, spec.left_out, spec.fresh) == (None, (), ())
