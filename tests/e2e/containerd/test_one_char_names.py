"""Why cdi-gen refuses one-character vendor and class names: containerd 1.7.24 dies of them.

The tested containerd panics in its CDI spec-folder watcher as soon as a spec of kind ``x/...``
appears. cdi-gen must therefore never produce one, and must refuse both a config that would
and such a spec file. If a later containerd survives it, the first assertion says so and the
rule can be revisited.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from consumers import run

from .conftest import ContainerdFactory

pytestmark = pytest.mark.e2e

SPEC = {
    "cdiVersion": "0.3.0",
    "kind": "x/loop",
    "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}],
}


def test_a_one_character_vendor_kills_containerd_and_cdi_gen_refuses_it(
    start_containerd: ContainerdFactory, tmp_path: Path
) -> None:
    daemon = start_containerd()
    assert daemon.process is not None
    spec = daemon.spec_dirs[-1] / "x-loop.json"
    spec.write_text(json.dumps(SPEC))
    with contextlib.suppress(subprocess.TimeoutExpired):
        daemon.process.wait(timeout=10)
    assert daemon.process.poll() is not None, "containerd survived a one-character vendor"
    assert "panic" in daemon.log_text()
    spec.unlink()  # containerd cannot even start again while it is there

    (tmp_path / "x.json").write_text(json.dumps(SPEC))
    validate = run([sys.executable, "-m", "cdi_gen", "validate", tmp_path / "x.json"])
    assert validate.returncode != 0
    assert "invalid vendor 'x'" in validate.stdout + validate.stderr

    config = tmp_path / "x.yaml"
    config.write_text(
        json.dumps({"vendor": "x", "classes": [{"name": "loop", "match": {"subsystem": "block"}}]})
    )
    check = run([sys.executable, "-m", "cdi_gen", "check-config", config])
    assert check.returncode == 2
    assert "invalid vendor 'x'" in check.stdout + check.stderr
