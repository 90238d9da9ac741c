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
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import click

#: Where an image records the git revision it was built from (deploy/Containerfile writes it
#: from its REVISION build argument into the agent's virtual environment): the wheel it
#: installs is the same for every commit, so the revision cannot live in the package.
REVISION_FILE = Path("share", "cdi-gen", "revision")
#: Where an environment installed from the project's lock (requirements/*.txt) records the
#: lock's id: scripts/setup.sh in the checkout's .venv, deploy/Containerfile in the image's. A
#: wheel installed into someone's own environment has none.
LOCK_FILE = Path("share", "cdi-gen", "lock")

#: Every command: its name -> the module (one per command) and the click command in it.
COMMANDS = {
    "admission": ("cdi_gen.cli.admission", "admission"),
    "check-config": ("cdi_gen.cli.check_config", "check_config"),
    "deviceclasses": ("cdi_gen.cli.deviceclasses", "deviceclasses"),
    "discover": ("cdi_gen.cli.discover", "discover"),
    "doctor": ("cdi_gen.cli.doctor", "doctor"),
    "list": ("cdi_gen.cli.listing", "list_devices"),
    "probe": ("cdi_gen.cli.probe", "probe"),
    "record": ("cdi_gen.cli.record", "record"),
    "render": ("cdi_gen.cli.render", "render"),
    "run": ("cdi_gen.cli.run", "run"),
    "schema": ("cdi_gen.cli.schema", "schema"),
    "slices": ("cdi_gen.cli.slices", "slices"),
    "validate": ("cdi_gen.cli.validate", "validate"),
    "write": ("cdi_gen.cli.write", "write"),
}


class _State:
    debug = False


def _revision() -> str:
    """The image's recorded revision, else the source checkout's HEAD when the package runs
    from one (an editable install), else ``unknown``."""
    try:
        recorded = (Path(sys.prefix) / REVISION_FILE).read_text().strip()
    except OSError:
        recorded = ""
    if recorded:
        return recorded
    checkout = Path(__file__).resolve().parents[3]
    if (checkout / ".git").exists() and (checkout / "pyproject.toml").is_file():
        import subprocess

        try:
            proc = subprocess.run(
                ["git", "-C", str(checkout), "rev-parse", "HEAD"],
                capture_output=True, text=True, timeout=10, check=False,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return "unknown"
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    return "unknown"


def _lock() -> str:
    """The id of the lock this environment was installed from, else ``unknown``."""
    try:
        return (Path(sys.prefix) / LOCK_FILE).read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import version

    click.echo(f"cdi-gen, version {version('cdi-gen')} (revision {_revision()}, lock {_lock()})")
    ctx.exit()


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
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version, the git revision and the dependency lock built from, then exit.",
)
def cli(debug: bool) -> None:
    """Make Linux devices schedulable in Kubernetes and injectable through CDI."""
    _State.debug = debug


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: run the CLI and map errors to exit codes."""
    from cdi_gen.errors import CdiGenError

    # pydantic looks for plugins of its own in the metadata of every installed distribution
    # when it builds the first model: 40 to 80 ms of every start here, for plugins cdi-gen
    # never uses. A value the caller set is kept.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

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
