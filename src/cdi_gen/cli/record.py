"""``cdi-gen record``: this machine's udev devices as a JSON recording that ``--records``
reads (the form is documented in :mod:`cdi_gen.sources.records`)."""

from __future__ import annotations

from pathlib import Path

import click

from cdi_gen.cli import options


@click.command()
@options.CONFIG_FILE
@click.option(
    "--subsystem",
    "subsystems",
    multiple=True,
    help="Only devices of this subsystem (repeatable). Default: every device with a node, "
    "and every network interface.",
)
@click.option(
    "--attribute",
    "attributes",
    multiple=True,
    help="Also read this sysfs attribute of every device (repeatable).",
)
@click.option(
    "--parent-attribute",
    "parent_attributes",
    multiple=True,
    help="Also read this sysfs attribute of every device and its parents, as ATTRS reads "
    "it (repeatable).",
)
@click.option(
    "--output", "-o", type=click.Path(path_type=Path, dir_okay=False), help="Default: stdout."
)
def record(
    *,
    config_path: Path | None,
    subsystems: tuple[str, ...],
    attributes: tuple[str, ...],
    parent_attributes: tuple[str, ...],
    output: Path | None,
) -> None:
    """Record this machine's udev devices as JSON for --records.

    Every device with a device node and every network interface, with its properties,
    parents, drivers, NUMA node and the sysfs attributes the config reads (rules, health
    checks, templates) plus those named here: the same reads as the agent and `discover`
    make, so `discover --records FILE` finds what `discover` finds here. Only named
    attributes are read, never all of them: some are megabytes, some block or have side
    effects. The header lists them, and a class reading another one is warned about where
    the recording is used.
    """
    from cdi_gen.cli.inputs import emit
    from cdi_gen.config.loader import load_config
    from cdi_gen.discovery.inventory import Discovery
    from cdi_gen.errors import DiscoveryError
    from cdi_gen.files import RECORDS_MAX_BYTES
    from cdi_gen.model import RecordWants
    from cdi_gen.sources.records import recording_to_json
    from cdi_gen.sources.udev import enumerate_records

    wants = Discovery(load_config(config_path)).wants
    # As Discovery.wants does: ATTRS reads the device itself too.
    wants = RecordWants(
        wants.attributes | set(attributes) | set(parent_attributes),
        wants.parent_attributes | set(parent_attributes),
    )
    records = enumerate_records(subsystems=subsystems or None, wants=wants)
    records.sort(key=lambda r: r.sys_path)
    data = recording_to_json(records, wants.attributes, wants.parent_attributes)
    if len(data) > RECORDS_MAX_BYTES:
        raise DiscoveryError(
            f"the recording of {len(records)} devices takes {len(data)} bytes, more than "
            f"--records reads ({RECORDS_MAX_BYTES}): narrow it with --subsystem"
        )
    emit(data, output)
    click.echo(f"recorded {len(records)} devices", err=True)
