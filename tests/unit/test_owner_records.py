"""Forged owner records: cdi-gen only ever replaces or removes its own files in the spec folder.

The reproduction of issue 11 defect 1: someone who can write the spec folder plants an owner
record whose class climbs out through a symlinked subfolder, with the hash of a file elsewhere.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from cdi_gen.cdi import ownerrecords, writer
from cdi_gen.errors import CdiGenError

CONFIG = """\
vendor: example.com
classes:
  - name: loop
    match: {subsystem: block, kernel: "loop2*"}
"""
RECORDS = [
    {
        "sys_path": "/sys/devices/virtual/block/loop200",
        "subsystem": "block",
        "devnode": "/dev/loop200",
        "devtype": "disk",
        "major": 7,
        "minor": 200,
    }
]


def plant(tmp_path: Path) -> tuple[Path, Path]:
    """A spec folder prepared as in the report; returns (spec folder, the victim file)."""
    spec_dir = tmp_path / "cdi"
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "a" / "b").mkdir(parents=True)
    (elsewhere / "victim").mkdir()
    victim = elsewhere / "victim" / "important.json"
    victim.write_bytes(b'{"important": true}\n')
    digest = hashlib.sha256(victim.read_bytes()).hexdigest()
    (spec_dir / "p" / "q").mkdir(parents=True)
    (spec_dir / "victim").mkdir()
    # <spec>/example.com-x/../../victim/important.json is the victim,
    # <spec>/.example.com-x/../../victim/important.json.cdi-gen-owner a record in the folder.
    os.symlink(elsewhere / "a" / "b", spec_dir / "example.com-x")
    os.symlink(spec_dir / "p" / "q", spec_dir / ".example.com-x")
    record = {
        "vendor": "example.com",
        "class": "x/../../victim/important",
        "file": "planted",
        "sha256": [digest],
    }
    (spec_dir / "victim" / "important.json.cdi-gen-owner").write_bytes(orjson.dumps(record))
    (spec_dir / ".planted.cdi-gen-owner").write_bytes(orjson.dumps(record))
    return spec_dir, victim


def test_forged_record_is_not_listed_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec_dir, victim = plant(tmp_path)
    with caplog.at_level(logging.WARNING, logger="cdi_gen.cdi.writer"):
        assert ownerrecords.owned_specs(spec_dir) == []
    assert victim.exists()
    assert any(".planted.cdi-gen-owner" in r.getMessage() for r in caplog.records)


def test_remove_with_a_climbing_class_touches_nothing(tmp_path: Path) -> None:
    spec_dir, victim = plant(tmp_path)
    with pytest.raises(CdiGenError, match="class"):
        writer.remove_spec(spec_dir, "example.com", "x/../../victim/important")
    assert victim.exists()
    assert ownerrecords.owned_specs(spec_dir) == []


def test_cli_write_leaves_the_file_elsewhere(tmp_path: Path) -> None:
    spec_dir, victim = plant(tmp_path)
    (tmp_path / "config.yaml").write_text(CONFIG)
    (tmp_path / "records.json").write_bytes(orjson.dumps(RECORDS))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cdi_gen",
            "write",
            "--config",
            str(tmp_path / "config.yaml"),
            "--records",
            str(tmp_path / "records.json"),
            "--spec-dir",
            str(spec_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert victim.read_bytes() == b'{"important": true}\n'
    assert (spec_dir / "example.com-loop.json").is_file()


def test_agent_startup_leaves_the_file_elsewhere(tmp_path: Path) -> None:
    from cdi_gen.agent.agent import Agent
    from cdi_gen.cdi.codec import load_yaml
    from cdi_gen.config.loader import parse_config
    from cdi_gen.config.settings import Settings

    spec_dir, victim = plant(tmp_path)
    agent = Agent(
        parse_config(load_yaml(CONFIG)), Settings(spec_dir=spec_dir, metrics_address=None)
    )
    agent._remove_stale_specs()
    assert victim.exists()


def test_record_whose_name_does_not_match_is_ignored(tmp_path: Path) -> None:
    # A valid vendor/class in a record stored under another file name is not ours either:
    # the file name is derived from the record, never the other way round.
    spec = tmp_path / "example.com-other.json"
    spec.write_bytes(b"{}")
    record = {
        "vendor": "example.com",
        "class": "other",
        "file": "example.com-other.json",
        "sha256": [hashlib.sha256(b"{}").hexdigest()],
    }
    (tmp_path / ".example.com-loop.json.cdi-gen-owner").write_bytes(orjson.dumps(record))
    assert ownerrecords.owned_specs(tmp_path) == []
    assert spec.exists()


def test_spec_name_that_is_a_link_or_folder_is_never_followed(tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    outside = tmp_path / "outside.json"
    outside.write_bytes(b"{}")
    os.symlink(outside, spec_dir / "example.com-loop.json")
    (spec_dir / ".example.com-loop.json.cdi-gen-owner").write_bytes(
        orjson.dumps(
            {
                "vendor": "example.com",
                "class": "loop",
                "file": "example.com-loop.json",
                "sha256": [hashlib.sha256(b"{}").hexdigest()],
            }
        )
    )
    assert ownerrecords.owned_specs(spec_dir) == []
    assert writer.remove_spec(spec_dir, "example.com", "loop") is False
    assert outside.exists() and (spec_dir / "example.com-loop.json").is_symlink()
