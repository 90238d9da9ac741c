"""``cdi-gen run``: parse the agent's flags into its settings and run it."""

from __future__ import annotations

from typing import Any

import click

from cdi_gen.cli import options


@click.command()
@options.CONFIG
@options.SPEC_DIR
@options.RUNTIME_SPEC_DIRS
@options.DEVICE_PLUGIN_DIR
@options.setting("udev_source", "--udev-source", type=click.Choice(["auto", "udev", "kernel"]))
@options.setting("metrics_address", "--metrics-address")
@options.setting("probe_socket", "--probe-socket", type=click.Path(dir_okay=False))
@options.setting("cdi_annotations", "--cdi-annotations", is_flag=True)
@options.setting("cleanup_on_exit", "--cleanup-on-exit", is_flag=True)
@options.setting("no_kubelet", "--no-kubelet", is_flag=True)
@options.setting("log_format", "--log-format", type=click.Choice(["text", "json"]))
@options.setting(
    "log_level",
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
)
@options.CDI_VERSION
@options.RUNTIME
@options.CRI_SOCKET
@options.API
@options.setting("dra_driver", "--dra-driver")
@options.setting("instance", "--instance")
@options.setting("plugins_registry_dir", "--plugins-registry-dir", type=click.Path(file_okay=False))
@options.setting("kubelet_plugins_dir", "--kubelet-plugins-dir", type=click.Path(file_okay=False))
@options.setting("state_dir", "--state-dir", type=click.Path(file_okay=False))
@options.setting("pod_resources_socket", "--pod-resources-socket", type=click.Path(dir_okay=False))
@options.KUBECONFIG
@options.NODE_NAME
@options.setting("pod_uid", "--pod-uid")
@options.setting("daemonset", "--daemonset")
@options.setting("daemonset_namespace", "--daemonset-namespace")
def run(**flags: Any) -> None:
    """The node agent: follow udev, keep spec files current, serve a device plugin per class.

    Runs until SIGTERM, SIGINT or SIGHUP, then removes its sockets (and, with
    --cleanup-on-exit or when its --daemonset is being uninstalled, its spec files) and
    exits 0.
    """
    import asyncio
    import functools

    from cdi_gen.kubelet import apply_grpc_experiments

    # First: grpc reads its settings once, when it loads, and this process will serve the
    # kubelet's plugins (a CRI socket asked for a "runtime" pin may load it earliest).
    apply_grpc_experiments()

    from cdi_gen.agent.agent import Agent
    from cdi_gen.cli.inputs import cri_lookup, node_ceiling
    from cdi_gen.config.settings import load_settings
    from cdi_gen.logs import setup_logging

    settings = load_settings(options.flags_of(flags))
    # Asked once, at start, for the pin and the ceiling: the runtime does not change under
    # a running agent.
    lookup = functools.cache(cri_lookup(settings.runtimes.cri_sockets))
    config = settings.class_config(lookup)
    ceiling = node_ceiling(settings.runtimes.refs, settings.runtimes.cri_sockets, lookup)
    setup_logging(settings.logs.format, settings.logs.level)
    asyncio.run(Agent(config, settings, ceiling=ceiling).run())


__all__ = ["run"]
