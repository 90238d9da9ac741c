"""``cdi-gen render``: the CDI spec of one class from the devices present now, built as the
agent builds it: a device the agent would leave out is left out, named on stderr, and the
command exits 1 after printing the rest."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from cdi_gen.cli import options
from cdi_gen.cli.inputs import (
    cri_lookup,
    discover_devices,
    emit_document,
    hint_links,
    left_out_error,
    node_ceiling,
    warn_left_out,
    warn_missing_paths,
    warn_skipped,
)

if TYPE_CHECKING:
    from cdi_gen.cdi.codec import Format
    from cdi_gen.model import DeviceRecord


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
    """Render the CDI spec of one class from the devices present now.

    A device left out (skipped, invalid, or needing a newer cdiVersion than the pin or,
    unpinned, than the node's known runtimes read) gets a warning line naming the field and
    the rule; the spec holds the others, and the exit status is 1. A required host path of
    the extra deviceNodes or mounts missing here is a warning line (see warn_missing_paths).
    """
    from cdi_gen.config.loader import resolve_version
    from cdi_gen.config.models import AgentConfig
    from cdi_gen.errors import DiscoveryError

    sockets = cri_sockets or None
    pin = resolve_version(cdi_version, runtime_refs, "--cdi-version", cri_lookup(sockets))
    records: list[DeviceRecord] = []
    discovery = discover_devices(
        config_path,
        [cls],
        records_path,
        vendor,
        runtime_refs=runtime_refs,
        cri_sockets=sockets,
        seen=records,
    )
    config: AgentConfig = discovery.config
    kind = f"{config.vendor}/{cls}"
    skipped = warn_skipped(discovery, cls)
    class_config = discovery.config_of(cls)
    if not discovery.devices(cls):
        if skipped:
            raise left_out_error(skipped, f"no device of {kind} is left to render")
        hint_links(discovery, cls, records)
        rules = " | ".join(r.describe() for r in class_config.match)
        raise DiscoveryError(f"class {cls!r} ({kind}) has no device: nothing matches {rules}")
    warn_missing_paths(discovery, cls)
    # The agent's path: a device it would leave out is left out here, named on stderr (the
    # node's runtimes are this machine's, also with --records).
    spec = discovery.class_spec(cls, cdi_version=pin, ceiling=node_ceiling(runtime_refs, sockets))
    left = skipped + warn_left_out(cls, spec)
    if spec.document is None:
        raise left_out_error(left, f"no device of {kind} is left to render")
    emit_document(spec.document, fmt=fmt, output=output)
    if left:
        raise left_out_error(left, "the spec holds the others")
