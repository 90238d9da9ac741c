"""The runtime found through its CRI socket where no runtime binary is visible (the agent in a
pod): ``--cdi-version runtime`` and the doctor ask ``runtime.v1.RuntimeService/Version`` of a
real gRPC server on a real unix socket, and a socket that is absent, silent or answers
garbage gives one clear line and the behaviour of a node without a runtime."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import orjson
import pytest

from cdi_gen.cdi import cri
from cdi_gen.cli.main import main
from cdi_gen.config.settings import load_settings
from tests.fakes.cri import FakeCri, garbage_socket, silent_socket
from tests.fakes.kubelet import FakeKubelet
from tests.ports import free_port

pytestmark = pytest.mark.timeout(60)

CONFIG = """
vendor: example.com
classes:
  - name: loop
    match: {subsystem: block, kernel: "loop[0-7]"}
  - name: gids
    match: {subsystem: block, kernel: "loop[0-7]"}
    containerEdits: {additionalGids: [44]}
"""


RECORDS = [
    {
        "sys_path": "/sys/devices/virtual/block/loop0",
        "subsystem": "block",
        "kernel": "loop0",
        "devnode": "/dev/loop0",
        "major": 7,
        "minor": 0,
    }
]


@pytest.fixture
def no_runtime_on_path(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH with no containerd, crio or podman on it, as in the agent's image."""
    empty = short_dir / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return empty


def _cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out + err


def _doctor(capsys: pytest.CaptureFixture[str], folder: Path, *extra: str | Path) -> str:
    (folder / "records.json").write_text("[]")
    _, output = _cli(
        capsys, "doctor", "--spec-dir", folder / "cdi", "--containerd-config",
        folder / "none.toml", "--crio-config", folder / "none.conf", "--device-plugin-dir",
        folder, "--records", folder / "records.json", *extra,
    )  # fmt: skip
    return output


@pytest.mark.parametrize(
    ("name", "version", "shown", "limit"),
    [
        ("containerd", "v2.3.7", "containerd 2.3.7", "1.1.0"),
        ("containerd", "1.7.24~ds1", "containerd 1.7.24~ds1", "0.8.0"),  # Debian 13's build
        ("containerd", "v2.2.0", "containerd 2.2.0", "1.0.0"),
        ("cri-o", "1.36.3", "cri-o 1.36.3", "1.1.0"),
        ("cri-o", "1.30.2", "cri-o 1.30.2", "0.7.0"),
    ],
)
def test_the_cri_answer_goes_through_the_release_table(
    short_dir: Path, name: str, version: str, shown: str, limit: str
) -> None:
    socket = short_dir / "cri.sock"
    with FakeCri(socket, name, version) as fake:
        runtime = cri.ask(socket)
        assert fake.requests.get_nowait().version == cri.CRI_API_VERSION
    assert f"{runtime.name} {runtime.version}" == shown
    assert runtime.limit == limit
    assert runtime.source.endswith(f"version from the CRI at {socket}")


def test_doctor_reports_the_runtime_the_cri_socket_names(
    short_dir: Path, no_runtime_on_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    socket = short_dir / "containerd.sock"
    with FakeCri(socket, "containerd", "v2.3.7"):
        output = _doctor(capsys, short_dir, "--cri-socket", socket)
    assert (
        "OK   runtime: containerd 2.3.7 (reads cdiVersion <= 1.1.0; CDI library 1.1.0, "
        f"release table; version from the CRI at {socket})"
    ) in output.splitlines(), output
    # The containerd checks know its version too: 2.x needs no config for CDI.
    assert "containerd 2.x enables CDI by default" in output, output
    assert "no container runtime found" not in output


def test_doctor_asks_every_socket_of_the_list_that_exists(
    short_dir: Path, no_runtime_on_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default list names containerd's and CRI-O's sockets; a node has one of them."""
    socket = short_dir / "crio.sock"
    with FakeCri(socket, "cri-o", "1.36.3"):
        output = _doctor(
            capsys, short_dir, "--cri-socket", short_dir / "absent.sock", "--cri-socket", socket
        )
    lines = output.splitlines()
    found = "OK   runtime: cri-o 1.36.3 (reads cdiVersion <= 1.1.0;"
    assert any(line.startswith(found) for line in lines), output
    assert "absent.sock" not in output  # one of two absent is the normal case


def test_a_runtime_binary_on_path_wins_and_the_cri_is_not_asked(
    short_dir: Path, no_runtime_on_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    podman = no_runtime_on_path / "podman"
    podman.write_text("#!/bin/sh\necho 'podman version 4.3.1'\n")
    podman.chmod(0o755)
    socket = short_dir / "containerd.sock"
    with FakeCri(socket, "containerd", "v2.3.7") as fake:
        output = _doctor(capsys, short_dir, "--cri-socket", socket)
        assert fake.requests.empty()
    assert "OK   runtime: podman 4.3.1 (reads cdiVersion <= 0.5.0; " in output, output
    assert "containerd 2.3.7" not in output


@pytest.fixture
def unimplemented_socket(short_dir: Path) -> Iterator[Path]:
    """A gRPC server that is not a runtime: every call is UNIMPLEMENTED."""
    socket = short_dir / "other.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield socket
    finally:
        server.stop(None).wait()


def test_a_socket_that_gives_no_runtime_is_one_line_naming_it_and_why(
    short_dir: Path, unimplemented_socket: Path
) -> None:
    regular = short_dir / "file.sock"
    regular.write_text("")
    cases = {
        short_dir / "absent.sock": "no such socket",
        regular: "not a socket",
        unimplemented_socket: "RuntimeService/Version failed: UNIMPLEMENTED",
    }
    for socket, why in cases.items():
        with pytest.raises(cri.CriError) as info:
            cri.ask(socket)
        assert str(info.value).startswith(f"CRI socket {socket}: {why}"), info.value
    with silent_socket(short_dir / "silent.sock") as silent, pytest.raises(cri.CriError) as info:
        cri.ask(silent, timeout=0.2)
    assert str(info.value) == (
        f"CRI socket {silent}: no answer to RuntimeService/Version within 0.2 s"
    )
    with garbage_socket(short_dir / "junk.sock") as junk, pytest.raises(cri.CriError) as info:
        cri.ask(junk)
    assert str(info.value).startswith(f"CRI socket {junk}: RuntimeService/Version failed: ")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "version", "rule"),
    [
        ("rkt\x1b[31m", "1.0.0", "unknown runtime 'rkt\\x1b[31m', known: containerd, cri-o"),
        ("", "v2.3.7", "unknown runtime '', known"),
        ("containerd", "banana", "containerd version: 'banana' is not a version X.Y.Z"),
        ("containerd", "", "containerd version: '' is not a version X.Y.Z"),
        ("cri-o", "x" * 5000, "(5000 long) is not a version X.Y.Z"),
    ],
)
def test_a_garbage_answer_is_one_line_quoting_it_and_the_rule(
    short_dir: Path, name: str, version: str, rule: str
) -> None:
    socket = short_dir / "cri.sock"
    with FakeCri(socket, name, version), pytest.raises(cri.CriError) as info:
        cri.ask(socket)
    line = str(info.value)
    assert line.startswith(f"CRI socket {socket}: RuntimeService/Version answered "), line
    assert rule in line, line
    assert "\n" not in line and "\x1b" not in line and len(line) < 300


def test_doctor_says_why_the_cri_gave_nothing_and_warns_as_before(
    short_dir: Path, no_runtime_on_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with garbage_socket(short_dir / "junk.sock") as junk:
        output = _doctor(capsys, short_dir, "--cri-socket", junk)
    lines = output.splitlines()
    cri_lines = [line for line in lines if line.startswith(f"WARN runtime: CRI socket {junk}: ")]
    assert len(cri_lines) == 1, output
    assert any(line.startswith("WARN runtime: no container runtime found") for line in lines)
    output = _doctor(capsys, short_dir, "--cri-socket", short_dir / "absent.sock")
    assert f"WARN runtime: no CRI socket at {short_dir / 'absent.sock'}" in output, output


def test_run_without_a_runtime_anywhere_exits_2_with_the_cri_reason_in_its_line(
    short_dir: Path, no_runtime_on_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (short_dir / "config.yaml").write_text(CONFIG)
    with silent_socket(short_dir / "silent.sock") as silent:
        code, output = _cli(
            capsys, "run", "--config", short_dir / "config.yaml", "--spec-dir",
            short_dir / "cdi", "--cdi-version", "runtime", "--cri-socket", silent,
        )  # fmt: skip
    assert code == 2, output
    (line,) = output.splitlines()
    assert line == (
        "error: cdiVersion runtime: no container runtime found (containerd, crio, podman on "
        f"PATH; CRI socket {silent}: no answer to RuntimeService/Version within "
        f"{cri.TIMEOUT_SECONDS:g} s); name it with --runtime NAME@VERSION, e.g. "
        "containerd@1.7.24"
    )
    assert not (short_dir / "cdi").exists()


def test_the_cri_sockets_default_to_containerd_and_cri_o(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings({}).runtimes.cri_sockets == (
        Path("/run/containerd/containerd.sock"),
        Path("/var/run/crio/crio.sock"),
    )
    monkeypatch.setenv("CDI_GEN_CRI_SOCKET", "/a.sock /b.sock")
    assert load_settings({}).runtimes.cri_sockets == (Path("/a.sock"), Path("/b.sock"))


async def test_run_pins_the_limit_of_the_runtime_the_cri_names(
    short_dir: Path, no_runtime_on_path: Path
) -> None:
    """The agent as in a pod: no runtime binary, CDI_GEN_CDI_VERSION=runtime, the CRI answers
    containerd 1.7.0 (reads <= 0.5.0): loop's spec is written as 0.5.0 and served; gids needs
    0.7.0 (additionalGids) and is refused."""
    config = short_dir / "config.yaml"
    config.write_text(CONFIG)
    socket = short_dir / "containerd.sock"
    env = {
        **os.environ,
        "CDI_GEN_CONFIG": str(config),
        "CDI_GEN_SPEC_DIR": str(short_dir / "cdi"),
        "CDI_GEN_DEVICE_PLUGIN_DIR": str(short_dir / "dp"),
        "CDI_GEN_UDEV_SOURCE": "kernel",
        "CDI_GEN_METRICS_ADDRESS": f"127.0.0.1:{free_port()}",
        "CDI_GEN_CDI_VERSION": "runtime",
        "CDI_GEN_CRI_SOCKET": str(socket),
    }
    with FakeCri(socket, "containerd", "v1.7.0") as fake:
        async with FakeKubelet(short_dir / "dp") as kubelet:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "cdi_gen", "run", env=env, stderr=asyncio.subprocess.PIPE
            )
            try:
                plugins = {}
                while len(plugins) < 2:
                    plugin = await kubelet.next_registration(within=20)
                    plugins[plugin.request.resource_name] = plugin
                assert set(await plugins["example.com/loop"].next_devices()) >= {"loop0", "loop7"}
                # Every device of gids needs more than the runtime reads: it advertises none.
                assert await plugins["example.com/gids"].next_devices() == {}
                spec = orjson.loads((short_dir / "cdi" / "example.com-loop.json").read_bytes())
                assert spec["cdiVersion"] == "0.5.0"
            finally:
                proc.send_signal(signal.SIGTERM)
                _, stderr = await asyncio.wait_for(proc.communicate(), 15)
        assert fake.requests.qsize() == 1  # asked once, at start
    assert proc.returncode == 0, stderr.decode()
    assert not (short_dir / "cdi" / "example.com-gids.json").exists()
    text = stderr.decode()
    assert "additionalGids needs cdiVersion 0.7.0 or newer, the target is 0.5.0" in text, text


@pytest.mark.parametrize("command", ["write", "render"])
def test_one_shot_commands_pin_what_the_cri_names_from_the_agents_variables(
    short_dir: Path,
    no_runtime_on_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    """`cdi-gen write` in the agent's environment (an init container) pins what it pins."""
    (short_dir / "config.yaml").write_text(CONFIG)
    (short_dir / "records.json").write_text(json.dumps(RECORDS))
    socket = short_dir / "containerd.sock"
    monkeypatch.setenv("CDI_GEN_CDI_VERSION", "runtime")
    monkeypatch.setenv("CDI_GEN_CRI_SOCKET", f"{short_dir / 'absent.sock'} {socket}")
    out = short_dir / "cdi"
    where = ["--spec-dir", out] if command == "write" else ["--class", "loop", "-o", out / "x"]
    if command == "render":
        out.mkdir()
        where += ["--cdi-version", "runtime"]  # render reads no variable for its pin
    with FakeCri(socket, "containerd", "v1.7.0"):
        _, output = _cli(
            capsys, command, "--config", short_dir / "config.yaml", "--records",
            short_dir / "records.json", *where,
        )  # fmt: skip
    written = out / ("example.com-loop.json" if command == "write" else "x")
    assert json.loads(written.read_text())["cdiVersion"] == "0.5.0", output


def test_doctor_resolves_a_class_pinned_to_runtime_through_the_cri(
    short_dir: Path, no_runtime_on_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A class with `cdiVersion: runtime` made the doctor itself exit 2 in a pod."""
    config = short_dir / "config.yaml"
    config.write_text(
        "vendor: example.com\nclasses:\n  - name: loop\n    cdiVersion: runtime\n"
        '    match: {subsystem: block, kernel: "loop[0-7]"}\n'
    )
    socket = short_dir / "crio.sock"
    with FakeCri(socket, "cri-o", "1.36.3"):
        output = _doctor(capsys, short_dir, "--config", config, "--cri-socket", socket)
    assert "OK   runtime: cri-o 1.36.3 (reads cdiVersion <= 1.1.0;" in output, output


def test_the_help_shows_the_default_sockets_as_the_variable_takes_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, output = _cli(capsys, "run", "--help")
    assert code == 0
    text = " ".join(output.split())
    assert "Default: /run/containerd/containerd.sock /var/run/crio/crio.sock." in text, text
