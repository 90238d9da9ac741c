"""podman 4.3 and `cdi-gen doctor` agree on which cdiVersion podman reads.

Doctor finds podman on PATH, asks its version and looks the limit up (0.5.0: CDI library
0.5.2); a spec at that limit is resolved by podman and passes doctor, one a version above it is
refused by podman ("unresolvable CDI devices") and is a doctor FAIL naming the file, its
version and the limit. (The containerd twin: tests/e2e/containerd/test_runtime_limit.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from consumers import Podman, SpecDirs, doctor

VENDOR = "example.com"
CLASS = "limit"
#: No containerd or CRI-O in these folders: the doctor's verdict is podman's alone.
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"


def _doctor(spec_dirs: SpecDirs, work: Path) -> tuple[int, list[str]]:
    return doctor(
        work,
        spec_dirs.dynamic,
        [spec_dirs.static, spec_dirs.dynamic],
        "--containerd-config",
        work / "none.toml",
        path=PATH,
    )


@pytest.mark.parametrize(("version", "readable"), [("0.5.0", True), ("0.6.0", False)])
def test_podman_and_doctor_agree_at_and_above_the_limit(
    podman: Podman, spec_dirs: SpecDirs, tmp_path: Path, version: str, readable: bool
) -> None:
    spec = {
        "cdiVersion": version,
        "kind": f"{VENDOR}/{CLASS}",
        "devices": [{"name": "envonly", "containerEdits": {"env": [f"AT={version}"]}}],
    }
    path = spec_dirs.dynamic / f"{VENDOR}-{CLASS}.json"
    path.write_text(json.dumps(spec))

    ran = podman.run_container(spec_dirs, "echo $AT", devices=[f"{VENDOR}/{CLASS}=envonly"])
    code, lines = _doctor(spec_dirs, tmp_path)

    assert any(
        line.startswith("OK   runtime: podman 4.3.1 (reads cdiVersion <= 0.5.0;") for line in lines
    ), lines
    fails = [line for line in lines if line.startswith("FAIL cdiVersion:")]
    if readable:
        assert (ran.returncode, ran.stdout.strip()) == (0, version), ran.stderr
        assert fails == [], lines
    else:
        assert "unresolvable CDI devices" in ran.stderr, ran.stderr
        assert len(fails) == 1, lines
        assert fails[0].startswith(
            f"FAIL cdiVersion: {path}: {version} is newer than podman 4.3.1 reads (<= 0.5.0"
        )
        assert code == 1
