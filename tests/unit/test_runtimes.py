"""Which cdiVersion each runtime release reads: the table, version parsing, Go build info, the
readability verdict, and the CLI's `validate --for`, `--cdi-version runtime` and doctor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdi_gen.cdi import runtimes as rt
from cdi_gen.cdi.spec import Spec
from cdi_gen.cli.main import main
from cdi_gen.errors import ConfigError

# (reference, newest cdiVersion it reads): both sides of every row boundary of the table.
LIMITS = [
    ("containerd@1.6.20", None),
    ("containerd@1.7.0", "0.5.0"),
    ("containerd@1.7.11", "0.5.0"),
    ("containerd@1.7.12", "0.6.0"),
    ("containerd@1.7.15", "0.6.0"),
    ("containerd@1.7.16", "0.7.0"),
    ("containerd@1.7.24", "0.7.0"),
    ("containerd@1.7.26", "0.7.0"),
    ("containerd@1.7.27", "0.8.0"),
    ("containerd@v2.0.0", "0.8.0"),
    ("containerd@2.0.4", "0.8.0"),
    ("containerd@2.0.5", "1.0.0"),
    ("containerd@2.2.0", "1.0.0"),
    ("containerd@2.2.1", "1.1.0"),
    ("containerd@2.3.0", "1.1.0"),
    ("containerd@2.3.7", "1.1.0"),  # the cluster tests' current lane
    ("containerd@1.7.24~ds1", "0.8.0"),  # Debian 13's build, Built-Using library 0.8.0
    ("cri-o@1.27.3", None),
    ("crio@1.28.0", "0.6.0"),
    ("cri-o@1.29.4", "0.6.0"),
    ("cri-o@1.30.0", "0.7.0"),
    ("cri-o@1.31.0", "0.8.0"),
    ("cri-o@1.32.5", "0.8.0"),
    ("cri-o@1.33.0", "1.0.0"),
    ("cri-o@1.34.2", "1.0.0"),
    ("cri-o@1.35.0", "1.1.0"),
    ("cri-o@1.36.3", "1.1.0"),  # the cluster tests' crio lane
    ("podman@4.3.1", "0.5.0"),
    ("podman@4.6.2", "0.5.0"),
    ("podman@4.7.0", "0.6.0"),
    ("podman@4.9.4", "0.6.0"),
    ("podman@5.0.0", "0.6.0"),
    ("podman@5.1.0", "0.7.0"),
    ("podman@5.4.2", "0.8.0"),
    ("podman@5.5.0", "1.0.0"),
]


@pytest.mark.parametrize(("ref", "limit"), LIMITS)
def test_release_table(ref: str, limit: str | None) -> None:
    assert rt.parse_reference(ref).limit == limit


@pytest.mark.parametrize(
    "bad", ["containerd", "containerd@", "docker@25.0.0", "containerd@one.two", "@1.7.0"]
)
def test_bad_references_are_one_line_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        rt.parse_reference(bad)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("name", "output", "version"),
    [
        ("containerd", "containerd github.com/containerd/containerd 1.7.24~ds1 x\n", "1.7.24~ds1"),
        ("containerd", "containerd github.com/containerd/containerd/v2 v2.2.1 dea7da59\n", "2.2.1"),
        ("containerd", "containerd containerd.io 1.7.27 05044ec0a9a7\n", "1.7.27"),
        ("podman", "podman version 4.3.1\n", "4.3.1"),
        ("cri-o", "crio version 1.30.0\nGitCommit: abc\n", "1.30.0"),
        ("cri-o", "Version:        1.33.2\nGitCommit:  abc\n", "1.33.2"),
        ("podman", "something else\n", None),
    ],
)  # fmt: skip
def test_versions_from_the_runtimes_own_output(name: str, output: str, version: str) -> None:
    assert rt.version_from_output(name, output) == version


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _go_binary(path: Path, modinfo: str) -> Path:
    """A file laid out as Go 1.18+ writes build information (inline strings, flag bit 2)."""
    header = b"\xff Go buildinf:" + bytes([8, 2]) + b"\0" * 16
    body = b"".join(_varint(len(s)) + s for s in (b"go1.26.8", modinfo.encode()))
    path.write_bytes(b"\x7fELF" + b"\0" * 60 + header + body + b"\0" * 32)
    return path


def test_go_build_info_names_the_cdi_library(tmp_path: Path) -> None:
    binary = _go_binary(
        tmp_path / "containerd",
        "0w\xaf\x0c\x92t\x08\x02A\xe1\xc1\x07\xe6\xd6\x18\xe6"
        "path\tgithub.com/containerd/containerd/v2/cmd/containerd\n"
        "mod\tgithub.com/containerd/containerd/v2\tv2.2.1\t\n"
        "dep\tgithub.com/pelletier/go-toml/v2\tv2.2.3\th1:x=\n"
        "dep\ttags.cncf.io/container-device-interface\tv1.0.1\th1:y=\n"
        "=>\ttags.cncf.io/container-device-interface\tv1.1.0\th1:z=\n",
    )
    deps = rt.go_module_versions(binary)
    assert deps["tags.cncf.io/container-device-interface"] == "v1.1.0"  # the replacement built
    assert deps["github.com/pelletier/go-toml/v2"] == "v2.2.3"


def test_a_file_without_build_info_has_no_modules(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_bytes(b"#!/bin/sh\necho hi\n")
    assert rt.go_module_versions(plain) == {}
    assert rt.go_module_versions(tmp_path / "missing") == {}


def _spec(version: str, **edits: object) -> Spec:
    return Spec.model_validate(
        {
            "cdiVersion": version,
            "kind": "example.com/fpga",
            "devices": [{"name": "fpga0", "containerEdits": {"env": ["A=1"], **edits}}],
        }
    )


def test_readability_names_the_field_that_needs_the_version() -> None:
    podman = rt.parse_reference("podman@4.3.1")
    assert rt.readability_problems(_spec("0.5.0"), podman) == []
    (problem,) = rt.readability_problems(_spec("0.7.0", additionalGids=[44]), podman)
    assert problem.path == "cdiVersion"
    assert problem.message.startswith("0.7.0 is newer than podman 4.3.1 reads (<= 0.5.0, ")
    assert (
        "devices[0].containerEdits.additionalGids (additionalGids) needs 0.7.0" in problem.message
    )


def test_readability_says_when_only_the_declared_version_is_too_new() -> None:
    (problem,) = rt.readability_problems(_spec("0.6.0"), rt.parse_reference("containerd@1.7.0"))
    assert "nothing in it needs more than 0.3.0: write it with that version" in problem.message


def test_node_limit_is_what_every_runtime_reads() -> None:
    runtimes = [rt.parse_reference("containerd@2.2.1"), rt.parse_reference("podman@4.3.1")]
    assert rt.node_limit(runtimes) == "0.5.0"
    with pytest.raises(ConfigError, match="no container runtime found"):
        rt.node_limit([])
    with pytest.raises(ConfigError, match="no CDI support"):
        rt.node_limit([rt.parse_reference("containerd@1.6.20")])


# --- the CLI ------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    """The command line through main(), exit codes and all: (code, stdout + stderr)."""
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out + err


def _write(folder: Path, name: str, spec: Spec) -> Path:
    path = folder / name
    path.write_text(json.dumps(spec.to_wire()))
    return path


def test_validate_for_a_runtime_release(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    at_limit = _write(tmp_path, "a.json", _spec("0.5.0"))
    above = _write(tmp_path, "b.json", _spec("0.6.0"))
    code, out = _cli(capsys, "validate", "--for", "podman@4.3.1", at_limit)
    assert (code, out.strip()) == (0, f"{at_limit}: OK")
    code, out = _cli(capsys, "validate", "--for", "podman@4.3.1", above)
    assert code == 1
    assert out.startswith(f"{above}: cdiVersion: 0.6.0 is newer than podman 4.3.1 reads")
    # Without --for the same file is a valid spec.
    assert _cli(capsys, "validate", above)[0] == 0
    code, out = _cli(capsys, "validate", "--for", "docker@25.0.0", above)
    assert (code, out.strip()) == (
        2,
        "error: unknown runtime 'docker', known: containerd, cri-o, podman",
    )


CONFIG = """
vendor: example.com
classes:
  - name: gids
    match: {subsystem: block, kernel: "loop[0-7]"}
    containerEdits: {additionalGids: [44]}
  - name: plain
    match: {subsystem: block, kernel: "loop[0-7]"}
"""
RECORDS = json.dumps(
    [
        {
            "sys_path": "/sys/devices/virtual/block/loop0",
            "subsystem": "block",
            "kernel": "loop0",
            "devnode": "/dev/loop0",
            "major": 7,
            "minor": 0,
        }
    ]
)


@pytest.fixture
def agent_files(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    records = tmp_path / "records.json"
    records.write_text(RECORDS)
    return config, records


def test_write_pins_runtime_and_refuses_only_the_class_that_needs_more(
    tmp_path: Path, agent_files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config, records = agent_files
    out = tmp_path / "cdi"
    code, output = _cli(
        capsys, "write", "--config", config, "--records", records, "--spec-dir", out,
        "--cdi-version", "runtime", "--runtime", "podman@4.3.1",
    )  # fmt: skip
    assert code == 1, output
    assert "additionalGids needs cdiVersion 0.7.0 or newer, the target is 0.5.0" in output
    assert not (out / "example.com-gids.json").exists()
    written = json.loads((out / "example.com-plain.json").read_text())
    assert written["cdiVersion"] == "0.5.0"  # pinned to the runtime's limit, not the minimum


def test_render_runtime_pin_without_any_runtime_is_a_config_error(
    agent_files: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config, records = agent_files
    monkeypatch.setenv("PATH", "/nonexistent")
    # Nor one answering on a CRI socket (the defaults may exist on the machine).
    monkeypatch.setenv("CDI_GEN_CRI_SOCKET", "/nonexistent/cri.sock")
    code, out = _cli(
        capsys, "render", "--class", "plain", "--config", config, "--records", records,
        "--cdi-version", "runtime",
    )  # fmt: skip
    assert code == 2
    assert out.startswith("error: cdiVersion runtime: no container runtime found"), out


def test_doctor_fails_a_spec_the_runtime_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "records.json").write_text("[]")
    spec_dir = tmp_path / "run"
    spec_dir.mkdir()
    above = _write(spec_dir, "other.com-x.json", _spec("0.7.0", additionalGids=[44]))
    _write(spec_dir, "other.com-y.json", _spec("0.5.0"))
    code, output = _cli(
        capsys, "doctor", "--spec-dir", spec_dir, "--runtime-spec-dir", spec_dir,
        "--runtime", "podman@4.3.1", "--containerd-config", tmp_path / "none.toml",
        "--crio-config", tmp_path / "none.conf", "--device-plugin-dir", tmp_path,
        "--records", tmp_path / "records.json",
    )  # fmt: skip
    lines = output.splitlines()
    assert "OK   runtime: podman 4.3.1 (reads cdiVersion <= 0.5.0; " in "\n".join(lines)
    fails = [line for line in lines if line.startswith("FAIL cdiVersion:")]
    assert len(fails) == 1, output
    assert fails[0].startswith(f"FAIL cdiVersion: {above}: 0.7.0 is newer than podman 4.3.1")
    assert "additionalGids" in fails[0] and "--cdi-version runtime" in fails[0]
    assert code == 1


def test_a_cri_answer_maps_onto_the_table_like_a_reference() -> None:
    for name, version in (("containerd", "v2.3.7"), ("cri-o", "1.36.3"), ("crio", "1.30.0")):
        runtime = rt.from_cri(name, version, "/run/x.sock")
        assert runtime.limit == rt.parse_reference(f"{name}@{version}").limit
        assert runtime.source.endswith("; version from the CRI at /run/x.sock")


@pytest.mark.parametrize("version", ["x" * 5000, "\x1b[2J" * 100])
def test_a_version_from_outside_is_quoted_short(version: str) -> None:
    """A version comes from a socket or a binary's output: the line quotes it cut short."""
    with pytest.raises(ConfigError) as info:
        rt.from_cri("containerd", version, "/run/x.sock")
    assert len(str(info.value)) < 200 and "\x1b" not in str(info.value)


def test_node_limit_names_where_else_it_looked() -> None:
    with pytest.raises(ConfigError) as info:
        rt.node_limit([], ["no CRI socket at /run/a.sock"])
    assert str(info.value) == (
        "cdiVersion runtime: no container runtime found (containerd, crio, podman on PATH; no "
        "CRI socket at /run/a.sock); name it with --runtime NAME@VERSION, e.g. containerd@1.7.24"
    )
