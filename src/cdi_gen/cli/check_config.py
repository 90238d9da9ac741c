"""``cdi-gen check-config``: validate a config file and name its classes."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("check-config")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
def check_config(path: Path) -> None:
    """Validate an agent config; print its classes. Exit 2 with one line per problem."""
    from cdi_gen.config.models import load_config

    config = load_config(path)
    names = ", ".join(c.name for c in config.classes)
    count = len(config.classes)
    click.echo(f"{path}: OK, vendor {config.vendor}, {count} class{'es' * (count != 1)}: {names}")
