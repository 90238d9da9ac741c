"""The package as users get it: ``python -m build`` makes a wheel, which installs into an empty
virtual environment and renders, validates and checks configs from there, package data
(the catalogue, the generated modules' stubs) included.

The build runs offline (``--no-isolation``: the backend, hatchling, is the test extra's), and
so does the install: the run-time dependencies come from the wheels setup downloaded at the
lock's versions (tests/wheelhouse.py), never from ``.venv`` itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name

from tests.conftest import REPO
from tests.wheelhouse import pins, wheelhouse

# A cold build and install take about 20 s on a busy machine.
pytestmark = pytest.mark.timeout(300)

RECORDS = REPO / "tests" / "data" / "udev" / "export-db-vm.txt"
#: What `python -m venv` puts into every environment.
SEEDED = {"pip", "setuptools"}
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _run(argv: Sequence[str | Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    # Nothing of the test's environment may reach the new one's interpreter.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONNOUSERSITE"] = "1"
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=240,
        check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = _run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, REPO],
        out,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("*.whl")
    assert built.name == f"cdi_gen-{VERSION}-py3-none-any.whl"
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    # The base interpreter of .venv, so the new environment inherits nothing from .venv.
    proc = _run([sys._base_executable, "-m", "venv", root], root)
    assert proc.returncode == 0, proc.stderr
    wheels = wheelhouse()
    proc = _run(
        [root / "bin/python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-index", "--find-links", wheels, wheel],
        root,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def test_the_wheel_holds_the_package_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in (
        "cdi_gen/config/catalogue.yaml",
        "cdi_gen/py.typed",
        "cdi_gen/_proto/deviceplugin/v1beta1/api_pb2.pyi",
    ):
        assert data in names, sorted(names)
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "src/"))]


def test_the_environment_holds_the_wheel_and_the_tested_versions_only(venv: Path) -> None:
    listing = "import importlib.metadata as m\nfor d in m.distributions(): print(d.name, d.version)"
    proc = _run([venv / "bin/python", "-c", listing], venv)
    assert proc.returncode == 0, proc.stderr
    installed = {
        f"{canonicalize_name(name)}=={version}"
        for name, version in (line.split() for line in proc.stdout.splitlines())
        if name not in SEEDED
    }
    assert installed == {*pins(), f"cdi-gen=={VERSION}"}
    proc = _run([venv / "bin/python", "-c", "import sys, cdi_gen; print(cdi_gen.__file__)"], venv)
    assert Path(proc.stdout.strip()).is_relative_to(venv), proc.stdout + proc.stderr


def test_the_installed_command_renders_and_validates(venv: Path, tmp_path: Path) -> None:
    cdi_gen = venv / "bin/cdi-gen"
    # The embedded catalogue (package data) and recorded udev data: no device of this machine.
    spec = tmp_path / "cdi-gen.io-loop.json"
    proc = _run([cdi_gen, "render", "--class", "loop", "--records", RECORDS, "-o", spec], tmp_path)
    assert proc.returncode == 0, proc.stderr
    rendered = json.loads(spec.read_text())
    assert rendered["kind"] == "cdi-gen.io/loop"
    assert rendered["devices"], rendered
    proc = _run([cdi_gen, "validate", spec], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == f"{spec}: OK"
    configmap = REPO / "deploy" / "kubernetes" / "base" / "configmap.yaml"
    (shipped,) = [d for d in yaml.safe_load_all(configmap.read_text()) if d]
    (tmp_path / "config.yaml").write_text(shipped["data"]["config.yaml"])
    proc = _run([cdi_gen, "check-config", tmp_path / "config.yaml"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_installed_schemas_are_the_committed_ones(venv: Path) -> None:
    kinds = (("spec", "cdi-spec"), ("config", "config"), ("deviceconfig", "deviceconfig"))
    for kind, committed in kinds:
        proc = _run([venv / "bin/cdi-gen", "schema", kind], venv)
        assert proc.returncode == 0, proc.stderr
        expected = json.loads((REPO / "schemas" / f"{committed}.schema.json").read_text())
        assert json.loads(proc.stdout) == expected


def test_the_installed_version_names_no_revision_and_no_lock(venv: Path) -> None:
    """Outside an image and outside a checkout no revision is known, nor the lock of an
    environment the user made, and it says so."""
    proc = _run([venv / "bin/cdi-gen", "--version"], venv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"cdi-gen, version {VERSION} (revision unknown, lock unknown)\n"
