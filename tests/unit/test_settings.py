"""The one settings model: flags over CDI_GEN_* variables over defaults, errors naming the
source of the bad value; the CLI's flags and help come from it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cdi_gen import paths
from cdi_gen.cli.main import COMMANDS, cli
from cdi_gen.config.settings import NAMES, load_settings
from cdi_gen.errors import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("CDI_GEN_"):
            monkeypatch.delenv(name)


def test_defaults() -> None:
    s = load_settings({})
    assert s.paths.spec_dir == paths.DYNAMIC_SPEC_DIR
    assert s.kubelet.device_plugin_dir == paths.DEVICE_PLUGIN_DIR
    assert s.metrics.address == ":9400" and s.kubelet.enabled and not s.cleanup_on_exit
    assert s.paths.for_runtime() == (paths.STATIC_SPEC_DIR, paths.DYNAMIC_SPEC_DIR)


def test_flag_over_variable_over_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDI_GEN_SPEC_DIR", "/from/env")
    monkeypatch.setenv("CDI_GEN_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("CDI_GEN_CLEANUP_ON_EXIT", "1")
    s = load_settings({"spec_dir": "/from/flag", "log_format": None, "runtime": ()})
    assert s.paths.spec_dir == Path("/from/flag")  # the flag wins
    assert s.logs.level == "debug"  # the variable, case-insensitive like the flag
    assert s.cleanup_on_exit is True
    assert s.logs.format == "text"  # neither: the default


def test_lists_come_space_separated_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDI_GEN_RUNTIME_SPEC_DIRS", "/etc/cdi /var/run/cdi /etc/cdi")
    monkeypatch.setenv("CDI_GEN_RUNTIME", "podman@4.3.1 containerd@1.7.0")
    s = load_settings({})
    # A folder named twice would conflict with itself and fail every Allocate: it is kept
    # once, at its last (highest-priority) place, as the runtimes' library ranks it.
    assert s.paths.runtime_spec_dirs == (Path("/var/run/cdi"), Path("/etc/cdi"))
    assert s.runtimes.refs == ("podman@4.3.1", "containerd@1.7.0")
    flagged = load_settings({"runtime_spec_dirs": (Path("/a"),)})
    assert flagged.paths.for_runtime() == (Path("/a"),)


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
    assert load_settings({"metrics_address": ""}).metrics.address is None
    monkeypatch.setenv("CDI_GEN_METRICS_ADDRESS", "")
    assert load_settings({}).metrics.address is None


@pytest.mark.parametrize("command", ["run", "doctor"])
def test_every_settings_flag_names_its_variable(command: str) -> None:
    """The help of `run` and `doctor` comes from the model: each flag shows its variable."""
    result = CliRunner().invoke(cli, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for field in ("config", "spec_dir", "runtime_spec_dirs", "device_plugin_dir", "runtime"):
        assert f"CDI_GEN_{field.upper()}" in result.output, field
    if command == "run":
        assert set(NAMES) - {"kubelet_socket", "retry_max_seconds"} <= {
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


def test_the_owner_daemonset_is_a_name_and_its_namespace_a_label(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the agent asks the API server about at exit (an uninstall takes its specs) goes
    into a URL path: refused, quoted, before the agent starts."""
    assert load_settings({}).cluster.daemonset is None  # nothing named: specs kept at every exit
    with pytest.raises(ConfigError) as info:
        load_settings({"daemonset": "../secrets"})
    assert str(info.value).startswith("--daemonset: '../secrets' is not a DNS subdomain")
    monkeypatch.setenv("CDI_GEN_DAEMONSET_NAMESPACE", "kube.system")
    with pytest.raises(ConfigError) as info:
        load_settings({"daemonset": "cdi-gen"})
    assert str(info.value).startswith(
        "CDI_GEN_DAEMONSET_NAMESPACE: 'kube.system' is not a namespace: a DNS label"
    ), str(info.value)
    monkeypatch.setenv("CDI_GEN_DAEMONSET_NAMESPACE", "kube-system")
    monkeypatch.setenv("CDI_GEN_DAEMONSET", "cdi-gen")
    settings = load_settings({})
    assert (settings.cluster.daemonset, settings.cluster.daemonset_namespace) == (
        "cdi-gen",
        "kube-system",
    )


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
    from cdi_gen.agent.agent import Agent

    with pytest.raises(ConfigError, match="longer than 63"):
        Agent(config, settings)
    # A shorter --dra-driver is the way out; a vendor that long is fine without DRA.
    assert load_settings({"dra_driver": "d" * 60 + ".io"}).driver_name(config) == "d" * 60 + ".io"
    plugins_only = config.model_copy(
        update={"classes": [c.model_copy(update={"api": "devicePlugin"}) for c in config.classes]}
    )
    assert Agent(plugins_only, settings).dra is None


# Issue 38, item 10: on a host named Bad_Host.Example the DRA agent named its pool and slices
# after "bad_host.example", which the API server refuses, and retried for ever.
BAD_HOST = "Bad_Host.Example"
NODE_RULE = (
    "is not a Kubernetes Node name: a DNS subdomain: at most 253 characters of lower-case "
    "letters, digits, '-' and '.', each dot-separated part starting and ending with a letter "
    "or digit"
)
BAD_HOST_LINE = (
    f"host name: 'Bad_Host.Example' (lower-cased and trimmed: 'bad_host.example') {NODE_RULE}; "
    "give the Node's name with --node-name (CDI_GEN_NODE_NAME)"
)


def _host(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: name)


def test_a_host_name_that_is_no_node_name_stops_a_dra_agent_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from cdi_gen.agent.agent import Agent

    _host(monkeypatch, BAD_HOST)
    base = {"spec_dir": tmp_path / "cdi", "state_dir": tmp_path / "state"}
    with pytest.raises(ConfigError) as info:
        load_settings(base).node()
    assert str(info.value) == BAD_HOST_LINE and info.value.exit_code == 2
    # The DRA agent is refused while it is built, before it serves or writes anything.
    dra = load_settings({**base, "api": "dra"})
    with pytest.raises(ConfigError) as info:
        Agent(dra.class_config(), dra)
    assert str(info.value) == BAD_HOST_LINE
    # Device plugins and host mode never use the node name: they start on such a host.
    plugins = load_settings({**base, "api": "devicePlugin"})
    assert Agent(plugins.class_config(), plugins).dra is None
    host_mode = load_settings({**base, "api": "dra", "no_kubelet": True})
    assert Agent(host_mode.class_config(), host_mode).dra is None
    # --node-name is the way out, the host name then not consulted.
    named = load_settings({**base, "api": "dra", "node_name": "node-1.example"})
    driver = Agent(named.class_config(), named).dra
    assert driver is not None and driver.node == "node-1.example"


@pytest.mark.parametrize(
    ("host", "node"),
    [
        (" Node-1.Example\n", "node-1.example"),  # the kubelet's TrimSpace and ToLower
        ("node-1", "node-1"),
        ("n" * 253, "n" * 253),  # the longest Node name
    ],
)
def test_the_host_name_is_lower_cased_and_trimmed_as_the_kubelet_does(
    monkeypatch: pytest.MonkeyPatch, host: str, node: str
) -> None:
    _host(monkeypatch, host)
    assert load_settings({}).node() == node


@pytest.mark.parametrize(
    ("host", "quoted"),
    [
        ("", "''"),
        ("-node", "'-node'"),
        ("node..1", "'node..1'"),
        ("node_1", "'node_1'"),
        ("n" * 254, "(254 long)"),  # quoted cut short, its length given
    ],
)
def test_every_host_name_that_is_no_node_name_is_refused_quoted(
    monkeypatch: pytest.MonkeyPatch, host: str, quoted: str
) -> None:
    _host(monkeypatch, host)
    with pytest.raises(ConfigError) as info:
        load_settings({}).node()
    line = str(info.value)
    assert line.startswith("host name: ") and quoted in line and NODE_RULE in line, line
    assert line.endswith("--node-name (CDI_GEN_NODE_NAME)") and "\n" not in line, line
    assert len(line) < 400, line


def test_a_node_name_given_that_is_no_node_name_is_refused_in_every_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A name given on purpose is judged when the settings load, whatever the run serves.
    rule = NODE_RULE.removeprefix("is ")
    with pytest.raises(ConfigError) as info:
        load_settings({"node_name": "Bad_Host", "api": "devicePlugin"})
    assert str(info.value) == f"--node-name: {rule} (got 'Bad_Host')"
    monkeypatch.setenv("CDI_GEN_NODE_NAME", "node-1.")
    with pytest.raises(ConfigError) as info:
        load_settings({})
    assert str(info.value) == f"CDI_GEN_NODE_NAME: {rule} (got 'node-1.')"


def test_the_longest_node_name_is_accepted_and_names_valid_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Node name is a valid pool name and ``nodeName``; the slice names
    ``<node>-<driver>-<index>`` are shortened with a hash (apiserver.slices) to stay DNS
    subdomains of at most 253 characters."""
    from cdi_gen.dra.plugin.slices import build_slices, slice_name
    from cdi_gen.names import is_dns_subdomain

    _host(monkeypatch, BAD_HOST)  # not consulted: the flag wins
    node = ("n" * 62 + ".") * 4 + "n"  # 253 characters, labels of 62
    assert load_settings({"node_name": node}).node() == node
    driver = "d" * 60 + ".io"  # the longest driver name
    (only,) = build_slices(driver, node, [], 1, node_uid=None)
    assert only["spec"]["pool"]["name"] == only["spec"]["nodeName"] == node
    for index in (0, 9, 10_000):
        name = slice_name(node, driver, index)
        assert is_dns_subdomain(name) and name.endswith(f"-{index}"), name


def test_run_with_dra_on_a_host_name_that_is_no_node_name_exits_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import logging

    from cdi_gen.cli.main import main

    _host(monkeypatch, BAD_HOST)
    # `run` sets up the process's logging before it builds the agent: put pytest's back.
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    args = ["run", "--api", "dra", "--spec-dir", str(tmp_path / "cdi")]
    args += ["--state-dir", str(tmp_path / "state"), "--metrics-address", ""]
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {BAD_HOST_LINE}"]
    assert not (tmp_path / "cdi").exists() and not (tmp_path / "state").exists()


def test_the_pod_uid_names_the_dra_sockets_and_is_refused_when_it_could_leave_the_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings({}).dra.pod_uid is None  # one agent per node: today's names
    monkeypatch.setenv("CDI_GEN_POD_UID", "6f1c7a52-0b1e-4c3e-9d55-1b2a3c4d5e6f")
    assert load_settings({}).dra.pod_uid == "6f1c7a52-0b1e-4c3e-9d55-1b2a3c4d5e6f"
    assert load_settings({"pod_uid": "from-flag"}).dra.pod_uid == "from-flag"
    with pytest.raises(ConfigError) as flag:
        load_settings({"pod_uid": "../x"})
    assert str(flag.value) == (
        "--pod-uid: not a pod UID: 1 to 128 letters, digits, '-' and '_' (got '../x')"
    )
    monkeypatch.setenv("CDI_GEN_POD_UID", "")
    with pytest.raises(ConfigError) as env:
        load_settings({})
    assert str(env.value) == "CDI_GEN_POD_UID is set but empty: give a folder or unset it"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_setting_flag_says_what_it_sets(command: str) -> None:
    # A flag's help is its setting's description: a setting without one printed only
    # ". Default: text." under --help.
    import click

    ctx = click.Context(cli, info_name="cdi-gen")
    cmd = cli.get_command(ctx, command)
    assert cmd is not None
    sub = click.Context(cmd, parent=ctx, info_name=command)
    for param in cmd.params:
        record = param.get_help_record(sub) if isinstance(param, click.Option) else None
        if record is not None:
            assert not record[1].startswith("."), f"{command} {record[0]}: {record[1]!r}"
