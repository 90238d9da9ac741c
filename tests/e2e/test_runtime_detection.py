"""Runtime detection against real binaries: a Go program built here with the CDI module as a
dependency (its build information is what upstream runtime binaries carry), and the podman
this machine runs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cdi_gen.cdi import runtimes as rt

MAIN = """package main

import (
\t"fmt"
\t"os"

\tcdi "tags.cncf.io/container-device-interface"
)

func main() {
\tif len(os.Args) > 1 && os.Args[1] == "--version" {
\t\tfmt.Println("containerd github.com/containerd/containerd 1.7.0 " + cdi.Revision)
\t}
}
"""


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        pytest.fail("go not found on PATH; run `make test` (scripts/setup.sh test installs it)")
    return go


def _build_fake_containerd(work: Path) -> Path:
    """A binary named containerd that says 1.7.0 (the table: library 0.5.4) but was built
    with CDI module v0.8.0 (replaced by a local folder so the build needs no network)."""
    (work / "cdi").mkdir(parents=True)
    (work / "cdi" / "go.mod").write_text("module tags.cncf.io/container-device-interface\n")
    (work / "cdi" / "cdi.go").write_text('package cdi\n\nconst Revision = "abc"\n')
    (work / "go.mod").write_text(
        "module example.com/fake\n\ngo 1.19\n\n"
        "require tags.cncf.io/container-device-interface v0.8.0\n\n"
        "replace tags.cncf.io/container-device-interface v0.8.0 => ./cdi\n"
    )
    (work / "main.go").write_text(MAIN)
    out = work / "bin" / "containerd"
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off", "GOWORK": "off"}
    proc = subprocess.run(
        [_go(), "build", "-o", str(out), "."],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def test_build_info_of_a_real_go_binary_wins_over_the_release_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = _build_fake_containerd(tmp_path)
    deps = rt.go_module_versions(binary)
    assert deps["tags.cncf.io/container-device-interface"] == "v0.8.0"
    monkeypatch.setenv("PATH", str(binary.parent))
    found = rt.detect("containerd")
    assert found is not None
    assert (found.version, found.limit) == ("1.7.0", "0.8.0")
    assert found.source == f"CDI library 0.8.0, build info of {binary}"
    assert rt.parse_reference("containerd@1.7.0").limit == "0.5.0"  # what the table alone says


def test_the_podman_on_this_machine() -> None:
    # Debian 12's podman 4.3.1 (built without module information): the table, 0.5.0, which
    # tests/e2e/test_runtime_limits.py shows podman itself enforcing.
    if shutil.which("podman") is None:
        pytest.fail("podman not found on PATH; run `make test` (scripts/setup.sh installs it)")
    found = rt.detect("podman")
    assert found is not None
    assert (found.version, found.limit) == ("4.3.1", "0.5.0")
