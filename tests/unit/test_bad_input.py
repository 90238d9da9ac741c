"""Bad input gets one line and exit 2, never a traceback or a hang (issue 11, defect 7).

Every case runs the real command line in a subprocess, with a timeout, as a user would.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

GOOD_CONFIG = """\
vendor: example.com
classes:
  - name: loop
    match: {subsystem: block, kernel: "loop*"}
"""
RECORD = {
    "sys_path": "/sys/devices/virtual/block/loop1",
    "subsystem": "block",
    "devnode": "/dev/loop1",
    "devtype": "disk",
    "major": 7,
    "minor": 1,
}


def run(
    *args: str, env: dict[str, str] | None = None, stdout: int | None = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    # A hang fails on the subprocess timeout; how fast the CLI answers is the benchmarks' job.
    result = subprocess.run(
        [sys.executable, "-m", "cdi_gen", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, **(env or {})},
    )
    return result


def one_error(
    result: subprocess.CompletedProcess[str], code: int, *fragments: str, logs: bool = False
) -> str:
    """The single ``error:`` line of ``result``; fails unless it exits ``code``.

    With ``logs`` (the agent), other stderr lines are its log and are not counted.
    """
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    if logs:
        lines = [line for line in lines if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert len(lines[0]) < 400, lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.returncode == code, (result.returncode, result.stderr)
    return lines[0]


def bomb() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join([*lines, "classes: *a8", ""])


CONFIG_CASES = {
    "complex-key.yaml": ("vendor: example.com\nclasses:\n  ? [a, b]\n  : 1\n", "mapping key"),
    "big-int.yaml": (
        f"vendor: example.com\nclasses: []\nresyncSeconds: {'9' * 5000}\n",
        "not a valid !!int",
    ),
    "deep.yaml": ("vendor: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than 64"),
    "bad-int-tag.yaml": (
        "vendor: example.com\nresyncSeconds: !!int abc\nclasses: []\n",
        "'abc' is not a valid !!int",
    ),
    "bad-bool-tag.yaml": ("vendor: !!bool maybe\nclasses: []\n", "'maybe' is not a valid !!bool"),
    "cycle.yaml": ("vendor: example.com\nclasses: &a [*a]\n", "cycle"),
    "big-int.json": (
        f'{{"vendor": "example.com", "classes": [], "resyncSeconds": {"9" * 5000}}}',
        "4300 digits",
    ),
    "deep.json": ('{"vendor": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deep"),
    "duplicate.json": (
        '{"vendor": "example.com", "vendor": "other.com", "classes": []}',
        "duplicate key 'vendor'",
    ),
    "tiny-resync.yaml": (
        GOOD_CONFIG + "resyncSeconds: 1e-300\n",
        "resyncSeconds: input should be greater than or equal to 10",
    ),
    "infinite-resync.yaml": (
        GOOD_CONFIG + "resyncSeconds: .inf\n",
        "resyncSeconds: input should be less than or equal to 604800",
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIG_CASES))
def test_bad_config_is_one_line_exit_2(tmp_path: Path, name: str) -> None:
    text, fragment = CONFIG_CASES[name]
    path = tmp_path / name
    path.write_text(text)
    one_error(run("check-config", str(path)), 2, str(path), fragment)


def test_alias_bomb_config_is_refused_fast(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb())
    assert len(bomb()) < 500
    one_error(run("check-config", str(path)), 2, "aliases expand the document")


def test_huge_config_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(GOOD_CONFIG + "# padding\n" * 1_000_000)  # 10 MB
    one_error(run("check-config", str(path)), 2, "too large (9.5 MiB; the limit is 1.0 MiB)")


def test_fifo_or_folder_as_config(tmp_path: Path) -> None:
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    one_error(run("check-config", str(fifo)), 2, "not a regular file (a FIFO)")
    one_error(run("discover", "--config", str(fifo)), 2, "not a regular file (a FIFO)")
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    # The agent's config comes from the environment in a pod: click's own check is bypassed.
    result = run("doctor", env={"CDI_GEN_CONFIG": str(folder)})
    assert "Traceback" not in result.stderr
    assert result.returncode == 2, result.stderr
    assert "is a directory" in result.stderr or "a folder" in result.stderr


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"[1]", "[0]: a device record should be an object, got 1"),
        (orjson.dumps([{**RECORD, "devnode": 5}]), "[0]: devnode: should be a string, got 5"),
        (orjson.dumps([{**RECORD, "major": "7"}]), "major: should be a non-negative integer"),
        (orjson.dumps([{**RECORD, "properties": ["x"]}]), "properties: should be an object"),
        (orjson.dumps([{**RECORD, "parents": [3]}]), "parents[0]: should be an object"),
        (orjson.dumps([{"subsystem": "block"}]), "sys_path: missing"),
        (b"[" * 5000, "not udev records"),
        (b'{"a": 1}', "not udev records: a JSON records file is a list of records"),
    ],
)
def test_records_of_the_wrong_shape(tmp_path: Path, content: bytes, fragment: str) -> None:
    (tmp_path / "config.yaml").write_text(GOOD_CONFIG)
    records = tmp_path / "records.json"
    records.write_bytes(content)
    args = ("--config", str(tmp_path / "config.yaml"), "--records", str(records))
    one_error(run("discover", *args), 2, fragment)


def test_records_fifo_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "records.txt")
    one_error(
        run("discover", "--records", str(tmp_path / "records.txt")),
        2,
        "not a regular file (a FIFO)",
    )


def test_metrics_address_out_of_range_or_in_use(short_dir: Path) -> None:
    base = ("run", "--no-kubelet", "--spec-dir", str(short_dir / "cdi"))
    one_error(
        run(*base, "--metrics-address", "127.0.0.1:99999"),
        2,
        "'127.0.0.1:99999'",
        "port of 0 to 65535",
        logs=True,
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        line = one_error(
            run(*base, "--metrics-address", address), 2, address, "cannot listen", logs=True
        )
        assert line.endswith("cannot listen: Address already in use"), line


def test_empty_spec_dir_is_an_error_not_the_default(tmp_path: Path) -> None:
    records = tmp_path / "records.json"
    records.write_bytes(orjson.dumps([RECORD]))
    one_error(
        run("doctor", "--records", str(records), env={"CDI_GEN_SPEC_DIR": ""}),
        2,
        "CDI_GEN_SPEC_DIR is set but empty",
    )
    (tmp_path / "config.yaml").write_text(GOOD_CONFIG)
    write = ("write", "--config", str(tmp_path / "config.yaml"), "--records", str(records))
    one_error(run(*write, "--spec-dir", ""), 2, "--spec-dir: an empty path")


def test_output_to_a_device_or_a_full_disk(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(GOOD_CONFIG)
    records = tmp_path / "records.json"
    records.write_bytes(orjson.dumps([RECORD]))
    render = ("render", "--class", "loop", "--config", str(tmp_path / "config.yaml"))
    render += ("--records", str(records))
    # A device node of our own like /dev/full: it must not be replaced by a regular file.
    full = tmp_path / "full"
    os.mknod(full, 0o666 | 0o020000, os.makedev(1, 7))
    one_error(run(*render, "-o", str(full)), 2, "not a regular file")
    assert full.is_char_device()
    with open("/dev/full", "w") as devfull:
        result = run(*render, stdout=devfull.fileno())
    one_error(result, 1, "cannot write output", "No space left on device")


def test_doctor_on_malformed_runtime_configs(tmp_path: Path) -> None:
    records = tmp_path / "records.json"
    records.write_bytes(orjson.dumps([RECORD]))
    cases = {
        "plugins.toml": ("plugins = 5\n", "plugins should be a table, got 5"),
        "version.toml": ('version = "x"\n', "version should be an integer, got 'x'"),
        "v2.toml": ('version = 2\n[plugins]\n"io.containerd.grpc.v1.cri" = 3\n', "a table"),
        "enable.toml": ('[plugins.cri]\nenable_cdi = "yes"\n', "enable_cdi should be true"),
        "dirs.toml": ('[plugins.cri]\ncdi_spec_dirs = "/etc/cdi"\n', "list of folder names"),
        "syntax.toml": ("x = \n", "Invalid value"),
    }
    for name, (text, fragment) in cases.items():
        (tmp_path / name).write_text(text)
        result = run(
            "doctor",
            "--records",
            str(records),
            "--containerd-config",
            str(tmp_path / name),
            "--containerd-version",
            "2.0.0",
            "--crio-config",
            str(tmp_path / "crio-absent"),
        )
        assert "Traceback" not in result.stderr, result.stderr
        assert f"FAIL containerd: cannot read {tmp_path / name}: " in result.stdout, name
        assert fragment in result.stdout, (name, result.stdout)
    (tmp_path / "crio.conf").write_text("[crio]\nruntime = 5\n")
    result = run(
        "doctor",
        "--records",
        str(records),
        "--containerd-config",
        str(tmp_path / "syntax.toml"),
        "--crio-config",
        str(tmp_path / "crio.conf"),
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert "FAIL cri-o: cannot read" in result.stdout
    assert "runtime should be a table, got 5" in result.stdout
