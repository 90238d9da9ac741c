"""The suite's own rules, checked by running pytest the way a newcomer would: every test folder
runs alone from the repository root with a bare ``pytest``; a skip fails the run; an empty
parameter list is an error, not a skip; the run sees only what ``make test`` installed. And,
read from the test sources: tests wait for events through the one polling helper
(``tests/waiting.py``), not for time."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests import lockfile
from tests.conftest import REPO
from tests.plugins.environment import SET, distribution_problems

TESTS = REPO / "tests"


def _pytest(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # -P: like the `pytest` script, do not put the working folder on sys.path (`python -m`
    # would, and hide exactly the "No module named 'tests'" a newcomer runs into).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    return subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _one_file_per_folder() -> list[Path]:
    folders: dict[Path, list[Path]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        folders.setdefault(path.parent, []).append(path)
    # In each folder the file most likely to break alone: one importing through `tests.`.
    return [
        next((f for f in files if "from tests." in f.read_text()), files[0])
        for files in folders.values()
    ]


@pytest.mark.parametrize("path", _one_file_per_folder(), ids=lambda p: str(p.relative_to(REPO)))
def test_a_test_file_is_collected_alone_from_the_repository_root(path: Path) -> None:
    proc = _pytest(["--collect-only", "-q", str(path.relative_to(REPO))], REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _write(folder: Path, body: str) -> Path:
    path = folder / "test_probe.py"
    path.write_text("import pytest\n\n" + body)
    return path


def _run_with_project_config(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    probe = _write(tmp_path, body)
    return _pytest(
        ["-c", str(REPO / "pyproject.toml"), "-p", "tests.plugins.no_skips", str(probe)], REPO
    )


def test_a_skip_fails_the_run_and_says_why(tmp_path: Path) -> None:
    proc = _run_with_project_config(
        tmp_path, "def test_x() -> None:\n    pytest.skip('podman missing')\n"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "podman missing" in proc.stdout
    assert "1 test(s) skipped or xfailed; this suite allows none" in proc.stdout


def test_a_clean_run_still_passes(tmp_path: Path) -> None:
    proc = _run_with_project_config(tmp_path, "def test_x() -> None:\n    assert True\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_empty_parameter_list_is_an_error(tmp_path: Path) -> None:
    proc = _run_with_project_config(
        tmp_path,
        "@pytest.mark.parametrize('x', [])\ndef test_x(x: int) -> None:\n    assert x\n",
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Empty parameter set" in proc.stdout + proc.stderr


def _distribution(folder: Path, name: str, version: str = "1.0") -> metadata.Distribution:
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return metadata.PathDistribution(info)


def test_the_project_environment_holds_exactly_the_lock() -> None:
    assert distribution_problems(metadata.distributions()) == []


def test_a_package_installed_by_hand_stops_the_run(tmp_path: Path) -> None:
    # What made a test pass only on the machine that had run `make lint` before.
    found = [*metadata.distributions(), _distribution(tmp_path, "mypy-protobuf-by-hand")]
    files = "+".join(f"requirements/{f}.txt" for f in lockfile.SET_FILES[SET])
    assert distribution_problems(found) == [
        f"installed but not in the lock ({files}): mypy-protobuf-by-hand (installed by hand? "
        "add it to pyproject.toml and run make lock, or rm -rf .venv)"
    ]


def test_a_locked_package_missing_stops_the_run() -> None:
    found = [d for d in metadata.distributions() if d.metadata["Name"] != "hypothesis"]
    assert "locked but not installed: hypothesis" in distribution_problems(found)


def test_a_package_at_another_version_than_the_locks_stops_the_run(tmp_path: Path) -> None:
    # What a machine that installed on another day would hold without the lock.
    locked = lockfile.read_set(SET)["hypothesis"].version
    found = [
        *(d for d in metadata.distributions() if d.metadata["Name"] != "hypothesis"),
        _distribution(tmp_path, "hypothesis", "0.0.1"),
    ]
    assert distribution_problems(found) == [
        f"installed at another version than the lock's: hypothesis 0.0.1 (locked {locked})"
    ]


def test_a_folder_from_outside_on_the_path_stops_the_run(tmp_path: Path) -> None:
    # PYTHONPATH (or a user site-packages) would show the run packages setup never installed.
    probe = _write(tmp_path, "def test_x() -> None:\n    assert True\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    config = ["-c", str(REPO / "pyproject.toml"), "-p", "tests.plugins.environment"]
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", *config, str(probe)],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert f"on sys.path but outside the project's environment: {tmp_path}" in proc.stderr


# --- tests wait for events, not for time ---------------------------------------------------------

#: A sleep longer than this in a test is a fixed wait: "sleep, then assert" flakes when the
#: machine is slow (a positive check) or proves nothing (a negative one). Wait with
#: tests.waiting instead, for the event or for a counter showing the moment passed.
LONGEST_SLEEP = 0.2

#: Sleeps above the limit that are not waits, and why.
SLEEPS_ALLOWED = {
    # Each read fetches the pod's whole log through the API server and the kubelet, and the
    # consumer prints every 2 s: polling faster only loads the node.
    "tests/cluster/pods.py": "the pod-log poll of Pods.seen",
    # The DaemonSet poll also fails early on a crash loop, which until_sync cannot express.
    "tests/cluster/test_daemonset.py": "the DaemonSet readiness poll",
}

#: Module-level names of the private polling copies the shared helper replaced.
POLLING_COPIES = {"until", "_until", "wait_for", "_wait_for", "eventually", "_eventually"}


def _test_sources() -> list[Path]:
    return [p for p in sorted(TESTS.rglob("*.py")) if p != TESTS / "waiting.py"]


def _long_sleeps(path: Path, root: Path = REPO) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "sleep" or not isinstance(node.func.value, ast.Name):
            continue
        if node.func.value.id not in ("time", "asyncio") or not node.args:
            continue
        arg = node.args[0]
        value = arg.value if isinstance(arg, ast.Constant) else None
        if isinstance(value, (int, float)) and value > LONGEST_SLEEP:
            found.append(f"{path.relative_to(root)}:{node.lineno}: sleep({value})")
    return sorted(found, key=lambda line: int(line.split(":")[1]))


def test_no_test_sleeps_longer_than_a_poll_interval() -> None:
    found = [
        line
        for path in _test_sources()
        if str(path.relative_to(REPO)) not in SLEEPS_ALLOWED
        for line in _long_sleeps(path)
    ]
    assert found == [], (
        f"fixed waits longer than {LONGEST_SLEEP}s (wait for the event with tests.waiting): {found}"
    )


def test_the_sleep_rule_sees_a_fixed_wait(tmp_path: Path) -> None:
    path = tmp_path / "test_probe.py"
    path.write_text(
        "import asyncio\nimport time\n\n"
        "async def f():\n    await asyncio.sleep(0.3)\n    time.sleep(2)\n    time.sleep(0.2)\n"
    )
    assert _long_sleeps(path, tmp_path) == [
        "test_probe.py:5: sleep(0.3)",
        "test_probe.py:6: sleep(2)",
    ]


def test_the_allowed_sleeps_are_still_there() -> None:
    # An entry whose sleep was removed would silently allow the next one.
    stale = [p for p in SLEEPS_ALLOWED if not _long_sleeps(REPO / p)]
    assert stale == []


def test_no_private_copy_of_the_polling_helper() -> None:
    copies = [
        f"{path.relative_to(REPO)}:{node.lineno}: {node.name}"
        for path in _test_sources()
        for node in ast.parse(path.read_text(), str(path)).body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in POLLING_COPIES
    ]
    assert copies == [], f"use tests.waiting.until / until_sync: {copies}"


def test_make_test_runs_the_machines_own_tests_on_one_worker() -> None:
    # make test's pytest-xdist scopes (tests/plugins/machine.py): the cluster, e2e and
    # kernel-marked files share one scope, so they never run side by side; any other file is
    # a scope of its own.
    from tests.plugins.machine import MACHINE, scope_of_file

    files = sorted(p.relative_to(REPO).as_posix() for p in TESTS.rglob("test_*.py"))
    machine = {f for f in files if scope_of_file(f) == MACHINE}
    assert {f for f in files if f.startswith(("tests/cluster/", "tests/e2e/"))} <= machine
    assert {
        "tests/integration/test_agent.py",
        "tests/integration/test_agent_failures.py",
        "tests/integration/test_udev_real.py",
    } <= machine
    kernel = {f for f in files if "pytest.mark.kernel" in (REPO / f).read_text()}
    assert machine == kernel | {f for f in files if f.startswith(("tests/cluster/", "tests/e2e/"))}
    assert all(scope_of_file(f) == f for f in set(files) - machine)
    assert "tests/unit/test_names.py" not in machine
