"""The ``cdi-gen`` command line.

Exit codes: 0 success, 1 problems found or a runtime failure (among them a device that
``render``, ``write`` or ``slices`` left out of what it still printed or wrote), 2 bad usage or
bad config, 3 registration failure. Errors go to stderr, one line each, as ``error: ...``; a
traceback only with ``--debug``. Heavy modules are imported inside the commands so that a short
command such as ``render`` starts fast.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    pass


class _State:
    debug = False


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="cdi-gen")
def cli(debug: bool) -> None:
    """Make Linux devices schedulable in Kubernetes and injectable through CDI."""
    _State.debug = debug


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: run the CLI and map errors to exit codes."""
    from cdi_gen.errors import CdiGenError

    try:
        cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except CdiGenError as exc:
        if _State.debug:
            import traceback

            traceback.print_exc()
        for line in str(exc).splitlines() or [type(exc).__name__]:
            click.echo(f"error: {line}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:
        # Output that cannot be written (stdout on /dev/full, a closed pipe): one line, not a
        # traceback, and no second failure when Python flushes stdout at exit.
        _detach_stdout()
        where = f" {exc.filename!r}" if exc.filename else ""
        click.echo(f"error: cannot write output{where}: {exc.strerror or exc}", err=True)
        sys.exit(1)
    sys.exit(0)


def _detach_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _add_commands() -> None:
    """One module per command; the group only collects them."""
    from cdi_gen.cli.check_config import check_config
    from cdi_gen.cli.deviceclasses import deviceclasses
    from cdi_gen.cli.discover import discover
    from cdi_gen.cli.doctor import doctor
    from cdi_gen.cli.listing import list_devices
    from cdi_gen.cli.render import render
    from cdi_gen.cli.run import run
    from cdi_gen.cli.schema import schema
    from cdi_gen.cli.slices import slices
    from cdi_gen.cli.validate import validate
    from cdi_gen.cli.write import write

    for command in (validate, list_devices, schema, discover, render, write, check_config):
        cli.add_command(command)
    cli.add_command(run)
    cli.add_command(doctor)
    cli.add_command(slices)
    cli.add_command(deviceclasses)


_add_commands()
