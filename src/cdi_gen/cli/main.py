"""The ``cdi-gen`` command line.

Exit codes: 0 success, 1 problems found or a runtime failure, 2 bad usage or bad config,
3 registration failure. Errors go to stderr, one line each, as ``error: ...``; a traceback
only with ``--debug``. Heavy modules are imported inside the commands so that a short command
such as ``render`` starts fast.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cdi_gen import paths as default_paths

if TYPE_CHECKING:
    from cdi_gen.cdi.codec import Format
    from cdi_gen.cdi.spec import Spec


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


def emit_spec(
    spec: Spec,
    *,
    fmt: Format = "json",
    output: Path | None = None,
    cdi_version: str | None = None,
) -> None:
    """Pin/compute the version, validate, and print ``spec`` or write it to ``output``.

    Raises :class:`~cdi_gen.errors.VersionError` before anything is written when the spec
    needs a newer version than ``cdi_version``, and :class:`~cdi_gen.errors.SpecError` when it
    breaks a runtime rule.
    """
    from cdi_gen.cdi.codec import dump_document, spec_document
    from cdi_gen.cdi.validation import check_document
    from cdi_gen.cdi.version import choose_version, document_requirements
    from cdi_gen.errors import SpecError

    # One wire document for the version choice, the checks and the output: converting a
    # large spec from the models costs more than all three.
    doc = spec_document(spec)
    doc["cdiVersion"] = choose_version(list(document_requirements(doc)), cdi_version, spec.kind)
    problems = check_document(doc)
    if problems:
        raise SpecError(problems, spec.kind)
    data = dump_document(doc, fmt)
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    _write_file_atomically(output, data)


def _write_file_atomically(output: Path, data: bytes) -> None:
    import os
    import stat
    import tempfile

    from cdi_gen.errors import ConfigError, SpecWriteError

    # The file is replaced by a rename: never do that to a device, FIFO or folder someone
    # names here (as root, `-o /dev/full` would replace the device node with a file).
    try:
        mode = os.stat(output).st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise ConfigError(
            f"--output {str(output)!r}: exists and is not a regular file; "
            "to write into it, leave --output out and redirect stdout"
        )
    directory = output.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{output.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fchmod(fh.fileno(), 0o644)
                os.fsync(fh.fileno())
            os.rename(tmp, output)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise SpecWriteError(f"cannot write {str(output)!r}: {exc.strerror or exc}") from exc


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


@cli.command()
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


@cli.command("list")
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


@cli.command()
@click.argument("which", type=click.Choice(["spec", "config"]))
def schema(which: str) -> None:
    """Print the JSON Schema of a CDI spec (as cdi-gen validates it) or of the config file."""
    from cdi_gen.cli.schema import cdi_spec_schema, config_schema, dump_schema

    sys.stdout.buffer.write(dump_schema(cdi_spec_schema() if which == "spec" else config_schema()))


# --- udev discovery: discover, render, write, check-config (issue 3) ---------------------------

_CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Agent config (YAML or JSON). Default: the embedded catalogue.",
)
_RECORDS_OPTION = click.option(
    "--records",
    "records_path",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Use recorded udev data (`udevadm info --export-db` text or a JSON list of "
    "records) instead of this machine's devices.",
)

_CDI_VERSION_OPTION = click.option(
    "--cdi-version",
    envvar="CDI_GEN_CDI_VERSION",
    help="Pin cdiVersion for classes without a pin of their own: X.Y.Z, or 'runtime' for the "
    "newest the node's container runtime reads. A class whose spec needs more is refused, "
    "naming the field. Default: the minimum each spec needs.  [env: CDI_GEN_CDI_VERSION]",
)
_RUNTIME_OPTION = click.option(
    "--runtime",
    "runtime_refs",
    multiple=True,
    envvar="CDI_GEN_RUNTIME",
    help="The node's container runtime(s) as NAME@VERSION (containerd, cri-o, podman; "
    "repeatable), for the 'runtime' pin and the doctor. Default: every runtime on PATH, "
    "asked for its version.  [env: CDI_GEN_RUNTIME, space-separated]",
)


def _resolve_version(value: str | None, runtime_refs: Sequence[str], what: str) -> str | None:
    """A concrete cdiVersion for a pin: ``runtime`` becomes the node's limit, found now."""
    from cdi_gen.cdi.runtimes import detect_all, node_limit
    from cdi_gen.cdi.version import normalize
    from cdi_gen.config.models import RUNTIME_PIN
    from cdi_gen.errors import ConfigError

    if value is None:
        return None
    if value == RUNTIME_PIN:
        return node_limit(detect_all(runtime_refs))
    try:
        return normalize(value)
    except ValueError as exc:
        raise ConfigError(f"{what}: {exc} or {RUNTIME_PIN!r}") from None


def _pin_versions(config: Any, default: str | None, runtime_refs: Sequence[str]) -> Any:
    """``config`` with every class's cdiVersion pin concrete: its own pin, else ``default``;
    ``runtime`` resolved once for all classes."""
    from cdi_gen.config.models import RUNTIME_PIN

    wanted = {c.cdi_version or default for c in config.classes}
    if wanted <= {None} and default is None:
        return config
    limit = (
        _resolve_version(RUNTIME_PIN, runtime_refs, "cdiVersion runtime")
        if RUNTIME_PIN in wanted
        else None
    )
    default = limit if default == RUNTIME_PIN else _resolve_version(default, (), "--cdi-version")
    classes = [
        c.model_copy(
            update={
                "cdi_version": limit if c.cdi_version == RUNTIME_PIN else c.cdi_version or default
            }
        )
        for c in config.classes
    ]
    return config.model_copy(update={"classes": classes})


def _not_empty_dir(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Refuse an empty folder, also from an empty environment variable.

    click treats ``CDI_GEN_SPEC_DIR=""`` as unset and would silently use the default; an empty
    value is a mistake (an unset variable in a manifest), so it is an error, as an empty
    ``--spec-dir ""`` (which would mean the current folder) is.
    """
    import os

    from cdi_gen.errors import ConfigError

    envvar = getattr(param, "envvar", None)
    # (click 8.4 records the parameter's source only after this callback: compare values.)
    if isinstance(envvar, str) and os.environ.get(envvar) == "" and value == param.default:
        raise ConfigError(f"{envvar} is set but empty: give a folder or unset it")
    if value == "":
        raise ConfigError(
            f"--{(param.name or '').replace('_', '-')}: an empty path is not a folder"
        )
    return Path(value)


def _discover(
    config_path: Path | None,
    classes: Sequence[str],
    records_path: Path | None,
    vendor: str | None = None,
    *,
    cdi_version: str | None = None,
    runtime_refs: Sequence[str] = (),
) -> Any:
    """Load the config (pins resolved), read the devices and return a fed :class:`Discovery`."""
    from cdi_gen.config.models import load_config
    from cdi_gen.discovery.inventory import Discovery
    from cdi_gen.sources.udev import enumerate_records

    config = _pin_versions(load_config(config_path), cdi_version, runtime_refs)
    if vendor is not None:
        config = config.with_vendor(vendor)
    discovery = Discovery(config, classes or None)
    if records_path is None:
        records = enumerate_records(
            subsystems=discovery.subsystems, interest=discovery.interest, wants=discovery.wants
        )
    else:
        records = _load_records(records_path)
    discovery.replace(records)
    return discovery


def _load_records(path: Path) -> list[Any]:
    """The records of a ``--records`` file; ConfigError (exit 2) naming the file and why."""
    import orjson

    from cdi_gen.cdi.codec import one_line
    from cdi_gen.errors import ConfigError
    from cdi_gen.files import RECORDS_MAX_BYTES, FileRefused, read_regular
    from cdi_gen.sources.udev import record_from_json, records_from_export_db

    try:
        data = read_regular(path, RECORDS_MAX_BYTES)
    except (FileNotFoundError, FileRefused) as exc:
        why = "no such file" if isinstance(exc, FileNotFoundError) else str(exc)
        raise ConfigError(f"--records {str(path)!r}: {why}") from None
    try:
        if not data.lstrip().startswith((b"[", b"{")):
            return records_from_export_db(data.decode("utf-8", "replace"))
        items = orjson.loads(data)
        if not isinstance(items, list):
            raise ValueError("a JSON records file is a list of records")
        records = []
        for i, item in enumerate(items):
            try:
                records.append(record_from_json(item))
            except ValueError as exc:
                raise ValueError(f"[{i}]: {exc}") from None
        return records
    except (ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(f"{path}: not udev records: {one_line(exc)}") from None


def _slots(discovery: Any, cls: str, device: str) -> list[str]:
    """The device plugin IDs of one physical device: itself, or its slots when shared."""
    from cdi_gen.discovery.sharing import slot_names
    from cdi_gen.errors import InvalidNameError

    replicas = discovery.config_of(cls).sharing.replicas
    if replicas <= 1:
        return [device]
    try:
        return slot_names(device, replicas)
    except InvalidNameError:
        return []


def _warn(discovery: Any, cls: str) -> None:
    for warning in discovery.warnings(cls):
        click.echo(f"warning: {warning}", err=True)


@cli.command()
@_CONFIG_OPTION
@click.option("--class", "classes", multiple=True, help="Only this class (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_RECORDS_OPTION
def discover(
    config_path: Path | None, classes: tuple[str, ...], as_json: bool, records_path: Path | None
) -> None:
    """The devices each class matches now: names, nodes, major:minor, NUMA, matching rule."""
    discovery = _discover(config_path, classes, records_path)
    vendor = discovery.config.vendor
    if as_json:
        import orjson

        doc = {
            "vendor": vendor,
            "classes": {
                cls: {
                    "kind": f"{vendor}/{cls}",
                    "devices": [
                        {
                            "name": d.name,
                            "qualifiedName": f"{vendor}/{cls}={d.name}",
                            "healthy": d.healthy,
                            "numaNode": d.numa_node,
                            "physical": d.physical,
                            "nodes": [
                                {
                                    "hostPath": n.host_path,
                                    "containerPath": n.container_path,
                                    "type": n.type,
                                    "major": n.major,
                                    "minor": n.minor,
                                    "sysPath": n.sys_path,
                                }
                                for n in d.nodes
                            ],
                            "rules": list(d.rules),
                            "slots": _slots(discovery, cls, d.name),
                        }
                        for d in discovery.devices(cls)
                    ],
                    "warnings": [str(w) for w in discovery.warnings(cls)],
                }
                for cls in discovery.class_names
            },
        }
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        return
    for cls in discovery.class_names:
        devices = discovery.devices(cls)
        if not devices:
            click.echo(f"{vendor}/{cls}: no device")
            _warn(discovery, cls)
            continue
        click.echo(f"{vendor}/{cls}: {len(devices)} device{'s' if len(devices) > 1 else ''}")
        width = max(len(d.name) for d in devices)
        for d in devices:
            nodes = " ".join(
                f"{n.host_path}({n.major}:{n.minor})" if n.major is not None else n.host_path
                for n in d.nodes
            )
            numa = "-" if d.numa_node is None else str(d.numa_node)
            health = "" if d.healthy else "  UNHEALTHY"
            rules = " | ".join(dict.fromkeys(d.rules))
            slots = _slots(discovery, cls, d.name)
            shared = f"  slots={len(slots)} ({slots[0]}..{slots[-1]})" if len(slots) > 1 else ""
            click.echo(f"  {d.name:<{width}}  {nodes}  numa={numa}{health}{shared}  [{rules}]")
        _warn(discovery, cls)


@cli.command()
@click.option("--vendor", help="CDI vendor / resource domain. Default: the config's vendor.")
@click.option("--class", "cls", required=True, help="The class to render.")
@_CONFIG_OPTION
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
@_RUNTIME_OPTION
@_RECORDS_OPTION
def render(
    *,
    vendor: str | None,
    cls: str,
    config_path: Path | None,
    fmt: Format,
    output: Path | None,
    cdi_version: str | None,
    runtime_refs: tuple[str, ...],
    records_path: Path | None,
) -> None:
    """Render the CDI spec of one class from the devices present now."""
    from cdi_gen.config.models import AgentConfig
    from cdi_gen.errors import DiscoveryError

    pin = _resolve_version(cdi_version, runtime_refs, "--cdi-version")
    discovery = _discover(config_path, [cls], records_path, vendor, runtime_refs=runtime_refs)
    config: AgentConfig = discovery.config
    _warn(discovery, cls)
    class_config = discovery.config_of(cls)
    if not discovery.devices(cls):
        rules = " | ".join(r.describe() for r in class_config.match)
        raise DiscoveryError(
            f"class {cls!r} ({config.vendor}/{cls}) has no device: nothing matches {rules}"
        )
    spec = discovery.spec(cls)
    emit_spec(spec, fmt=fmt, output=output, cdi_version=pin or class_config.cdi_version)


@cli.command()
@_CONFIG_OPTION
@click.option(
    "--spec-dir",
    type=click.Path(file_okay=False),
    callback=_not_empty_dir,
    default=str(default_paths.DYNAMIC_SPEC_DIR),
    show_default=True,
    help="Spec folder to write into.",
)
@click.option("--class", "classes", multiple=True, help="Only this class (repeatable).")
@_CDI_VERSION_OPTION
@_RUNTIME_OPTION
@_RECORDS_OPTION
def write(
    *,
    config_path: Path | None,
    spec_dir: Path,
    classes: tuple[str, ...],
    cdi_version: str | None,
    runtime_refs: tuple[str, ...],
    records_path: Path | None,
) -> None:
    """Write the spec of every class with devices; remove our specs of classes without.

    One-shot host mode (a systemd unit or udev rule for podman/docker). Each file is written
    atomically and only if it changes; foreign files are never touched.
    """
    from cdi_gen.cdi.validation import check_spec
    from cdi_gen.cdi.writer import owned_specs, remove_spec, spec_filename, write_spec
    from cdi_gen.errors import CdiGenError, SpecError

    discovery = _discover(
        config_path, classes, records_path, cdi_version=cdi_version, runtime_refs=runtime_refs
    )
    vendor = discovery.config.vendor
    failures: list[str] = []
    for cls in discovery.class_names:
        _warn(discovery, cls)
        path = spec_dir / spec_filename(vendor, cls)
        try:
            spec = discovery.spec(cls)
            if spec is None:
                if remove_spec(spec_dir, vendor, cls):
                    click.echo(f"{vendor}/{cls}: no device, removed {path}")
                continue
            problems = check_spec(spec)
            if problems:
                raise SpecError(problems, f"{vendor}/{cls}")
            changed = write_spec(spec_dir, spec)
        except CdiGenError as exc:
            failures.extend(str(exc).splitlines())
            continue
        count = len(discovery.devices(cls))
        state = "written" if changed else "unchanged"
        slots = f" ({len(spec.devices)} slots)" if len(spec.devices) != count else ""
        click.echo(
            f"{vendor}/{cls}: {count} device{'s' if count > 1 else ''}{slots}, {path} {state}"
        )
    if not classes:
        # Classes that left the config have no devices any more either.
        configured = set(discovery.class_names)
        for owned_vendor, owned_cls in owned_specs(spec_dir):
            if owned_vendor == vendor and owned_cls not in configured:
                try:
                    if remove_spec(spec_dir, owned_vendor, owned_cls):
                        click.echo(f"{vendor}/{owned_cls}: not configured, removed")
                except CdiGenError as exc:
                    failures.extend(str(exc).splitlines())
    if failures:
        from cdi_gen.errors import SpecWriteError

        raise SpecWriteError("\n".join(failures))


@cli.command("check-config")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
def check_config(path: Path) -> None:
    """Validate an agent config; print its classes. Exit 2 with one line per problem."""
    from cdi_gen.config.models import load_config

    config = load_config(path)
    names = ", ".join(c.name for c in config.classes)
    count = len(config.classes)
    click.echo(f"{path}: OK, vendor {config.vendor}, {count} class{'es' * (count != 1)}: {names}")


# --- the node agent and the preflight doctor (issue 5) -------------------------------------


# Options the agent and the doctor share, with the same environment variables, so that
# `cdi-gen doctor` run inside the agent's pod judges exactly what the agent uses.
_AGENT_CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="CDI_GEN_CONFIG",
    help="Agent config (YAML or JSON). Default: the embedded catalogue.  [env: CDI_GEN_CONFIG]",
)
_SPEC_DIR_OPTION = click.option(
    "--spec-dir",
    type=click.Path(file_okay=False),
    callback=_not_empty_dir,
    default=str(default_paths.DYNAMIC_SPEC_DIR),
    show_default=True,
    envvar="CDI_GEN_SPEC_DIR",
    help="Folder our spec files go to (/etc/cdi for static mode).  [env: CDI_GEN_SPEC_DIR]",
)
_RUNTIME_SPEC_DIRS_OPTION = click.option(
    "--runtime-spec-dir",
    "runtime_spec_dirs",
    multiple=True,
    type=click.Path(path_type=Path, file_okay=False),
    envvar="CDI_GEN_RUNTIME_SPEC_DIRS",
    help="Folders the container runtime reads, lowest priority first (repeatable); Allocate "
    "checks names against them. Default: /etc/cdi and --spec-dir.  "
    "[env: CDI_GEN_RUNTIME_SPEC_DIRS, space-separated]",
)
_PLUGIN_DIR_OPTION = click.option(
    "--device-plugin-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=str(default_paths.DEVICE_PLUGIN_DIR),
    show_default=True,
    envvar="CDI_GEN_DEVICE_PLUGIN_DIR",
    help="The kubelet's device plugin folder.  [env: CDI_GEN_DEVICE_PLUGIN_DIR]",
)


@cli.command()
@_AGENT_CONFIG_OPTION
@_SPEC_DIR_OPTION
@_RUNTIME_SPEC_DIRS_OPTION
@_PLUGIN_DIR_OPTION
@click.option(
    "--udev-source",
    type=click.Choice(["auto", "udev", "kernel"]),
    envvar="CDI_GEN_UDEV_SOURCE",
    help="Netlink source. Default: the config's (auto: udev when udevd runs).  "
    "[env: CDI_GEN_UDEV_SOURCE]",
)
@click.option(
    "--metrics-address",
    envvar="CDI_GEN_METRICS_ADDRESS",
    default=":9400",
    show_default=True,
    help="HOST:PORT of /metrics, /healthz and /readyz; empty to disable.  "
    "[env: CDI_GEN_METRICS_ADDRESS]",
)
@click.option(
    "--cdi-annotations",
    is_flag=True,
    envvar="CDI_GEN_CDI_ANNOTATIONS",
    help="Also answer Allocate with cdi.k8s.io/ annotations (containerd 1.7.0/1.7.1, CRI-O "
    "< 1.28).  [env: CDI_GEN_CDI_ANNOTATIONS]",
)
@click.option(
    "--cleanup-on-exit",
    is_flag=True,
    envvar="CDI_GEN_CLEANUP_ON_EXIT",
    help="Remove our spec files on exit (default: keep them for running pods).  "
    "[env: CDI_GEN_CLEANUP_ON_EXIT]",
)
@click.option(
    "--no-kubelet",
    is_flag=True,
    envvar="CDI_GEN_NO_KUBELET",
    help="Host mode: keep the spec files current, serve no device plugin.  "
    "[env: CDI_GEN_NO_KUBELET]",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    envvar="CDI_GEN_LOG_FORMAT",
    help="[env: CDI_GEN_LOG_FORMAT]",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    envvar="CDI_GEN_LOG_LEVEL",
    help="[env: CDI_GEN_LOG_LEVEL]",
)
@_CDI_VERSION_OPTION
@_RUNTIME_OPTION
def run(
    *,
    config_path: Path | None,
    spec_dir: Path,
    runtime_spec_dirs: tuple[Path, ...],
    device_plugin_dir: Path,
    udev_source: str | None,
    metrics_address: str,
    cdi_annotations: bool,
    cleanup_on_exit: bool,
    no_kubelet: bool,
    log_format: str,
    log_level: str,
    cdi_version: str | None,
    runtime_refs: tuple[str, ...],
) -> None:
    """The node agent: follow udev, keep spec files current, serve a device plugin per class.

    Runs until SIGTERM, SIGINT or SIGHUP, then removes its sockets (and, with
    --cleanup-on-exit, its spec files) and exits 0.
    """
    import asyncio

    from cdi_gen.agent import Agent, AgentOptions
    from cdi_gen.config.models import load_config
    from cdi_gen.errors import ConfigError
    from cdi_gen.logs import setup_logging
    from cdi_gen.metrics import parse_address

    # Pins are resolved once, at start: the runtime does not change under a running agent.
    config = _pin_versions(load_config(config_path), cdi_version, runtime_refs)
    if metrics_address:
        try:
            parse_address(metrics_address)
        except ValueError as exc:
            raise ConfigError(f"--metrics-address: {exc}") from None
    setup_logging(log_format, log_level)
    options = AgentOptions(
        spec_dir=spec_dir,
        plugin_dir=device_plugin_dir,
        runtime_spec_dirs=runtime_spec_dirs,
        udev_source=udev_source,
        metrics_address=metrics_address or None,
        cdi_annotations=cdi_annotations,
        cleanup_on_exit=cleanup_on_exit,
        kubelet=not no_kubelet,
    )
    asyncio.run(Agent(config, options).run())


@cli.command()
@_AGENT_CONFIG_OPTION
@_SPEC_DIR_OPTION
@_RUNTIME_SPEC_DIRS_OPTION
@click.option(
    "--containerd-config",
    type=click.Path(path_type=Path, dir_okay=False),
    default=str(default_paths.CONTAINERD_CONFIG),
    show_default=True,
)
@click.option(
    "--containerd-version",
    help="Assume this containerd version (X.Y.Z) instead of asking `containerd --version`.",
)
@_RUNTIME_OPTION
@click.option(
    "--crio-config",
    "crio_configs",
    multiple=True,
    type=click.Path(path_type=Path),
    help="CRI-O config file or drop-in folder (repeatable). Default: /etc/crio/crio.conf and "
    "/etc/crio/crio.conf.d.",
)
@_PLUGIN_DIR_OPTION
@_RECORDS_OPTION
def doctor(
    *,
    config_path: Path | None,
    spec_dir: Path,
    runtime_spec_dirs: tuple[Path, ...],
    containerd_config: Path,
    containerd_version: str | None,
    runtime_refs: tuple[str, ...],
    crio_configs: tuple[Path, ...],
    device_plugin_dir: Path,
    records_path: Path | None,
) -> None:
    """Check this node: runtime CDI config and the cdiVersion it reads, spec folders, kubelet,
    udev, class matches.

    One line per check (OK, WARN or FAIL with what to do); exit 1 if any check FAILs.
    """
    from cdi_gen import doctor as dr
    from cdi_gen.agent import AgentOptions
    from cdi_gen.cdi import runtimes as rt
    from cdi_gen.cdi.registry import load_registry
    from cdi_gen.errors import ConfigError

    checks: list[dr.Check] = []
    if runtime_refs:
        runtimes = [rt.parse_reference(ref) for ref in runtime_refs]
    else:
        runtimes = []
        for name in rt.RUNTIMES:
            try:
                found = rt.detect(name)
            except ConfigError as exc:
                checks.append(dr.Check("WARN", "runtime", str(exc), "pass --runtime NAME@VERSION"))
                continue
            if found is not None:
                runtimes.append(found)
    if containerd_version is not None:
        try:
            rt.parse_release(containerd_version)
        except ValueError:
            raise ConfigError(
                f"--containerd-version: {containerd_version!r} is not X.Y.Z"
            ) from None
        runtimes = [r for r in runtimes if r.name != "containerd"]
        runtimes.insert(0, rt.from_table("containerd", containerd_version))
    containerd = next((r for r in runtimes if r.name == "containerd"), None)
    version = None if containerd is None else rt.parse_release(containerd.version)

    dirs = AgentOptions(
        spec_dir=spec_dir, runtime_spec_dirs=runtime_spec_dirs
    ).spec_dirs_for_runtime()
    discovery = _discover(config_path, (), records_path)
    checks += dr.check_containerd(containerd_config, spec_dir, version)
    checks += dr.check_crio(
        crio_configs
        or (default_paths.CRIO_CONFIG, default_paths.CRIO_CONFIG.parent / "crio.conf.d"),
        spec_dir,
    )
    if not any(dr.same_dir(str(d), spec_dir) for d in dirs):
        checks.append(
            dr.Check(
                "FAIL",
                "spec folders",
                f"{spec_dir} is not among the runtime folders {', '.join(map(str, dirs))}",
                "write into a folder the runtime reads",
            )
        )
    registry = load_registry(dirs)
    checks += dr.check_spec_dirs(dirs, spec_dir, discovery.config.vendor, registry)
    checks += dr.check_runtimes(runtimes, registry)
    checks += dr.check_kubelet(device_plugin_dir)
    checks += dr.check_udev()
    checks += dr.check_classes(
        (
            cls,
            " | ".join(r.describe() for r in discovery.config_of(cls).match),
            len(discovery.devices(cls)),
        )
        for cls in discovery.class_names
    )
    for check in checks:
        click.echo(check.line())
    failed = sum(1 for c in checks if c.status == "FAIL")
    warned = sum(1 for c in checks if c.status == "WARN")
    click.echo(f"{len(checks)} checks: {failed} FAIL, {warned} WARN")
    if failed:
        sys.exit(1)
