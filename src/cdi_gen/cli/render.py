"""``cdi-gen render``: the CDI spec of one class from the devices present now."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from cdi_gen.cli import options
from cdi_gen.cli.inputs import cri_lookup, discover_devices, emit_document, warn_skipped

if TYPE_CHECKING:
    from cdi_gen.cdi.codec import Format


@click.command()
@click.option("--vendor", help="CDI vendor / resource domain. Default: the config's vendor.")
@click.option("--class", "cls", required=True, help="The class to render.")
@options.CONFIG_FILE
@click.option(
    "--format", "fmt", type=click.Choice(["json", "yaml"]), default="json", show_default=True
)
@click.option(
    "--output", "-o", type=click.Path(path_type=Path, dir_okay=False), help="Default: stdout."
)
@click.option(
    "--cdi-version",
    help="Pin cdiVersion: X.Y.Z, or 'runtime' for the newest the node's container runtime "
    "reads (refused if the spec needs newer). Default: the class's pin, or the minimum the "
    "spec needs.",
)
@options.PIN_RUNTIME
@options.PIN_CRI_SOCKET
@options.RECORDS
def render(
    *,
    vendor: str | None,
    cls: str,
    config_path: Path | None,
    fmt: Format,
    output: Path | None,
    cdi_version: str | None,
    runtime_refs: tuple[str, ...],
    cri_sockets: tuple[str, ...],
    records_path: Path | None,
) -> None:
    """Render the CDI spec of one class from the devices present now."""
    from cdi_gen.config.models import AgentConfig
    from cdi_gen.config.settings import resolve_version
    from cdi_gen.errors import DiscoveryError

    sockets = cri_sockets or None
    pin = resolve_version(cdi_version, runtime_refs, "--cdi-version", cri_lookup(sockets))
    discovery = discover_devices(
        config_path,
        [cls],
        records_path,
        vendor,
        runtime_refs=runtime_refs,
        cri_sockets=sockets,
    )
    config: AgentConfig = discovery.config
    warn_skipped(discovery, cls)
    class_config = discovery.config_of(cls)
    if not discovery.devices(cls):
        rules = " | ".join(r.describe() for r in class_config.match)
        raise DiscoveryError(
            f"class {cls!r} ({config.vendor}/{cls}) has no device: nothing matches {rules}"
        )
    doc = discovery.document(cls, cdi_version=pin)
    assert doc is not None  # it has devices
    emit_document(doc, fmt=fmt, output=output)
