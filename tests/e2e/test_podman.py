"""podman 4.3 (CDI library 0.5.2) injecting the devices of specs written by cdi-gen.

Covers injection of real loop devices, hotplug through to a container (``cdi-gen write`` and
the agent), cdiVersion compatibility (samples, ``--cdi-version 0.5.0``), and whether
``cdi-gen list`` predicts what podman resolves. The hand-written spec tests pin down the
harness itself (isolation, image, loop devices), so that a failure in the cdi-gen tests points
at cdi-gen rather than at the plumbing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

import pytest
import yaml
from consumers import (
    DYNAMIC_DIR,
    STATIC_DIR,
    GoCDI,
    Podman,
    SpecDirs,
    cdi_gen,
    loop_class_config,
)
from loopdev import LoopDevice, LoopDevices

from tests.ports import free_port
from tests.processes import terminate
from tests.waiting import until_sync

VENDOR = "example.com"
CLASS = "loop"
MARKER = b"cdi-gen e2e marker\n"


def _listing(folder: Path) -> list[tuple[str, float]]:
    if not folder.exists():
        return []
    return sorted((p.name, p.stat().st_mtime) for p in folder.iterdir())


def _backed_loop(loops: LoopDevices, tmp_path: Path) -> LoopDevice:
    """A loop device whose first bytes are MARKER, so reading it proves it works."""
    backing = tmp_path / "backing.img"
    backing.write_bytes(MARKER + bytes(4096 - len(MARKER)))
    dev = loops.add()
    loops.attach(dev, backing)
    return dev


def _read_marker_script(dev: LoopDevice) -> str:
    return f"dd if={dev.path} bs={len(MARKER)} count=1 2>/dev/null"


def test_harness_injects_hand_written_spec_and_keeps_host_folders_untouched(
    podman: Podman, spec_dirs: SpecDirs, loops: LoopDevices, tmp_path: Path
) -> None:
    host_before = (_listing(STATIC_DIR), _listing(DYNAMIC_DIR))
    dev = _backed_loop(loops, tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hello").write_text("from the host\n")
    spec = {
        "cdiVersion": "0.5.0",
        "kind": f"{VENDOR}/{CLASS}",
        "devices": [
            {
                "name": dev.name,
                "containerEdits": {
                    "deviceNodes": [{"path": str(dev.path)}],
                    "env": [f"HAND_WRITTEN={dev.name}"],
                },
            }
        ],
        "containerEdits": {
            "mounts": [
                {"hostPath": str(shared), "containerPath": "/opt/x", "options": ["ro", "bind"]}
            ]
        },
    }
    (spec_dirs.dynamic / f"{VENDOR}-{CLASS}.json").write_text(json.dumps(spec))
    major, minor = dev.rdev()

    script = (
        f"stat -c '%t:%T %F' {dev.path}; echo HAND_WRITTEN=$HAND_WRITTEN; cat /opt/x/hello; "
        + _read_marker_script(dev)
    )
    proc = podman.run_container(spec_dirs, script, devices=[f"{VENDOR}/{CLASS}={dev.name}"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{major:x}:{minor:x} block special file"
    assert lines[1] == f"HAND_WRITTEN={dev.name}"
    assert lines[2] == "from the host"
    assert lines[3] == MARKER.decode().strip()

    # The machine's own folders were neither read into the container nor written.
    assert (_listing(STATIC_DIR), _listing(DYNAMIC_DIR)) == host_before
    assert os.path.exists(dev.path)


def test_harness_unknown_name_is_refused(podman: Podman, spec_dirs: SpecDirs) -> None:
    proc = podman.run_container(spec_dirs, "true", devices=[f"{VENDOR}/{CLASS}=nothing"])
    assert proc.returncode != 0
    assert "unresolvable CDI devices" in proc.stderr


@pytest.mark.parametrize("folder", ["static", "dynamic"])
def test_harness_both_folders_are_read(podman: Podman, spec_dirs: SpecDirs, folder: str) -> None:
    """Each stand-in folder really is where podman looks (so isolation is not vacuous)."""
    spec = {
        "cdiVersion": "0.3.0",
        "kind": f"{VENDOR}/{CLASS}",
        "devices": [{"name": "envonly", "containerEdits": {"env": [f"FOLDER={folder}"]}}],
    }
    (getattr(spec_dirs, folder) / f"{VENDOR}-{CLASS}.json").write_text(json.dumps(spec))
    proc = podman.run_container(
        spec_dirs, "echo FOLDER=$FOLDER", devices=[f"{VENDOR}/{CLASS}=envonly"]
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"FOLDER={folder}"


# ---------------------------------------------------------------------------------------------
# Specs written by cdi-gen


def _write(config: Path, spec_dir: Path) -> Path:
    proc = cdi_gen("write", "--config", config, "--spec-dir", spec_dir)
    assert proc.returncode == 0, f"cdi-gen write failed:\n{proc.stdout}\n{proc.stderr}"
    return spec_dir / f"{VENDOR}-{CLASS}.json"


def _spec_device_names(spec_file: Path) -> set[str]:
    if not spec_file.exists():
        return set()
    return {d["name"] for d in json.loads(spec_file.read_text())["devices"]}


def test_written_spec_is_injected_by_podman_and_nothing_leaks(
    podman: Podman, go_cdi: GoCDI, spec_dirs: SpecDirs, loops: LoopDevices, tmp_path: Path
) -> None:
    used = _backed_loop(loops, tmp_path)
    other = loops.add()
    shared = tmp_path / "opt-x"
    shared.mkdir()
    (shared / "hello").write_text("mounted by the class\n")
    config = loop_class_config(
        tmp_path / "config.yaml",
        [used.name, other.name],
        mounts=[{"hostPath": str(shared), "containerPath": "/opt/x", "options": ["ro", "bind"]}],
    )
    spec_file = _write(config, spec_dirs.dynamic)
    assert _spec_device_names(spec_file) == {used.name, other.name}
    # The file is one podman's library takes as it is (version, fields, names).
    go = go_cdi.validate(spec_file)[str(spec_file)]
    assert go["ok"], go

    major, minor = used.rdev()
    script = (
        f"stat -c '%t:%T %F' {used.path}; echo DEMO_DEVICE_IDS=$DEMO_DEVICE_IDS; "
        f"cat /opt/x/hello; ls {other.path} 2>&1 >/dev/null | wc -l; " + _read_marker_script(used)
    )
    proc = podman.run_container(spec_dirs, script, devices=[f"{VENDOR}/{CLASS}={used.name}"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"{major:x}:{minor:x} block special file",
        f"DEMO_DEVICE_IDS={used.name}",
        "mounted by the class",
        "1",  # the other device's node is absent: ls printed one error line
        MARKER.decode().strip(),
    ]

    bare = podman.run_container(
        spec_dirs,
        f"ls {used.path} {other.path} /opt/x 2>/dev/null; echo env=$DEMO_DEVICE_IDS",
    )
    assert bare.returncode == 0, bare.stderr
    assert bare.stdout.splitlines() == ["env="]


def test_hotplug_through_to_the_container(
    podman: Podman, spec_dirs: SpecDirs, loops: LoopDevices, tmp_path: Path
) -> None:
    dev = loops.reserve()
    config = loop_class_config(tmp_path / "config.yaml", [dev.name])
    name = f"{VENDOR}/{CLASS}={dev.name}"
    spec_file = _write(config, spec_dirs.dynamic)
    assert dev.name not in _spec_device_names(spec_file)

    loops.add(dev)
    spec_file = _write(config, spec_dirs.dynamic)
    assert _spec_device_names(spec_file) == {dev.name}
    major, minor = dev.rdev()
    proc = podman.run_container(spec_dirs, f"stat -c '%t:%T' {dev.path}", devices=[name])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{major:x}:{minor:x}"

    loops.remove(dev)
    spec_file = _write(config, spec_dirs.dynamic)
    assert dev.name not in _spec_device_names(spec_file)
    gone = podman.run_container(spec_dirs, "true", devices=[name])
    assert gone.returncode != 0
    # Withdrawn from the spec, not left behind pointing at a missing node.
    assert "unresolvable CDI devices" in gone.stderr, gone.stderr
    assert "failed to stat" not in gone.stderr


# ---------------------------------------------------------------------------------------------
# Version compatibility with podman 4.3 (CDI library 0.5.2: cdiVersion <= 0.5.0)

SAMPLES = Path(__file__).resolve().parents[2] / "cdi-samples"


def _samples() -> list[Path]:
    return sorted(p for p in SAMPLES.glob("*") if p.suffix in (".json", ".yaml"))


def _version(path: Path) -> tuple[int, ...]:
    doc = yaml.safe_load(path.read_text())
    return tuple(int(x) for x in str(doc["cdiVersion"]).lstrip("v").split("."))


@pytest.mark.parametrize("sample", _samples(), ids=lambda p: p.name)
def test_podman_resolves_every_sample_that_fits_its_version(
    podman: Podman, spec_dirs: SpecDirs, sample: Path
) -> None:
    """A sample podman 4.3 can read must resolve; one needing a newer version must not.

    Resolution happens before the device nodes are looked at, so "unresolvable" means the
    file was refused; a missing host device (samples describe other machines) fails later with
    a different message, which is fine here.
    """
    doc = yaml.safe_load(sample.read_text())
    shutil.copy(sample, spec_dirs.dynamic / sample.name)
    name = f"{doc['kind']}={doc['devices'][0]['name']}"
    proc = podman.run_container(spec_dirs, "true", devices=[name])
    refused = "unresolvable CDI devices" in proc.stderr
    if _version(sample) <= (0, 5, 0):
        assert not refused, proc.stderr
    else:
        assert refused, f"podman 4.3 resolved a cdiVersion {doc['cdiVersion']} spec?"


def test_class_needing_a_newer_version_is_refused_before_writing(
    podman: Podman, go_cdi: GoCDI, spec_dirs: SpecDirs, loops: LoopDevices, tmp_path: Path
) -> None:
    """additionalGids needs cdiVersion 0.7.0: pinned to 0.5.0, cdi-gen says so and writes
    nothing; unpinned on this node, whose podman 4.3 reads at most 0.5.0, it says so too,
    naming podman, and leaves the device out; pinned to 0.7.0 (the user's word) it writes
    0.7.0, which podman 4.3 indeed cannot use."""
    dev = loops.add()
    config = loop_class_config(
        tmp_path / "config.yaml", [dev.name], extra_edits={"additionalGids": [44]}
    )
    out = tmp_path / "rendered.json"
    pinned = cdi_gen(
        "render", "--vendor", VENDOR, "--class", CLASS, "--config", config,
        "--cdi-version", "0.5.0", "--output", out,
    )  # fmt: skip
    assert pinned.returncode != 0
    assert "0.7.0" in pinned.stderr and "0.5.0" in pinned.stderr, pinned.stderr
    assert not out.exists()

    unpinned = cdi_gen(
        "render", "--vendor", VENDOR, "--class", CLASS, "--config", config, "--output", out
    )
    assert unpinned.returncode != 0
    assert "additionalGids" in unpinned.stderr and "podman 4.3" in unpinned.stderr, unpinned.stderr
    assert not out.exists() or dev.name not in out.read_text()

    pinned_new = cdi_gen(
        "render", "--vendor", VENDOR, "--class", CLASS, "--config", config,
        "--cdi-version", "0.7.0", "--output", out,
    )  # fmt: skip
    assert pinned_new.returncode == 0, pinned_new.stderr
    assert json.loads(out.read_text())["cdiVersion"] == "0.7.0"
    assert not go_cdi.validate(out)[str(out)]["ok"]
    shutil.copy(out, spec_dirs.dynamic / out.name)
    refused = podman.run_container(spec_dirs, "true", devices=[f"{VENDOR}/{CLASS}={dev.name}"])
    assert "unresolvable CDI devices" in refused.stderr, refused.stderr


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_rendered_spec_pinned_to_0_5_0_runs_in_podman(
    podman: Podman, spec_dirs: SpecDirs, loops: LoopDevices, tmp_path: Path, fmt: str
) -> None:
    dev = loops.add()
    config = loop_class_config(tmp_path / "config.yaml", [dev.name])
    out = spec_dirs.static / f"{VENDOR}-{CLASS}.{fmt}"
    proc = cdi_gen(
        "render", "--vendor", VENDOR, "--class", CLASS, "--config", config,
        "--cdi-version", "0.5.0", "--format", fmt, "--output", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(out.read_text())["cdiVersion"] == "0.5.0"
    ran = podman.run_container(
        spec_dirs, "echo $DEMO_DEVICE_IDS", devices=[f"{VENDOR}/{CLASS}={dev.name}"]
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == dev.name


# ---------------------------------------------------------------------------------------------
# The node agent: hotplug → spec → container, with no kubelet around


def _wait_for_names(spec_file: Path, want: set[str]) -> None:
    def names() -> set[str]:
        try:
            return _spec_device_names(spec_file)
        except (json.JSONDecodeError, KeyError):  # pragma: no cover - atomic writes expected
            pytest.fail(f"{spec_file} was read half-written", False)

    until_sync(lambda: names() == want, f"{spec_file} listing {sorted(want)}", 15, observe=names)


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""  # not listening yet


def _counter(metrics: str, name: str, **labels: str) -> float:
    """The sum of ``name`` over the series matching ``labels`` (0 when none)."""
    total = 0.0
    for line in metrics.splitlines():
        series, _, value = line.rpartition(" ")
        named = series == name or series.startswith(name + "{")
        if named and all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


def _monitor_counts(port: int) -> tuple[float, float, float]:
    """udev add and remove events taken from the netlink monitor, and full re-enumerations."""
    status, metrics = _get(port, "/metrics")
    assert status == 200, metrics[:200]
    return (
        _counter(metrics, "cdi_gen_udev_events_total", action="add"),
        _counter(metrics, "cdi_gen_udev_events_total", action="remove"),
        _counter(metrics, "cdi_gen_resyncs_total"),
    )


def test_agent_hotplug_through_to_the_container(
    podman: Podman, spec_dirs: SpecDirs, loops: LoopDevices, tmp_path: Path
) -> None:
    """A real hotplug: the device comes and goes through the agent's netlink monitor, shown by
    its udev event counters moving while no full re-enumeration happened (one would find the
    device too, and hide a monitor that hears nothing)."""
    dev = loops.reserve()
    config = loop_class_config(tmp_path / "config.yaml", [dev.name])
    spec_file = spec_dirs.dynamic / f"{VENDOR}-{CLASS}.json"
    name = f"{VENDOR}/{CLASS}={dev.name}"
    port = free_port()
    with (tmp_path / "agent.log").open("w+") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "cdi_gen", "run", "--config", str(config),
             "--spec-dir", str(spec_dirs.dynamic), "--no-kubelet",
             "--metrics-address", f"127.0.0.1:{port}", "--udev-source", "kernel"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            # Ready: the monitor listens and the first enumeration is applied, so a later add
            # reaches the agent only as an event.
            until_sync(
                lambda: agent.poll() is not None or _get(port, "/readyz")[0] == 200,
                "the agent ready",
                within=20,
            )
            assert agent.poll() is None, f"agent exited {agent.returncode}: {_read(log)}"
            adds, removes, resyncs = _monitor_counts(port)
            loops.add(dev)
            _wait_for_names(spec_file, {dev.name})
            after = _monitor_counts(port)
            assert after[0] > adds and after[2] == resyncs, (
                f"not seen by the monitor: (adds, removes, resyncs) {after}, "
                f"before {(adds, removes, resyncs)}"
            )
            major, minor = dev.rdev()
            ran = podman.run_container(spec_dirs, f"stat -c '%t:%T' {dev.path}", devices=[name])
            assert ran.returncode == 0, ran.stderr
            assert ran.stdout.strip() == f"{major:x}:{minor:x}"

            loops.remove(dev)
            _wait_for_names(spec_file, set())
            gone = _monitor_counts(port)
            assert gone[1] > removes and gone[2] == resyncs, (
                f"removal not seen by the monitor: (adds, removes, resyncs) {gone}, before {after}"
            )
            gone = podman.run_container(spec_dirs, "true", devices=[name])
            assert "unresolvable CDI devices" in gone.stderr, gone.stderr
            assert "failed to stat" not in gone.stderr
        finally:
            terminate(agent)
        assert agent.returncode == 0, _read(log)


def _read(log: IO[str]) -> str:
    log.seek(0)
    return log.read()


def test_null_device_node_in_any_file_crashes_podman_and_cdi_gen_says_why(
    podman: Podman, spec_dirs: SpecDirs
) -> None:
    """A foreign file with ``deviceNodes: [null]`` next to a good one makes podman 4.3 panic on
    every CDI request (the Go library dereferences the nil node), so cdi-gen must flag it."""
    bad = spec_dirs.dynamic / "other-vendor.json"
    shutil.copy(Path(__file__).parents[1] / "data" / "cdi-bad" / "devicenode-null-item.json", bad)
    (spec_dirs.dynamic / "good.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.3.0",
                "kind": "example.net/other",
                "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}],
            }
        )
    )
    crashed = podman.run_container(spec_dirs, "true", devices=["example.net/other=a"])
    assert crashed.returncode != 0
    assert "nil pointer dereference" in crashed.stderr, crashed.stderr

    proc = cdi_gen("validate", "-q", spec_dirs.dynamic)
    assert proc.returncode == 1
    assert f"{bad}: devices[0].containerEdits.deviceNodes[0]" in proc.stdout


def test_cdi_gen_list_predicts_what_podman_resolves(podman: Podman, spec_dirs: SpecDirs) -> None:
    """Shadowing (/var/run/cdi over /etc/cdi) and a same-folder conflict, checked against the
    runtime itself: every name `cdi-gen list` shows resolves to its winning file's edits, every
    conflicting name is refused."""

    def spec(tag: str, *names: str) -> str:
        devices = [{"name": n, "containerEdits": {"env": [f"FROM={tag}"]}} for n in names]
        return json.dumps({"cdiVersion": "0.3.0", "kind": f"{VENDOR}/{CLASS}", "devices": devices})

    (spec_dirs.static / "static.json").write_text(spec("static", "shadowed", "only-static"))
    (spec_dirs.dynamic / "dyn-a.json").write_text(spec("dyn-a", "shadowed", "clash"))
    (spec_dirs.dynamic / "dyn-b.json").write_text(spec("dyn-b", "clash", "only-b"))

    listed = cdi_gen(
        "list", "--json", "--spec-dir", spec_dirs.static, "--spec-dir", spec_dirs.dynamic
    )
    assert listed.returncode == 0, listed.stderr
    view = json.loads(listed.stdout)
    expected = {
        f"{VENDOR}/{CLASS}=shadowed": "dyn-a",
        f"{VENDOR}/{CLASS}=only-static": "static",
        f"{VENDOR}/{CLASS}=only-b": "dyn-b",
    }
    assert {n: Path(f).stem for n, f in view["devices"].items()} == expected
    assert set(view["conflicts"]) == {f"{VENDOR}/{CLASS}=clash"}

    for name, tag in expected.items():
        ran = podman.run_container(spec_dirs, "echo $FROM", devices=[name])
        assert (ran.returncode, ran.stdout.strip()) == (0, tag), ran.stderr
    refused = podman.run_container(spec_dirs, "true", devices=[f"{VENDOR}/{CLASS}=clash"])
    assert "unresolvable CDI devices" in refused.stderr, refused.stderr


def test_slots_of_one_shared_device_inject_together(
    podman: Podman, go_cdi: GoCDI, spec_dirs: SpecDirs, loops: LoopDevices, tmp_path: Path
) -> None:
    """sharing: {replicas: 3}: the names the plugin hands out for two slots of one device are
    both in the spec, and podman injects them into one container (one node, no conflict)."""
    dev = loops.add()
    config = loop_class_config(
        tmp_path / "config.yaml", [dev.name], extra={"sharing": {"replicas": 3}}
    )
    spec_file = _write(config, spec_dirs.dynamic)
    slots = [f"{dev.name}-{i}" for i in range(3)]
    assert _spec_device_names(spec_file) == set(slots)
    assert go_cdi.validate(spec_file)[str(spec_file)]["ok"]
    major, minor = dev.rdev()
    names = [f"{VENDOR}/{CLASS}={slots[0]}", f"{VENDOR}/{CLASS}={slots[2]}"]
    proc = podman.run_container(spec_dirs, f"stat -c '%t:%T' {dev.path}", devices=names)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{major:x}:{minor:x}"
