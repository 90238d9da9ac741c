"""doctor against containerd and CRI-O configs of every format, and spec folder checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdi_gen.cdi import writer
from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.cdi.codec import dump_document
from cdi_gen.doctor.check import Check
from cdi_gen.doctor.runtimeconfigs import check_containerd, check_crio
from cdi_gen.doctor.specfolders import check_spec_dirs

RUN = Path("/var/run/cdi")

V2_ON = """version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
"""
V2_OFF = """version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = false
"""
V2_UNSET = """version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "pause"
"""
V2_OTHER_DIRS = """version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi"]
"""
V3_DEFAULT = """version = 3
[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ["/etc/cdi", "/run/cdi"]
"""
V3_OFF = """version = 3
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = false
"""
V1_ON = """[plugins.cri]
  enable_cdi = true
"""


def _statuses(checks: list[Check]) -> list[str]:
    return [c.status for c in checks]


@pytest.mark.parametrize(
    ("text", "version", "expected", "needle"),
    [
        (V2_ON, (1, 7, 24), ["OK", "OK"], "CDI enabled"),
        (V2_OFF, (1, 7, 24), ["FAIL", "OK"], "enable_cdi = false"),
        (V2_UNSET, (1, 7, 24), ["FAIL", "OK"], "enable_cdi is unset"),
        (V2_OTHER_DIRS, (1, 7, 24), ["OK", "FAIL"], "do not include /var/run/cdi"),
        (V3_DEFAULT, (2, 1, 0), ["OK", "OK"], "CDI enabled"),
        (V3_OFF, (2, 1, 0), ["FAIL", "OK"], "silently ignored"),
        (V1_ON, None, ["OK", "OK"], "[plugins.cri]"),
        (V2_ON, (1, 7, 0), ["WARN", "OK", "OK"], "annotations"),
    ],
    ids=["1.7-on", "1.7-off", "1.7-unset", "1.7-dirs", "2.x-default", "2.x-off", "v1", "1.7.0"],
)
def test_containerd_configs(
    tmp_path: Path,
    text: str,
    version: tuple[int, int, int] | None,
    expected: list[str],
    needle: str,
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    checks = check_containerd(config, RUN, version)
    assert _statuses(checks) == expected
    assert any(needle in c.line() for c in checks), [c.line() for c in checks]


def test_containerd_without_config(tmp_path: Path) -> None:
    missing = tmp_path / "none.toml"
    assert _statuses(check_containerd(missing, RUN, (1, 7, 24))) == ["FAIL"]
    assert _statuses(check_containerd(missing, RUN, (2, 0, 5))) == ["OK"]
    assert _statuses(check_containerd(missing, RUN, (1, 6, 20))) == ["FAIL"]
    assert _statuses(check_containerd(missing, RUN, None)) == ["WARN"]


def test_crio_dropins(tmp_path: Path) -> None:
    (tmp_path / "crio.conf.d").mkdir()
    (tmp_path / "crio.conf").write_text('[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi"]\n')
    assert _statuses(check_crio([tmp_path / "crio.conf"], RUN)) == ["FAIL"]
    (tmp_path / "crio.conf.d" / "10-cdi.conf").write_text(
        '[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]\n'
    )
    checks = check_crio([tmp_path / "crio.conf", tmp_path / "crio.conf.d"], RUN)
    assert _statuses(checks) == ["OK"]


def test_spec_dirs_report_conflicts_shadowing_and_our_broken_files(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    entry = build_entry("loop200", {"deviceNodes": [{"path": "/dev/loop200"}]})
    data = dump_document(assemble("example.com/loop", [entry]))
    writer.write_bytes(run, "example.com", "loop", data)
    etc.mkdir()
    (etc / "old.json").write_bytes((run / "example.com-loop.json").read_bytes())
    (run / "example.com-broken.json").write_text("{")
    lines = [c.line() for c in check_spec_dirs([etc, run], run, "example.com")]
    assert any(line.startswith("WARN shadowing: example.com/loop=loop200") for line in lines)
    assert any(line.startswith("FAIL spec files:") and "broken" in line for line in lines)


def test_files_that_crash_old_runtimes_are_a_failure(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "other-null.json").write_text(
        '{"cdiVersion": "0.3.0", "kind": "other.com/bb", "devices": [{"name": "x", '
        '"containerEdits": {"deviceNodes": [null]}}]}'
    )
    (run / "other-short.json").write_text(
        '{"cdiVersion": "0.3.0", "kind": "o/bb", "devices": [{"name": "x", '
        '"containerEdits": {"env": ["A=1"]}}]}'
    )
    lines = [c.line() for c in check_spec_dirs([run], run, "example.com")]
    crashes = [line for line in lines if "crashes podman" in line]
    assert len(crashes) == 2 and all(line.startswith("FAIL") for line in crashes)


def test_dra_classes_need_an_api_server_config(tmp_path: Path) -> None:
    from cdi_gen.config.loader import parse_config
    from cdi_gen.config.settings import load_settings
    from cdi_gen.doctor.kubernetes import check_dra

    config = parse_config(
        {"vendor": "example.com", "classes": [{"name": "fpga", "match": {"subsystem": "x"}}]},
        "t.yaml",
    )
    settings = load_settings(
        {"kubeconfig": str(tmp_path / "none"), "plugins_registry_dir": str(tmp_path / "reg")}
    )
    assert check_dra(settings, config) == []  # no class uses DRA: nothing to check
    dra = config.model_copy(
        update={"classes": [c.model_copy(update={"api": "dra"}) for c in config.classes]}
    )
    registry, api = check_dra(settings, dra)
    assert registry.status == "WARN" and "no kubelet plugin watcher" in registry.message
    assert api.status == "FAIL" and repr(str(tmp_path / "none")) in api.message
    assert "classes fpga use DRA" in api.message

    (tmp_path / "reg").mkdir()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    settings = load_settings(
        {
            "kubeconfig": str(kubeconfig),
            "plugins_registry_dir": str(tmp_path / "reg"),
            "node_name": "n1",
        }
    )
    registry, api = check_dra(settings, dra)
    assert (registry.status, api.status) == ("OK", "OK")
    assert "node n1's ResourceSlices at https://10.0.0.1:6443" in api.message
