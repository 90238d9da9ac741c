"""Network interfaces as devices: net classes matched on recorded and hand-written udev data,
rendered with ``netDevices`` (cdiVersion 1.1.0), the interface-name grammar, and the runtime
releases and runc versions that apply the field (a spec the node would ignore is never
written; ``doctor`` names it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen import names
from cdi_gen.cdi import runtimes as rt
from cdi_gen.cdi.validation import check_document
from cdi_gen.cli.main import main
from cdi_gen.config.loader import parse_config
from cdi_gen.config.models import AgentConfig
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.discovery.match import match_record
from cdi_gen.dra.driver.netdata import hardware_address, network_data
from cdi_gen.errors import ConfigError, InvalidNameError, quote
from cdi_gen.model import DeviceRecord
from cdi_gen.sources.records import load_recording

DATA = Path(__file__).resolve().parents[1] / "data" / "udev"

USB_NIC = {
    "name": "usb-nic",
    "match": {"subsystem": "net", "driver": "r8152|cdc_ether"},
    "deviceName": "{property[ID_NET_NAME_MAC]}",
    "netDevice": {"name": "lan1"},
}
CAN = {
    "name": "can",
    "match": {"subsystem": "net", "properties": {"ID_VENDOR_ID": "1d50", "ID_MODEL_ID": "606f"}},
    "deviceName": "{property[ID_SERIAL_SHORT]|name}",
}
WWAN = {
    "name": "wwan",
    "match": [
        {"subsystem": "net", "properties": {"DEVTYPE": "wwan"}},
        {"subsystem": "usbmisc", "driver": "cdc_mbim"},
    ],
    "group": {"by": "parent", "subsystem": "usb"},
    "deviceName": "modem-{property[ID_SERIAL_SHORT]}",
    "netDevice": {"name": "wwan0"},
}
VETH = {
    "name": "veth",
    "match": {"subsystem": "net", "kernel": "cgt57h"},
    "deviceName": "{attribute[address]|name}",
    "netDevice": {"name": "{kernel}-in"},
}


def _config(*classes: dict[str, Any]) -> AgentConfig:
    return parse_config({"vendor": "example.com", "classes": list(classes)}, "test.yaml")


def _specs(recording: str, *classes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    discovery = Discovery(_config(*classes))
    discovery.replace(load_recording(DATA / recording).records)
    out = {}
    for c in classes:
        doc = discovery.class_spec(c["name"]).document
        assert doc is not None, discovery.warnings(c["name"])
        assert check_document(doc) == [], doc
        out[c["name"]] = doc
    return out


def test_hand_written_usb_nic_can_and_wwan_render_net_devices() -> None:
    specs = _specs("net-handwritten.json", USB_NIC, CAN, WWAN)
    assert specs["usb-nic"] == {
        "cdiVersion": "1.1.0",
        "kind": "example.com/usb-nic",
        "devices": [
            {
                "name": "enx00249b8d2f8a",
                "containerEdits": {"netDevices": [{"hostInterfaceName": "usb0", "name": "lan1"}]},
            },
            {
                "name": "enx00e04c680001",
                "containerEdits": {
                    "netDevices": [{"hostInterfaceName": "enx00e04c680001", "name": "lan1"}]
                },
            },
        ],
    }
    # The CAN rule picks the candleLight by its USB IDs, not the PEAK adapter; the default
    # name in the container is the host's.
    assert specs["can"]["devices"] == [
        {
            "name": "004C0034524657",
            "containerEdits": {"netDevices": [{"hostInterfaceName": "can0", "name": "can0"}]},
        }
    ]
    # The modem's interface and its control node are one device (grouped by the USB device).
    assert specs["wwan"]["devices"] == [
        {
            "name": "modem-0123456789",
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/cdc-wdm0"}],
                "netDevices": [{"hostInterfaceName": "wwan0", "name": "wwan0"}],
            },
        }
    ]
    assert specs["wwan"]["cdiVersion"] == "1.1.0"


def test_recorded_veth_renders_by_its_mac_address() -> None:
    spec = _specs("net-veth-macvlan.json", VETH)["veth"]
    assert spec["cdiVersion"] == "1.1.0"
    assert spec["devices"] == [
        {
            "name": "56:f3:68:38:c2:b4",
            "containerEdits": {
                "netDevices": [{"hostInterfaceName": "cgt57h", "name": "cgt57h-in"}]
            },
        }
    ]


def test_a_rendered_interface_name_the_kernel_refuses_leaves_the_device_out() -> None:
    # {name} renders the 17-byte MAC name: longer than IFNAMSIZ allows.
    cls = {**VETH, "netDevice": {"name": "{name}"}}
    discovery = Discovery(_config(cls))
    discovery.replace(load_recording(DATA / "net-veth-macvlan.json").records)
    assert discovery.class_spec("veth").document is None
    (warning,) = discovery.warnings("veth")
    assert "netDevices[0].name: invalid interface name" in str(warning)
    assert "longer than 15 bytes" in str(warning)


def test_only_rules_naming_the_net_subsystem_take_interfaces() -> None:
    records = load_recording(DATA / "net-handwritten.json").records
    can0 = next(r for r in records if r.sys_name == "can0")
    by_driver = _config({"name": "gsusb", "match": {"driver": "gs_usb"}}).classes[0]
    by_net = _config({"name": "gsusb", "match": {"subsystem": "net", "driver": "gs_usb"}})
    assert match_record(by_driver, can0) is None
    assert match_record(by_net.classes[0], can0) == 0
    # Any other record without a node still never matches, whatever the rule.
    usb = DeviceRecord(sys_path="/sys/devices/x/2-3", subsystem="usb", sys_name="2-3")
    assert (
        match_record(_config({"name": "usb", "match": {"subsystem": "usb"}}).classes[0], usb)
        is None
    )


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("eth 0", "must not hold ' '"),
        ("net/0", "must not hold '/'"),
        ("a-very-long-name0", "longer than 15 bytes"),
        ("..", "must not be '.' or '..'"),
        ("{kernel}:{number}", "must not hold ':'"),
        ("{kernel}-in-the-container", "longer than 15 bytes"),
    ],
)
def test_a_bad_container_name_template_is_one_config_line(template: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        _config({**CAN, "netDevice": {"name": template}})
    (line,) = str(info.value).splitlines()
    assert line.startswith("test.yaml: classes[0].netDevice.name: "), line
    assert quote(template) in line and why in line, line


def test_an_unknown_field_in_the_container_name_is_one_config_line() -> None:
    with pytest.raises(ConfigError) as info:
        _config({**CAN, "netDevice": {"name": "{nope}"}})
    (line,) = str(info.value).splitlines()
    assert line.startswith("test.yaml: classes[0].netDevice.name: "), line


_NAME_CHARS = st.characters(codec="utf-8", exclude_categories=("Cs",))


@given(st.text(_NAME_CHARS, max_size=20))
def test_interface_names_follow_the_kernel_grammar(name: str) -> None:
    # dev_valid_name(): non-empty, shorter than IFNAMSIZ (16 with the NUL), not . or ..,
    # no '/', ':' or whitespace; control characters refused beyond it (never a name).
    valid = (
        0 < len(name.encode()) <= 15
        and name not in (".", "..")
        and not any(c in "/:" or c.isspace() or ord(c) < 32 for c in name)
    )
    try:
        names.validate_interface_name(name)
    except InvalidNameError as exc:
        assert not valid
        assert str(exc).startswith("invalid interface name ")
    else:
        assert valid


# --- the runtimes that apply netDevices -------------------------------------------------------

LIBRARY = "needs cdiVersion 1.1.0 or newer"
RUNC = "runc applies OCI linux.netDevices from 1.4.0"
# (reference, why a spec with netDevices is not written for it; None: it is): the CDI
# library must read 1.1.0 (containerd 2.2.1, CRI-O 1.35) and the runc under it must be 1.4.0
# or newer.
NET_RUNTIMES = [
    ("containerd@1.7.30", LIBRARY),
    ("containerd@2.2.0", LIBRARY),
    ("containerd@2.2.1", None),  # runc unknown: not refused, doctor warns
    ("containerd@2.3.7,runc@1.3.3", RUNC),
    ("containerd@2.3.7,runc@1.4.0", None),
    ("containerd@2.3.7,runc@v1.5.0-rc.1", None),
    ("cri-o@1.34.2,runc@1.4.0", LIBRARY),
    ("cri-o@1.36.3,runc@1.4.0", None),
    ("cri-o@1.36.3,runc@1.2.6", RUNC),
    ("podman@5.5.0,runc@1.4.0", LIBRARY),
    ("podman@4.3.1", LIBRARY),
]


@pytest.mark.parametrize(("ref", "need"), NET_RUNTIMES)
def test_net_devices_per_runtime_release(ref: str, need: str | None) -> None:
    runtime = rt.parse_reference(ref)
    ceiling = rt.ceiling_of([runtime])
    assert ceiling is not None
    discovery = Discovery(_config(CAN))
    discovery.replace(load_recording(DATA / "net-handwritten.json").records)
    made = discovery.class_spec("can", ceiling=ceiling)
    assert (made.document is None) is (need is not None)
    if need is not None:
        (left,) = made.left_out
        (problem,) = left.problems
        assert problem.path == "devices['004C0034524657'].containerEdits.netDevices"
        assert f"{runtime.name} {runtime.version}" in problem.message
        assert need in problem.message, problem.message


def test_one_runtime_with_an_old_runc_refuses_for_the_node() -> None:
    ok = rt.parse_reference("containerd@2.3.7,runc@1.4.0")
    old = rt.parse_reference("cri-o@1.36.3,runc@1.3.0")
    ceiling = rt.ceiling_of([ok, old])
    assert ceiling is not None and ceiling.net_devices is not None
    assert ceiling.net_devices.startswith("cri-o 1.36.3 runs runc 1.3.0, which ignores")


@pytest.mark.parametrize(
    "bad", ["containerd@2.3.7,crun@1.20", "containerd@2.3.7,runc@", "containerd@2.3.7,runc@x"]
)
def test_a_bad_runc_reference_is_one_config_line(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        rt.parse_reference(bad)
    assert len(str(info.value).splitlines()) == 1


def test_containerd_on_path_brings_the_runc_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, text in (
        ("containerd", "containerd github.com/containerd/containerd/v2 v2.3.7 abc\n"),
        ("runc", "runc version 1.3.4\ncommit: v1.3.4\nspec: 1.2.1\n"),
    ):
        binary = tmp_path / name
        binary.write_text(f"#!/bin/sh\nprintf '{text}'\n")
        binary.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    runtime = rt.detect("containerd")
    assert runtime is not None and runtime.runc == "1.3.4"
    assert runtime.describe().startswith("containerd 2.3.7 (reads cdiVersion <= ")
    assert runtime.describe().endswith("; runs runc 1.3.4)")
    assert rt.net_devices_problem(runtime) is not None


def _cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out + err


@pytest.mark.parametrize(
    ("runc", "verdict"),
    [
        ("1.3.3", "FAIL netDevices: "),
        ("1.4.0", "OK   netDevices: containerd 2.3.7 with runc 1.4.0"),
        (None, "WARN netDevices: 1 spec file(s) move network interfaces"),
    ],
)
def test_doctor_names_a_spec_whose_interfaces_the_runc_would_ignore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], runc: str | None, verdict: str
) -> None:
    (tmp_path / "records.json").write_text("[]")
    spec_dir = tmp_path / "run"
    spec_dir.mkdir()
    spec = _specs("net-handwritten.json", CAN)["can"]
    (spec_dir / "example.com-can.json").write_text(json.dumps(spec))
    ref = "containerd@2.3.7" + (f",runc@{runc}" if runc else "")
    code, output = _cli(
        capsys, "doctor", "--spec-dir", spec_dir, "--runtime-spec-dir", spec_dir,
        "--runtime", ref, "--containerd-config", tmp_path / "none.toml",
        "--crio-config", tmp_path / "none.conf", "--device-plugin-dir", tmp_path,
        "--records", tmp_path / "records.json",
    )  # fmt: skip
    lines = [line for line in output.splitlines() if "netDevices:" in line]
    assert len(lines) == 1 and lines[0].startswith(verdict), output
    if runc == "1.3.3":
        assert str(spec_dir / "example.com-can.json") in lines[0]
        assert "runs runc 1.3.3, which ignores netDevices" in lines[0]
        assert code == 1


def test_a_pin_does_not_write_interfaces_a_runc_would_ignore() -> None:
    ceiling = rt.ceiling_of([rt.parse_reference("containerd@2.3.7,runc@1.3.3")])
    discovery = Discovery(_config({**CAN, "cdiVersion": "1.1.0"}))
    discovery.replace(load_recording(DATA / "net-handwritten.json").records)
    made = discovery.class_spec("can", ceiling=ceiling)
    assert made.document is None
    assert "runs runc 1.3.3, which ignores netDevices" in str(made.left_out[0].problems[0])
    # The same runtime with a runc that applies them: written, the verdict not reused.
    good = rt.ceiling_of([rt.parse_reference("containerd@2.3.7,runc@1.4.0")])
    assert discovery.class_spec("can", ceiling=good).document is not None


def test_network_data_of_the_recorded_usb_nic_can_and_wwan(tmp_path: Path) -> None:
    """A claim's ``networkData`` (KEP-4817) from each rendered device's spec entry: the
    interface's name in the pod and its hardware address as the host's sysfs shows it at
    prepare; a CAN interface has none (its ``address`` is empty)."""
    specs = _specs("net-handwritten.json", USB_NIC, CAN, WWAN)
    for name, address in (
        ("enx00e04c680001", "00:e0:4c:68:00:01"),
        ("can0", ""),
        ("wwan0", "6a:1b:2c:3d:4e:5f"),
        ("bad", "not a mac"),
    ):
        (tmp_path / "class" / "net" / name).mkdir(parents=True)
        (tmp_path / "class" / "net" / name / "address").write_text(f"{address}\n")
    edits = {d["name"]: d["containerEdits"] for doc in specs.values() for d in doc["devices"]}
    sysfs = str(tmp_path)
    assert network_data(edits["enx00e04c680001"], sysfs) == {
        "interfaceName": "lan1",
        "hardwareAddress": "00:e0:4c:68:00:01",
    }
    assert network_data(edits["004C0034524657"], sysfs) == {"interfaceName": "can0"}
    assert network_data(edits["modem-0123456789"], sysfs) == {
        "interfaceName": "wwan0",
        "hardwareAddress": "6a:1b:2c:3d:4e:5f",
    }
    # usb0 is not on this host (moved away already, or gone): its name only.
    assert network_data(edits["enx00249b8d2f8a"], sysfs) == {"interfaceName": "lan1"}
    assert network_data({"deviceNodes": [{"path": "/dev/x"}]}, sysfs) == {}
    assert hardware_address("bad", sysfs) is None
    assert hardware_address("../../etc", sysfs) is None  # not an interface name


def test_a_recorded_candlelight_can_adapter_is_matched_rendered_and_has_no_address(
    tmp_path: Path,
) -> None:
    """A real candleLight's udev record (net-can-recorded.json): the class written for the
    hand-written one takes it by its USB IDs, names it by its serial, and its claim status
    shows only the name: the kernel gives a CAN interface an empty ``address``."""
    spec = _specs("net-can-recorded.json", CAN)["can"]
    assert spec["devices"] == [
        {
            "name": "002A002D4730511420303650",
            "containerEdits": {"netDevices": [{"hostInterfaceName": "can0", "name": "can0"}]},
        }
    ]
    (record,) = load_recording(DATA / "net-can-recorded.json").records
    (tmp_path / "class" / "net" / "can0").mkdir(parents=True)
    (tmp_path / "class" / "net" / "can0" / "address").write_text(
        record.attributes["address"] + "\n"
    )
    edits = spec["devices"][0]["containerEdits"]
    assert network_data(edits, str(tmp_path)) == {"interfaceName": "can0"}
