"""The containerd snippets in deploy/ are the ones the e2e daemon runs on.

The daemon's config is built from deploy/containerd/containerd-1.7-cdi.toml; these tests pin
that nothing but the folder list is replaced, that the file on disk the daemon was started with
says so too; and that the 2.x snippet, on which the cluster lane's containerd 2.3 config is
built the same way, states the same folders and leaves CDI at its default.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from .config import (
    CRI_2X,
    CRI_17,
    SNIPPET_2X,
    daemon_config,
    daemon_config_v4,
    load_snippet,
    to_toml,
)
from .daemon import Containerd

pytestmark = pytest.mark.e2e

DEFAULT_DIRS = ["/etc/cdi", "/var/run/cdi"]


def cdi_keys(table: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in table.items() if k in ("enable_cdi", "cdi_spec_dirs")}


def test_the_17_snippet_enables_cdi_on_the_default_folders() -> None:
    snippet = load_snippet()
    assert snippet["version"] == 2
    assert snippet["plugins"][CRI_17] == {"enable_cdi": True, "cdi_spec_dirs": DEFAULT_DIRS}


def test_the_2x_snippet_states_the_folders_and_leaves_cdi_at_its_default() -> None:
    """What the current cluster lane runs containerd 2.3 on (config version 4): the 1.7
    snippet's folders, and no ``enable_cdi`` (on by default in 2.x, deprecated in 2.3)."""
    snippet = load_snippet(SNIPPET_2X)
    assert snippet["version"] == 4
    assert snippet["plugins"] == {
        CRI_2X: {"cdi_spec_dirs": load_snippet()["plugins"][CRI_17]["cdi_spec_dirs"]},
    }


def test_the_23_daemon_config_is_the_2x_snippet_with_only_the_folders_replaced(
    tmp_path: Path,
) -> None:
    folders = [tmp_path / "a", tmp_path / "b"]
    config = daemon_config_v4(tmp_path, folders, "img")
    snippet = load_snippet(SNIPPET_2X)
    assert config["version"] == snippet["version"]
    cri = config["plugins"][CRI_2X]
    assert "enable_cdi" not in cri
    assert cri["cdi_spec_dirs"] == [str(f) for f in folders]
    assert tomllib.loads(to_toml(config)) == config


def test_the_daemon_config_is_the_snippet_with_only_the_folders_replaced(tmp_path: Path) -> None:
    folders = [tmp_path / "a", tmp_path / "b"]
    config = daemon_config(tmp_path, folders, "img")
    snippet = load_snippet()

    assert config["version"] == snippet["version"]
    cri = config["plugins"][CRI_17]
    assert cri["enable_cdi"] is snippet["plugins"][CRI_17]["enable_cdi"]
    assert cri["cdi_spec_dirs"] == [str(f) for f in folders]
    assert tomllib.loads(to_toml(config)) == config


def test_the_running_daemon_was_started_from_the_snippet(containerd: Containerd) -> None:
    on_disk = tomllib.loads(containerd.config_path.read_text())
    cri = on_disk["plugins"][CRI_17]
    expected = dict(load_snippet()["plugins"][CRI_17])
    expected["cdi_spec_dirs"] = [str(d) for d in containerd.spec_dirs]
    assert cdi_keys(cri) == expected
    assert on_disk["version"] == load_snippet()["version"]
