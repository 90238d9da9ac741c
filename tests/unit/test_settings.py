"""The one settings model: flags over CDI_GEN_* variables over defaults, errors naming the
source of the bad value; the CLI's flags and help come from it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cdi_gen import paths
from cdi_gen.cli.main import cli
from cdi_gen.config.settings import Settings, load_settings
from cdi_gen.errors import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("CDI_GEN_"):
            monkeypatch.delenv(name)


def test_defaults() -> None:
    s = load_settings({})
    assert s.spec_dir == paths.DYNAMIC_SPEC_DIR
    assert s.device_plugin_dir == paths.DEVICE_PLUGIN_DIR
    assert s.metrics_address == ":9400" and s.kubelet and not s.cleanup_on_exit
    assert s.spec_dirs_for_runtime() == (paths.STATIC_SPEC_DIR, paths.DYNAMIC_SPEC_DIR)


def test_flag_over_variable_over_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDI_GEN_SPEC_DIR", "/from/env")
    monkeypatch.setenv("CDI_GEN_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("CDI_GEN_CLEANUP_ON_EXIT", "1")
    s = load_settings({"spec_dir": "/from/flag", "log_format": None, "runtime": ()})
    assert s.spec_dir == Path("/from/flag")  # the flag wins
    assert s.log_level == "debug"  # the variable, case-insensitive like the flag
    assert s.cleanup_on_exit is True
    assert s.log_format == "text"  # neither: the default


def test_lists_come_space_separated_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDI_GEN_RUNTIME_SPEC_DIRS", "/etc/cdi /var/run/cdi /etc/cdi")
    monkeypatch.setenv("CDI_GEN_RUNTIME", "podman@4.3.1 containerd@1.7.0")
    s = load_settings({})
    # A folder named twice would conflict with itself and fail every Allocate: it is kept
    # once, at its last (highest-priority) place, as the runtimes' library ranks it.
    assert s.runtime_spec_dirs == (Path("/var/run/cdi"), Path("/etc/cdi"))
    assert s.runtime == ("podman@4.3.1", "containerd@1.7.0")
    flagged = load_settings({"runtime_spec_dirs": (Path("/a"),)})
    assert flagged.spec_dirs_for_runtime() == (Path("/a"),)


def test_an_empty_folder_is_an_error_naming_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as flag:
        load_settings({"spec_dir": ""})
    assert str(flag.value) == "--spec-dir: an empty path is not a folder"
    monkeypatch.setenv("CDI_GEN_DEVICE_PLUGIN_DIR", "")
    with pytest.raises(ConfigError) as env:
        load_settings({})
    assert str(env.value) == (
        "CDI_GEN_DEVICE_PLUGIN_DIR is set but empty: give a folder or unset it"
    )


def test_bad_values_name_the_flag_or_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as flag:
        load_settings({"metrics_address": "nowhere"})
    assert str(flag.value).startswith("--metrics-address: ")
    assert "'nowhere'" in str(flag.value)
    monkeypatch.setenv("CDI_GEN_UDEV_SOURCE", "netlink")
    with pytest.raises(ConfigError) as env:
        load_settings({})
    assert str(env.value).startswith("CDI_GEN_UDEV_SOURCE: ")
    assert "'netlink'" in str(env.value)


def test_an_empty_metrics_address_disables_the_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings({"metrics_address": ""}).metrics_address is None
    monkeypatch.setenv("CDI_GEN_METRICS_ADDRESS", "")
    assert load_settings({}).metrics_address is None


@pytest.mark.parametrize("command", ["run", "doctor"])
def test_every_settings_flag_names_its_variable(command: str) -> None:
    """The help of `run` and `doctor` comes from the model: each flag shows its variable."""
    result = CliRunner().invoke(cli, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for field in ("config", "spec_dir", "runtime_spec_dirs", "device_plugin_dir", "runtime"):
        assert f"CDI_GEN_{field.upper()}" in result.output, field
    if command == "run":
        assert set(Settings.model_fields) - {"kubelet_socket", "retry_max_seconds"} <= {
            p.name
            for p in cli.get_command(None, "run").params  # type: ignore[union-attr]
        }


def test_the_node_api_overrides_every_class(monkeypatch: pytest.MonkeyPatch) -> None:
    assert {c.api for c in load_settings({}).class_config().classes} == {"devicePlugin"}
    monkeypatch.setenv("CDI_GEN_API", "dra")
    settings = load_settings({})
    config = settings.class_config()
    assert {c.api for c in config.classes} == {"dra"}
    assert settings.driver_name(config) == config.vendor
    assert load_settings({"dra_driver": "gpu.example.org"}).driver_name(config) == (
        "gpu.example.org"
    )


def test_driver_and_node_names_must_be_dns_subdomains(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"dra_driver": "Not_A_Domain"})
    assert "--dra-driver" in str(info.value) and "'Not_A_Domain'" in str(info.value)
    monkeypatch.setenv("CDI_GEN_NODE_NAME", "node 1")
    with pytest.raises(ConfigError) as info:
        load_settings({})
    assert "CDI_GEN_NODE_NAME" in str(info.value) and "DNS subdomain" in str(info.value)


LONG_DRIVER = "d" * 61 + ".io"  # a DNS subdomain of 64 characters


def test_a_driver_name_over_63_characters_stops_the_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Issue 26, item 12: the API server refuses every slice of such a driver (422), so the
    # agent must not start with one, whether it comes from a flag, a variable or the vendor.
    with pytest.raises(ConfigError) as info:
        load_settings({"dra_driver": LONG_DRIVER})
    assert "--dra-driver" in str(info.value) and "longer than 63 characters" in str(info.value)
    monkeypatch.setenv("CDI_GEN_DRA_DRIVER", LONG_DRIVER)
    with pytest.raises(ConfigError, match=r"CDI_GEN_DRA_DRIVER: .*longer than 63"):
        load_settings({})
    monkeypatch.delenv("CDI_GEN_DRA_DRIVER")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(
        f"vendor: {LONG_DRIVER}\nclasses: [{{name: loop, match: {{subsystem: block}}, api: dra}}]\n"
    )
    settings = load_settings({"config": config_file, "spec_dir": tmp_path / "cdi"})
    config = settings.class_config()
    with pytest.raises(ConfigError) as info:
        settings.driver_name(config)
    assert "vendor as the DRA driver name" in str(info.value)
    assert "--dra-driver" in str(info.value) and info.value.exit_code == 2
    # The agent is refused while it is built, before it serves or writes anything.
    from cdi_gen.agent import Agent

    with pytest.raises(ConfigError, match="longer than 63"):
        Agent(config, settings)
    # A shorter --dra-driver is the way out; a vendor that long is fine without DRA.
    assert load_settings({"dra_driver": "d" * 60 + ".io"}).driver_name(config) == "d" * 60 + ".io"
    plugins_only = config.model_copy(
        update={"classes": [c.model_copy(update={"api": "devicePlugin"}) for c in config.classes]}
    )
    assert Agent(plugins_only, settings).dra is None
