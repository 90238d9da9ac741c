"""The ``cdi-gen`` command line.

Exit codes: 0 success, 1 problems found or a runtime failure (among them a device that
``render``, ``write`` or ``slices`` left out of what it still printed or wrote), 2 bad usage or
bad config, 3 registration failure. Errors go to stderr, one line each, as ``error: ...``; a
traceback only with ``--debug``. A command's module is imported only when that command runs (or
``--help`` lists them all), and heavy modules only inside the commands, so that a short command
such as ``render`` starts fast.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

import click

#: Every command: its name -> the module (one per command) and the click command in it.
COMMANDS = {
    "check-config": ("cdi_gen.cli.check_config", "check_config"),
    "deviceclasses": ("cdi_gen.cli.deviceclasses", "deviceclasses"),
    "discover": ("cdi_gen.cli.discover", "discover"),
    "doctor": ("cdi_gen.cli.doctor", "doctor"),
    "list": ("cdi_gen.cli.listing", "list_devices"),
    "render": ("cdi_gen.cli.render", "render"),
    "run": ("cdi_gen.cli.run", "run"),
    "schema": ("cdi_gen.cli.schema", "schema"),
    "slices": ("cdi_gen.cli.slices", "slices"),
    "validate": ("cdi_gen.cli.validate", "validate"),
    "write": ("cdi_gen.cli.write", "write"),
}


class _State:
    debug = False


class _Commands(click.Group):
    """The group of :data:`COMMANDS`, each imported when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context | None, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        command = getattr(importlib.import_module(where[0]), where[1])
        if not isinstance(command, click.Command):
            raise TypeError(f"{where[0]}.{where[1]} is not a click command")
        return command


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
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
