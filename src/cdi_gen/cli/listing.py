"""``cdi-gen list``: the CDI devices a runtime would see, and the file each resolves to."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from cdi_gen import paths as default_paths


@click.command("list")
@click.option(
    "--spec-dir",
    "spec_dirs",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Spec folder, lowest priority first (repeatable). Default: /etc/cdi then /var/run/cdi.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_devices(spec_dirs: tuple[Path, ...], as_json: bool) -> None:
    """The CDI devices a runtime would see, with the file each resolves to.

    Applies folder priority (a later folder wins) and same-folder conflicts (the device is
    dropped, both files named) the way the runtimes' CDI library does.
    """
    from cdi_gen.cdi.registry import load_registry

    dirs = list(spec_dirs) or list(default_paths.RUNTIME_SPEC_DIRS)
    reg = load_registry(dirs)
    if as_json:
        import orjson

        doc: dict[str, Any] = {
            "dirs": [str(d) for d in reg.dirs],
            "devices": {name: str(e.path) for name, e in sorted(reg.devices.items())},
            "conflicts": {n: [str(p) for p in ps] for n, ps in sorted(reg.conflicts.items())},
            "shadowed": {n: [str(p) for p in ps] for n, ps in sorted(reg.shadowed.items())},
            "errors": {str(p): msgs for p, msgs in sorted(reg.errors.items())},
            "dirErrors": {str(d): m for d, m in reg.dir_errors.items()},
        }
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        return
    width = max((len(n) for n in reg.devices), default=0)
    for name, entry in sorted(reg.devices.items()):
        click.echo(f"{name:<{width}}  {entry.path}")
    for name, paths in sorted(reg.shadowed.items()):
        if name in reg.devices:
            hidden = ", ".join(str(p) for p in paths)
            click.echo(
                f"note: {name} in {hidden} is overridden by {reg.devices[name].path}", err=True
            )
    for name, paths in sorted(reg.conflicts.items()):
        click.echo(
            f"warning: {name} dropped: defined in {', '.join(str(p) for p in paths)}", err=True
        )
    for path, msgs in sorted(reg.errors.items()):
        for msg in msgs:
            if not msg.startswith("conflicting device"):
                click.echo(f"warning: {path}: {msg}", err=True)
    for directory, msg in reg.dir_errors.items():
        click.echo(f"warning: {directory}: {msg}", err=True)
