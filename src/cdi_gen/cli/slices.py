"""``cdi-gen slices``: the ResourceSlices this node would publish through DRA.

As the agent, it offers only the devices in their class's spec: a device left out of the
spec (skipped, invalid, or needing a newer cdiVersion than the pin or, unpinned, than the
node's known runtimes read) is left out of the slices too, named on stderr, and the command
exits 1 after printing the rest. It reads the agent's pins as `write` does, so that
`cdi-gen slices` in the agent's environment offers what the agent offers."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cdi_gen.cli import options
from cdi_gen.cli.inputs import (
    discover_devices,
    left_out_error,
    node_ceiling,
    warn_left_out,
    warn_skipped,
)


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
@click.option(
    "--by-capacity",
    is_flag=True,
    help="A shared class's device once, with a `shares` capacity, as the agent publishes it "
    "where the API server keeps allowMultipleAllocations (DRAConsumableCapacity); default: "
    "its N slots, which every API server takes.",
)
@options.PIN_CDI_VERSION
@options.PIN_RUNTIME
@options.PIN_CRI_SOCKET
def slices(
    *,
    config_path: Path | None,
    records_path: Path | None,
    node: str | None,
    driver: str | None,
    dra_only: bool,
    by_capacity: bool,
    cdi_version: str | None,
    runtime_refs: tuple[str, ...],
    cri_sockets: tuple[str, ...],
) -> None:
    """Print the ResourceSlices (YAML documents) that `cdi-gen run` would publish for the
    devices found now, without an API server: a preview of the DRA view of each class.
    Generation 1, and no owner reference (the Node's UID comes from the API server); a
    shared class in slots unless --by-capacity.
    A device left out of its class's spec is left out here too (a warning each, exit 1)."""
    import socket

    import yaml

    from cdi_gen.discovery.sharing import expand_advertised, expand_devices
    from cdi_gen.dra.driver.poolentries import pool_devices, shared_once
    from cdi_gen.dra.plugin.slices import build_slices
    from cdi_gen.errors import SpecError

    node = node if node is not None else socket.gethostname().lower()
    sockets = cri_sockets or None
    discovery = discover_devices(
        config_path,
        (),
        records_path,
        cdi_version=cdi_version,
        runtime_refs=runtime_refs,
        cri_sockets=sockets,
    )
    ceiling = node_ceiling(runtime_refs, sockets)
    config = discovery.config
    _check_name("--node", node)
    driver = _driver(driver, config.vendor)
    devices = []
    left = 0
    for cls in discovery.class_names:
        cls_config = discovery.config_of(cls)
        if dra_only and cls_config.api != "dra":
            continue
        left += warn_skipped(discovery, cls)
        replicas = cls_config.sharing.replicas
        discovered, advertised = discovery.devices(cls), discovery.advertised(cls)
        if replicas > 1:  # as the agent does (expand_change): slots only when shared
            discovered, _ = expand_devices(discovered, replicas)
            advertised = expand_advertised(advertised, replicas)
        # The agent publishes a device only once its entry is in the spec it wrote.
        try:
            spec = discovery.class_spec(cls, ceiling=ceiling)
        except SpecError as exc:  # no spec at all: the agent would publish none of them
            for line in str(exc).splitlines():
                click.echo(f"warning: class {cls!r}: no spec, no device offered: {line}", err=True)
            left += len(advertised)
            continue
        left += warn_left_out(cls, spec)
        out = {d.device for d in spec.left_out}
        pooled = pool_devices(
            config.vendor,
            cls_config,
            [d for d in advertised if d.id not in out],
            {d.name: d for d in discovered},
            classes=config.class_names,
        )
        devices += shared_once(pooled, classes=config.class_names) if by_capacity else pooled
    docs = build_slices(driver, node, devices, 1, node_uid=None)
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, width=1 << 16))
    if left:
        sys.stdout.flush()
        raise left_out_error(left, "the slices offer the others")


def _driver(given: str | None, vendor: str) -> str:
    """``--driver``, else the vendor, checked as a DRA driver name (ConfigError, exit 2)."""
    from cdi_gen.errors import ConfigError, InvalidNameError
    from cdi_gen.names import validate_driver_name

    driver = given if given is not None else vendor
    try:
        validate_driver_name(driver)
    except InvalidNameError as exc:
        where = "--driver" if given is not None else "vendor as the DRA driver name"
        hint = "" if given is not None else "; give --driver or a shorter vendor"
        raise ConfigError(f"{where}: {exc}{hint}") from None
    return driver


def _check_name(flag: str, value: str) -> None:
    from cdi_gen.errors import ConfigError, quote
    from cdi_gen.names import is_dns_subdomain

    if not is_dns_subdomain(value):
        raise ConfigError(
            f"{flag} {quote(value)}: must be a lowercase DNS subdomain (a-z 0-9 - .), "
            "at most 253 characters"
        )
