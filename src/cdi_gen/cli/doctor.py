"""``cdi-gen doctor``: parse the flags, run the node checks, print one line per check."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from cdi_gen.cli import options
from cdi_gen.paths import CONTAINERD_CONFIG


@click.command()
@options.CONFIG
@options.SPEC_DIR
@options.RUNTIME_SPEC_DIRS
@click.option(
    "--containerd-config",
    type=click.Path(path_type=Path, dir_okay=False),
    default=str(CONTAINERD_CONFIG),
    show_default=True,
)
@click.option(
    "--containerd-version",
    help="Assume this containerd version (X.Y.Z) instead of asking `containerd --version`.",
)
@options.RUNTIME
@options.CRI_SOCKET
@click.option(
    "--crio-config",
    "crio_configs",
    multiple=True,
    type=click.Path(path_type=Path),
    help="CRI-O config file or drop-in folder (repeatable). Default: /etc/crio/crio.conf and "
    "/etc/crio/crio.conf.d.",
)
@options.DEVICE_PLUGIN_DIR
@options.RECORDS
def doctor(
    *,
    containerd_config: Path,
    containerd_version: str | None,
    crio_configs: tuple[Path, ...],
    records_path: Path | None,
    **flags: Any,
) -> None:
    """Check this node: runtime CDI config and the cdiVersion it reads, spec folders, kubelet,
    udev, class matches.

    One line per check (OK, WARN or FAIL with what to do); exit 1 if any check FAILs.
    """
    from cdi_gen.cli.inputs import discover_devices
    from cdi_gen.config.settings import load_settings
    from cdi_gen.doctor.diagnosis import diagnose

    settings = load_settings(options.flags_of(flags))
    # A class pinned to 'runtime' is resolved as the agent resolves it (in a pod: by the CRI).
    discovery = discover_devices(
        settings.paths.config,
        (),
        records_path,
        runtime_refs=settings.runtimes.refs,
        cri_sockets=settings.runtimes.cri_sockets,
    )
    checks = diagnose(
        settings,
        discovery,
        containerd_config=containerd_config,
        containerd_version=containerd_version,
        crio_configs=crio_configs,
    )
    for check in checks:
        click.echo(check.line())
    failed = sum(1 for c in checks if c.status == "FAIL")
    warned = sum(1 for c in checks if c.status == "WARN")
    click.echo(f"{len(checks)} checks: {failed} FAIL, {warned} WARN")
    if failed:
        sys.exit(1)
