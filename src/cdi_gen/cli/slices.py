"""``cdi-gen slices``: the ResourceSlices this node would publish through DRA."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cdi_gen.cli import options
from cdi_gen.cli.inputs import discover_devices, warn_skipped


@click.command()
@options.CONFIG_FILE
@options.RECORDS
@click.option("--node", "node", help="The node's name (pool and nodeName); default: host name.")
@click.option("--driver", "driver", help="The DRA driver name; default: the config's vendor.")
@click.option(
    "--dra-only",
    is_flag=True,
    help="Only the classes whose config says `api: dra` (default: every class, as if all "
    "were served through DRA).",
)
def slices(
    config_path: Path | None,
    records_path: Path | None,
    node: str | None,
    driver: str | None,
    dra_only: bool,
) -> None:
    """Print the ResourceSlices (YAML documents) that `cdi-gen run` would publish for the
    devices found now, without an API server: a preview of the DRA view of each class.
    Generation 1, and no owner reference (the Node's UID comes from the API server)."""
    import socket

    import yaml

    from cdi_gen.apiserver.slices import build_slices
    from cdi_gen.discovery.pool import pool_devices
    from cdi_gen.discovery.sharing import expand_advertised, expand_devices

    node = node if node is not None else socket.gethostname().lower()
    discovery = discover_devices(config_path, (), records_path)
    config = discovery.config
    driver = driver if driver is not None else config.vendor
    _check_name("--node", node)
    _check_name("--driver", driver)
    devices = []
    for cls in discovery.class_names:
        cls_config = discovery.config_of(cls)
        if dra_only and cls_config.api != "dra":
            continue
        replicas = cls_config.sharing.replicas
        discovered, advertised = discovery.devices(cls), discovery.advertised(cls)
        if replicas > 1:  # as the agent does (expand_change): slots only when shared
            discovered, _ = expand_devices(discovered, replicas)
            advertised = expand_advertised(advertised, replicas)
        devices += pool_devices(
            config.vendor, cls_config, advertised, {d.name: d for d in discovered}
        )
        warn_skipped(discovery, cls)
    docs = build_slices(driver, node, devices, 1, node_uid=None)
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, width=1 << 16))


def _check_name(flag: str, value: str) -> None:
    from cdi_gen.errors import ConfigError, quote
    from cdi_gen.names import is_dns_subdomain

    if not is_dns_subdomain(value):
        raise ConfigError(
            f"{flag} {quote(value)}: must be a lowercase DNS subdomain (a-z 0-9 - .), "
            "at most 253 characters"
        )
