"""The containerd snippets in deploy/ are the ones the e2e daemon runs on.

The daemon's config is built from deploy/containerd/containerd-1.7-cdi.toml; these tests pin
that nothing but the folder list is replaced, that the file on disk the daemon was started with
says so too, and that the 2.x snippet states the same CDI settings in its own format.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from .config import CRI_2X, CRI_17, SNIPPET_2X, daemon_config, load_snippet, to_toml
from .daemon import Containerd

pytestmark = pytest.mark.e2e

DEFAULT_DIRS = ["/etc/cdi", "/var/run/cdi"]


def cdi_keys(table: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in table.items() if k in ("enable_cdi", "cdi_spec_dirs")}


def test_the_17_snippet_enables_cdi_on_the_default_folders() -> None:
    snippet = load_snippet()
    assert snippet["version"] == 2
    assert snippet["plugins"][CRI_17] == {"enable_cdi": True, "cdi_spec_dirs": DEFAULT_DIRS}


def test_the_2x_snippet_states_the_same_settings_in_config_version_3() -> None:
    snippet = load_snippet(SNIPPET_2X)
    assert snippet["version"] == 3
    assert snippet["plugins"] == {
        CRI_2X: cdi_keys(load_snippet()["plugins"][CRI_17]),
    }


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
