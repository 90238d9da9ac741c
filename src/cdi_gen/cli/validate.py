"""``cdi-gen validate``: spec files checked as the runtimes read them, one line per problem."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click


def _spec_files(paths: Sequence[str]) -> list[Path]:
    from cdi_gen.cdi.codec import format_of

    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            # Everything a runtime would try (sub-folders aside), FIFOs and devices included,
            # so each gets its line instead of being skipped in silence.
            files.extend(sorted(p for p in path.iterdir() if format_of(p.name) and not p.is_dir()))
        else:
            files.append(path)
    return files


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--quiet", "-q", is_flag=True, help="Print problems only, no OK lines.")
@click.option(
    "--for",
    "for_runtimes",
    multiple=True,
    metavar="NAME@VERSION",
    help="Also check that this runtime release can read each file, e.g. containerd@1.7.24, "
    "cri-o@1.30.0, podman@4.3.1 (repeatable).",
)
def validate(paths: tuple[str, ...], quiet: bool, for_runtimes: tuple[str, ...]) -> None:
    """Validate CDI spec files (or every *.json/*.yaml in folders) as runtimes would.

    Checks strict fields, names, cdiVersion against the fields used and the semantic rules,
    and with --for whether a runtime release reads the file's cdiVersion. Prints one line per
    problem and exits 1 if there is any.
    """
    from cdi_gen.cdi.codec import format_of, load_spec
    from cdi_gen.cdi.runtimes import parse_reference, readability_problems
    from cdi_gen.errors import SpecError
    from cdi_gen.files import SPEC_MAX_BYTES, FileRefused, read_regular

    runtimes = [parse_reference(ref) for ref in for_runtimes]
    failed = False
    for path in _spec_files(paths):
        fmt = format_of(path.name) or "json"
        try:
            data = read_regular(path, SPEC_MAX_BYTES)
        except FileNotFoundError:
            click.echo(f"{path}: no such file")
            failed = True
            continue
        except FileRefused as exc:
            click.echo(f"{path}: {exc}")
            failed = True
            continue
        try:
            spec = load_spec(data, fmt)
        except SpecError as exc:
            failed = True
            for problem in exc.problems:
                click.echo(f"{path}: {problem}")
            continue
        unreadable = [p for r in runtimes for p in readability_problems(spec, r)]
        for problem in unreadable:
            click.echo(f"{path}: {problem}")
        if unreadable:
            failed = True
            continue
        if not quiet:
            click.echo(f"{path}: OK")
    if failed:
        sys.exit(1)
