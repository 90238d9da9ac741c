"""Issue 37, traps 2, 4 and 6: what the node cannot take is said before a container meets it.

Trap 2: a spec the node's known runtimes cannot read (a field needing a newer cdiVersion) was
written with exit 0; now each such device is left out naming the runtime, the field and the
version, the command exits 1 and the agent's /readyz names the class. Trap 4: extra host
paths were never checked; now render/write warn, doctor fails (in a pod: under /dev and /sys
only, the others named unchecked) and the agent leaves the device out, unless the entry is
``optional``. Trap 6: per-node fields in a grouped class's
edits are refused at load.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import orjson
import pytest

from cdi_gen.agent.agent import Agent
from cdi_gen.cdi.runtimes import Ceiling, ceiling_of, from_table
from cdi_gen.cli.main import main
from cdi_gen.config.loader import load_config
from cdi_gen.config.settings import Settings
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.discovery.spec import AGENT_FOLDERS, Verdicts, class_spec, missing_host_paths, within
from cdi_gen.doctor.devices import check_host_paths
from cdi_gen.sources.records import load_recording

DATA = Path(__file__).resolve().parents[1] / "data" / "udev"
VM = str(DATA / "export-db-vm.txt")
PODMAN_43 = from_table("podman", "4.3.1")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def _config(tmp_path: Path, edits: str, extra: str = "") -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        "vendor: example.com\nclasses:\n  - name: tun\n    match: {kernel: tun}\n"
        f"    containerEdits: {edits}\n{extra}"
    )
    return path


def _discovery(config: Path) -> Discovery:
    discovery = Discovery(load_config(config))
    discovery.replace(load_recording(Path(VM)).records)
    return discovery


# --- trap 2: a spec the node's runtime cannot read -----------------------------------------

GIDS_LEFT_OUT = (
    "warning: class 'tun': device 'tun' left out of the spec (version): "
    "devices['tun'].containerEdits.additionalGids: additionalGids needs cdiVersion 0.7.0 or "
    "newer, and podman 4.3.1 on this node reads at most 0.5.0 (CDI library 0.5.2, release "
    "table): it would refuse the class's whole spec\n"
)


def test_render_names_the_runtime_that_cannot_read_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = _config(tmp_path, "{additionalGids: [5]}")
    argv = ("render", "--records", VM, "--config", str(config), "--class", "tun")
    code, out, err = _cli(capsys, *argv, "--runtime", "podman@4.3.1")
    assert (code, out) == (1, "")
    assert err == GIDS_LEFT_OUT + (
        "error: 1 device left out (named in the warnings above); no device of example.com/tun "
        "is left to render\n"
    )
    # A runtime that reads 0.7.0 gets it at the minimum version, as before.
    code, out, err = _cli(capsys, *argv, "--runtime", "containerd@2.3.7")
    assert (code, err) == (0, "")
    assert orjson.loads(out)["cdiVersion"] == "0.7.0"


def test_write_leaves_out_what_the_runtime_cannot_read_and_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = _config(tmp_path, "{additionalGids: [5]}")
    spec_dir = tmp_path / "cdi"
    code, out, err = _cli(
        capsys,
        "write",
        "--records",
        VM,
        "--config",
        str(config),
        "--spec-dir",
        str(spec_dir),
        "--runtime",
        "podman@4.3.1",
    )
    assert code == 1
    assert err.startswith(GIDS_LEFT_OUT), err
    assert out == "example.com/tun: every device left out, no spec\n"
    assert not (spec_dir / "example.com-tun.json").exists()


def test_slices_offers_only_what_the_runtime_can_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preview takes the agent's runtime ceiling: a device the agent leaves out of the
    spec on an old podman is not offered as a slice either."""
    config = _config(tmp_path, "{additionalGids: [5]}")
    argv = ("slices", "--records", VM, "--config", str(config), "--node", "n1")
    code, out, err = _cli(capsys, *argv, "--runtime", "podman@4.3.1")
    assert code == 1
    assert err.startswith(GIDS_LEFT_OUT), err
    assert "cdiName" not in out
    code, out, err = _cli(capsys, *argv, "--runtime", "containerd@2.3.7")
    assert (code, err) == (0, "")
    assert "- name: tun-tun\n" in out
    # The agent's own environment says the same as the flag.
    monkeypatch.setenv("CDI_GEN_RUNTIME", "podman@4.3.1")
    code, out, err = _cli(capsys, *argv)
    assert code == 1 and err.startswith(GIDS_LEFT_OUT), err
    # A pin is the user's word over the ceiling, as for write.
    code, out, err = _cli(capsys, *argv, "--cdi-version", "0.7.0")
    assert (code, err) == (0, "")
    assert "- name: tun-tun\n" in out


def test_a_pin_is_the_users_word_over_the_ceiling(tmp_path: Path) -> None:
    discovery = _discovery(_config(tmp_path, "{additionalGids: [5]}"))
    cls, devices = discovery.config_of("tun"), discovery.devices("tun")
    ceiling = ceiling_of([PODMAN_43, from_table("containerd", "2.3.7")])
    assert ceiling is not None and ceiling.runtime is PODMAN_43
    spec = class_spec("example.com", cls, devices, ceiling=ceiling)
    assert spec.document is None and [d.node for d in spec.left_out] == ["runtime"]
    pinned = class_spec("example.com", cls, devices, ceiling=ceiling, cdi_version="0.7.0")
    assert pinned.document is not None and not pinned.left_out
    assert ceiling_of([from_table("containerd", "1.6.0")]) is None  # no CDI: doctor's


def _agent(
    config: Path, spec_dir: Path, ceiling: Ceiling | None = None, host: Path | None = None
) -> Agent:
    """An agent in host mode that has applied the recording; ``host`` stands for a folder
    the agent sees as the host's (as /dev and /sys)."""
    settings = Settings(spec_dir=spec_dir, no_kubelet=True, metrics_address=None)
    agent = Agent(load_config(config), settings, ceiling=ceiling)
    if host is not None:
        agent.runners["tun"].exists = within([str(host)], os.path.exists)
    (change,) = agent.discovery.replace(load_recording(Path(VM)).records)
    asyncio.run(agent.runners["tun"].apply(change, None))
    agent.started.set()
    return agent


def test_readyz_names_the_class_its_runtime_cannot_read(tmp_path: Path) -> None:
    config = _config(tmp_path, "{additionalGids: [5]}")
    agent = _agent(config, tmp_path / "cdi", ceiling=ceiling_of([PODMAN_43]))
    assert agent.ready() == (True, "ready; degraded: example.com/tun (1 device left out: runtime)")
    assert not (tmp_path / "cdi" / "example.com-tun.json").exists()
    failures = agent.metrics.failures.labels("example.com/tun", "version")._value.get()
    assert failures == 1
    # Discovered, not offered: the device gauge counts what the kubelet is offered.
    assert agent.metrics.devices.labels("example.com/tun", "Healthy")._value.get() == 0
    assert agent.metrics.physical_devices.labels("example.com/tun")._value.get() == 1


# --- trap 4: host paths never checked ------------------------------------------------------


def test_render_and_write_warn_of_a_missing_host_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, short_dir: Path
) -> None:
    # A short path: a longer one is quoted cut to 80 characters (under xdist, tmp_path is).
    missing = short_dir / "no-tools"
    config = _config(
        tmp_path,
        f"{{mounts: [{{hostPath: {missing}, containerPath: /opt/t, options: [ro, bind]}}]}}",
    )
    warning = (
        f"warning: class 'tun': device 'tun': containerEdits.mounts[0].hostPath: host path "
        f"'{missing}' does not exist: a container asking for the device would fail at "
        "creation (mark it optional: true if it appears later)\n"
    )
    code, out, err = _cli(
        capsys, "render", "--records", VM, "--config", str(config), "--class", "tun"
    )
    assert (code, err) == (0, warning)
    assert orjson.loads(out)["devices"][0]["containerEdits"]["mounts"][0]["hostPath"] == str(
        missing
    )
    code, _, err = _cli(
        capsys, "write", "--records", VM, "--config", str(config), "--spec-dir", str(tmp_path)
    )
    assert (code, err) == (0, warning)


def test_an_optional_host_path_is_not_checked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = _config(tmp_path, "{deviceNodes: [{path: /dev/no-such-node, optional: true}]}")
    code, out, err = _cli(
        capsys, "render", "--records", VM, "--config", str(config), "--class", "tun"
    )
    assert (code, err) == (0, "")
    # The key is the config's: CDI has none.
    assert orjson.loads(out)["devices"][0]["containerEdits"]["deviceNodes"][1] == {
        "path": "/dev/no-such-node"
    }


def test_doctor_fails_a_missing_host_path_naming_class_and_path(tmp_path: Path) -> None:
    config = _config(tmp_path, "{deviceNodes: [{path: /dev/vfio/vfio, hostPath: /dev/nope}]}")
    (check,) = check_host_paths(_discovery(config), exists=lambda p: p != "/dev/nope")
    assert (check.status, check.topic) == ("FAIL", "class tun")
    assert check.message == (
        "device 'tun': containerEdits.deviceNodes[0].hostPath: host path '/dev/nope' does not "
        "exist: a container asking for the device would fail at creation (mark it optional: "
        "true if it appears later)"
    )


def test_templated_host_paths_are_checked_per_device_and_only_bind_mounts(
    tmp_path: Path,
) -> None:
    config = _config(
        tmp_path,
        "{deviceNodes: [{path: '/dev/x-{kernel}'}], mounts: ["
        "{hostPath: tmpfs, containerPath: /t, type: tmpfs}, "
        "{hostPath: /sys/none, containerPath: /s, type: sysfs}]}",
    )
    discovery = _discovery(config)
    (device,) = discovery.devices("tun")
    seen: list[str] = []
    problems = missing_host_paths(
        discovery.config_of("tun"), device, lambda p: bool(seen.append(p))
    )
    assert seen == ["/dev/x-tun"]
    assert [p.path for p in problems] == ["containerEdits.deviceNodes[0].path"]


def test_the_agent_leaves_the_device_out_until_its_host_path_appears(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    config = _config(tmp_path, f"{{mounts: [{{hostPath: {tools}, containerPath: /opt/t}}]}}")
    spec_dir = tmp_path / "cdi"
    agent = _agent(config, spec_dir, host=tmp_path)
    runner = agent.runners["tun"]
    assert not (spec_dir / "example.com-tun.json").exists()
    assert agent.ready() == (
        True,
        "ready; degraded: example.com/tun (1 device left out: host path)",
    )
    asyncio.run(runner.sync())  # still missing: judged again, logged and counted once
    assert agent.metrics.failures.labels("example.com/tun", "invalid-device")._value.get() == 1
    tools.mkdir()
    asyncio.run(runner.sync())
    doc = orjson.loads((spec_dir / "example.com-tun.json").read_bytes())
    assert [d["name"] for d in doc["devices"]] == ["tun"]
    assert agent.ready() == (True, "ready")
    assert agent.metrics.devices.labels("example.com/tun", "Healthy")._value.get() == 1


def test_a_verdict_cache_keeps_entries_and_rechecks_missing_paths(tmp_path: Path) -> None:
    present: set[str] = set()
    config = _config(tmp_path, "{deviceNodes: [{path: /dev/later}]}")
    discovery = _discovery(config)
    cls = discovery.config_of("tun")
    devices = discovery.devices("tun")
    cache: Verdicts = {}
    first = class_spec("example.com", cls, devices, cache=cache, exists=present.__contains__)
    again = class_spec("example.com", cls, devices, cache=cache, exists=present.__contains__)
    assert (len(first.fresh), len(again.fresh), len(again.left_out)) == (1, 0, 1)
    present.add("/dev/later")
    later = class_spec("example.com", cls, devices, cache=cache, exists=present.__contains__)
    assert later.document is not None and not later.left_out


# --- trap 6: one node's value in a grouped device --------------------------------------------


def test_check_config_refuses_a_per_node_field_in_a_grouped_class(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = _config(
        tmp_path, "{env: ['DEV={devnode}']}", "    group: {by: property, property: ID_PATH}\n"
    )
    code, _, err = _cli(
        capsys, "render", "--records", VM, "--config", str(config), "--class", "tun"
    )
    assert code == 2
    assert err == (
        f"error: {config}: classes[0].containerEdits.env[0]: template 'DEV={{devnode}}' uses "
        "{devnode}, one node's value, but the class groups several nodes into one device and "
        "its containerEdits are rendered once per device (the first node's value alone); use "
        "{group}, or node.path for what differs per node\n"
    )


def _doctor(capsys: pytest.CaptureFixture[str], tmp_path: Path, config: Path) -> tuple[int, str]:
    """`cdi-gen doctor` on ``config`` with every node path of its own (none found)."""
    spec_dir = tmp_path / "run"
    spec_dir.mkdir()
    code, out, _ = _cli(
        capsys, "doctor", "--config", str(config), "--records", VM,
        "--spec-dir", str(spec_dir), "--runtime-spec-dir", str(spec_dir),
        "--runtime", "containerd@2.3.7", "--containerd-config", str(tmp_path / "none.toml"),
        "--crio-config", str(tmp_path / "none.conf"), "--device-plugin-dir", str(tmp_path),
    )  # fmt: skip
    return code, out


def test_doctor_cli_fails_a_missing_host_path(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # on the node itself
    missing = short_dir / "no-tools"
    config = _config(tmp_path, f"{{mounts: [{{hostPath: {missing}, containerPath: /opt/t}}]}}")
    code, out = _doctor(capsys, tmp_path, config)
    assert code == 1
    assert (
        f"FAIL class tun: device 'tun': containerEdits.mounts[0].hostPath: host path "
        f"'{missing}' does not exist: a container asking for the device would fail at creation"
    ) in out, out


def test_doctor_in_a_pod_checks_only_the_host_folders_the_pod_sees(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`kubectl exec ds/cdi-gen -- cdi-gen doctor` (what docs/operations.md says to run)
    sees the image beyond /dev and /sys: a host path there is not failed, but named as
    unchecked, and one under /dev is still judged."""
    missing = short_dir / "no-tools"
    config = _config(
        tmp_path,
        f"{{mounts: [{{hostPath: {missing}, containerPath: /opt/t}}], "
        "deviceNodes: [{path: /dev/no-such-node}]}",
    )
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    code, out = _doctor(capsys, tmp_path, config)
    assert code == 1
    assert f"'{missing}' does not exist" not in out, out
    assert (
        f"WARN class tun: host path '{missing}' not checked: this pod sees only /dev, /sys of "
        "the host -> run cdi-gen doctor on the node itself to check it\n"
    ) in out, out
    assert (
        "FAIL class tun: device 'tun': containerEdits.deviceNodes[0].path: host path "
        "'/dev/no-such-node' does not exist"
    ) in out, out


def test_doctor_names_each_unseen_path_once_per_class(tmp_path: Path) -> None:
    config = _config(tmp_path, "{mounts: [{hostPath: /opt/a, containerPath: /a}]}")
    discovery = _discovery(config)
    checks = check_host_paths(discovery, exists=lambda p: False, host_folders=("/dev",))
    assert [(c.status, c.message) for c in checks] == [
        ("WARN", "host path '/opt/a' not checked: this pod sees only /dev of the host")
    ]
    # On the node itself every path is judged.
    (check,) = check_host_paths(discovery, exists=lambda p: False)
    assert check.status == "FAIL"


def test_the_agent_checks_only_the_host_folders_it_sees(tmp_path: Path) -> None:
    """In a pod the agent sees its image, not the host, beyond the folders its DaemonSet
    mounts: a mount of /opt/tools there cannot be told missing, and is not left out."""
    config = _config(tmp_path, "{mounts: [{hostPath: /opt/cg-none, containerPath: /opt/t}]}")
    agent = _agent(config, tmp_path / "cdi")
    assert agent.ready() == (True, "ready")
    assert (tmp_path / "cdi" / "example.com-tun.json").exists()
    seen = within(AGENT_FOLDERS, lambda p: False)
    assert (seen("/opt/cg-none"), seen("/dev/cg-none"), seen("/sys/x"), seen("/devx")) == (
        True,
        False,
        False,
        True,
    )
