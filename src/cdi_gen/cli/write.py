"""``cdi-gen write``: one-shot host mode, every class's spec written or removed."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from cdi_gen import paths
from cdi_gen.cli import options

if TYPE_CHECKING:
    from cdi_gen.discovery.spec import ClassSpec


@click.command()
@options.CONFIG_FILE
@click.option(
    "--spec-dir",
    type=click.Path(file_okay=False),
    callback=options.not_empty_dir,
    default=str(paths.DYNAMIC_SPEC_DIR),
    show_default=True,
    help="Spec folder to write into.",
)
@click.option("--class", "classes", multiple=True, help="Only this class (repeatable).")
@click.option(
    "--instance",
    default=None,
    callback=options.dns_subdomain,
    help="This writer's name among cdi-gen instances sharing the folder: only its own specs "
    "are replaced or removed. Default: the config's vendor.",
)
@options.PIN_CDI_VERSION
@options.PIN_RUNTIME
@options.PIN_CRI_SOCKET
@options.RECORDS
def write(
    *,
    config_path: Path | None,
    spec_dir: Path,
    classes: tuple[str, ...],
    instance: str | None,
    cdi_version: str | None,
    runtime_refs: tuple[str, ...],
    cri_sockets: tuple[str, ...],
    records_path: Path | None,
) -> None:
    """Write the spec of every class with devices; remove our specs of classes without.

    One-shot host mode (a systemd unit or udev rule for podman/docker). Each file is written
    atomically and only if it changes; foreign files are never touched. A device the agent
    would leave out (skipped, invalid, or needing a newer cdiVersion than the pin or,
    unpinned, than the node's known runtimes read: one device's field would make the
    runtime refuse the whole file) is left out here too, with a warning line naming the
    field and the rule; the spec holds the others, and the exit status is 1. A required host
    path of the extra deviceNodes or mounts missing here is a warning line.
    """
    from cdi_gen.cdi.codec import dump_document
    from cdi_gen.cdi.specnames import spec_filename
    from cdi_gen.cdi.writer import remove_unconfigured, sync_spec
    from cdi_gen.cli.inputs import (
        discover_devices,
        left_out_error,
        node_ceiling,
        warn_left_out,
        warn_missing_paths,
        warn_skipped,
    )
    from cdi_gen.errors import CdiGenError, SpecWriteError

    discovery = discover_devices(
        config_path,
        classes,
        records_path,
        cdi_version=cdi_version,
        runtime_refs=runtime_refs,
        cri_sockets=cri_sockets or None,
    )
    vendor = discovery.config.vendor
    ceiling = node_ceiling(runtime_refs, cri_sockets or None)
    failures: list[str] = []
    left = 0
    for cls in discovery.class_names:
        left += warn_skipped(discovery, cls)
        warn_missing_paths(discovery, cls)
        path = spec_dir / spec_filename(vendor, cls)
        try:
            # The agent's path: what it would leave out is left out, the rest written.
            spec = discovery.class_spec(cls, ceiling=ceiling)
            left += warn_left_out(cls, spec)
            doc = spec.document
            data = None if doc is None else dump_document(doc)
            outcome = sync_spec(spec_dir, vendor, cls, data, instance=instance)
        except CdiGenError as exc:
            failures.extend(str(exc).splitlines())
            continue
        line = _outcome(len(discovery.devices(cls)), spec, path, outcome)
        if line:
            click.echo(f"{vendor}/{cls}: {line}")
    if not classes:
        # Classes that left the config have no devices any more either.
        configured = {(vendor, cls) for cls in discovery.class_names}
        owner = instance or vendor
        for _, cls, error in remove_unconfigured(spec_dir, configured, instance=owner):
            if error is None:
                click.echo(f"{vendor}/{cls}: not configured, removed")
            else:
                failures.extend(str(error).splitlines())
    if failures:
        raise SpecWriteError("\n".join(failures))
    if left:
        raise left_out_error(left, "the other devices are written")


def _outcome(count: int, spec: ClassSpec, path: Path, outcome: str) -> str:
    """What became of one class's spec, for its line on stdout ("" for nothing to say)."""
    doc = spec.document
    if doc is None:
        if spec.left_out:
            done = f"removed {path}" if outcome == "removed" else "no spec"
            return f"every device left out, {done}"
        return f"no device, removed {path}" if outcome == "removed" else ""
    ids = len(doc["devices"]) + len(spec.left_out)
    slots = f" ({ids} slots)" if ids != count else ""
    out = f", {len(spec.left_out)} left out" if spec.left_out else ""
    return f"{count} device{'s' if count > 1 else ''}{slots}{out}, {path} {outcome}"
