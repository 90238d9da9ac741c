"""podman 4.3 (CDI library 0.5.2) injecting the devices of specs written by cdi-gen.

The hand-written spec test pins down the harness itself (isolation, image, loop devices), so
that a failure in the cdi-gen tests below points at cdi-gen rather than at the plumbing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from consumers import DYNAMIC_DIR, STATIC_DIR, LoopDevice, LoopDevices, Podman, SpecDirs

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
