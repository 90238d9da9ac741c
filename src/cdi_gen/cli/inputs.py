"""What the one-shot commands read and print: the config, the devices (udev or a
recording), a warning per class that reads what the recording lacks, a warning per device
skipped or left out of a spec (and the error that makes the exit status say so), and a spec
document (or a recording) to stdout or a file."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from cdi_gen.cdi.codec import Format
    from cdi_gen.cdi.runtimes import Ceiling, Lookup, Runtime
    from cdi_gen.config.models import ClassConfig
    from cdi_gen.discovery.inventory import Discovery
    from cdi_gen.discovery.spec import ClassSpec
    from cdi_gen.errors import LeftOutError
    from cdi_gen.model import DeviceRecord
    from cdi_gen.sources.records import Recording


def discover_devices(
    config_path: Path | None,
    classes: Sequence[str],
    records_path: Path | None,
    vendor: str | None = None,
    *,
    cdi_version: str | None = None,
    runtime_refs: Sequence[str] = (),
    cri_sockets: Sequence[str | Path] | None = None,
    seen: list[DeviceRecord] | None = None,
) -> Discovery:
    """Load the config (pins resolved; the ``runtime`` pin asks ``cri_sockets``, default
    containerd's and CRI-O's, when no runtime binary answers), read the devices and return a
    fed :class:`Discovery`; the records read are added to ``seen`` when given."""
    from cdi_gen.config.loader import load_config, pin_versions
    from cdi_gen.discovery.inventory import Discovery
    from cdi_gen.sources.udev import enumerate_records

    config = pin_versions(
        load_config(config_path),
        cdi_version,
        runtime_refs,
        fallback=cri_lookup(cri_sockets),
    )
    if vendor is not None:
        config = config.with_vendor(vendor)
    discovery = Discovery(config, classes or None)
    if records_path is None:
        records = enumerate_records(
            subsystems=discovery.subsystems, interest=discovery.interest, wants=discovery.wants
        )
    else:
        recording = load_records_file(records_path)
        records = list(recording.records)
        for cls in discovery.class_names:
            warn_unanswered(cls, discovery.config_of(cls), recording)
    if seen is not None:
        records = list(records)
        seen.extend(records)
    discovery.replace(records)
    return discovery


def cri_lookup(sockets: Sequence[str | Path] | None = None) -> Lookup:
    """The CRI sockets' runtimes (None: containerd's and CRI-O's), asked only when called:
    grpc is loaded only by a ``runtime`` pin on a node where no runtime binary answers."""
    from cdi_gen import paths

    chosen = paths.CRI_SOCKETS if sockets is None else tuple(map(Path, sockets))

    def ask() -> tuple[list[Runtime], list[str]]:
        from cdi_gen.cdi.cri import runtimes_at_sockets

        return runtimes_at_sockets(chosen)

    return ask


def node_ceiling(
    runtime_refs: Sequence[str],
    cri_sockets: Sequence[str | Path] | None = None,
    lookup: Lookup | None = None,
) -> Ceiling | None:
    """What the node's runtimes read, where they are known: named, on PATH, or answering on
    a CRI socket that exists (asked through ``lookup``, default :func:`cri_lookup`; else
    grpc is never loaded); None when none is known. A bad ``--runtime`` is a ConfigError
    (exit 2); a binary whose version cannot be told is a warning line, and the spec keeps
    the minimum version, as on a node of unknown runtimes."""
    from cdi_gen import paths
    from cdi_gen.cdi.runtimes import ceiling_of, runtimes_or_fallback
    from cdi_gen.errors import ConfigError

    chosen = paths.CRI_SOCKETS if cri_sockets is None else tuple(map(Path, cri_sockets))
    present = any(s.exists() or s.is_symlink() for s in chosen)
    try:
        fallback = (lookup or cri_lookup(chosen)) if present else None
        found, _ = runtimes_or_fallback(runtime_refs, fallback)
    except ConfigError as exc:
        if runtime_refs:
            raise
        click.echo(f"warning: cannot tell which cdiVersion this node reads: {exc}", err=True)
        return None
    return ceiling_of(found)


def load_records_file(path: Path) -> Recording:
    """The recording of a ``--records`` file; ConfigError (exit 2) naming the file and why."""
    from cdi_gen.cdi.codec import one_line
    from cdi_gen.errors import ConfigError
    from cdi_gen.files import FileRefused
    from cdi_gen.sources.records import load_recording

    try:
        return load_recording(path)
    except (FileNotFoundError, FileRefused) as exc:
        why = "no such file" if isinstance(exc, FileNotFoundError) else str(exc)
        raise ConfigError(f"--records {str(path)!r}: {why}") from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(f"{path}: not udev records: {one_line(exc)}") from None


def unanswered(cls: ClassConfig, recording: Recording) -> list[str]:
    """The fields of ``cls`` that read what ``recording`` does not hold (sysfs attributes,
    NUMA nodes), each with the name it reads: ``match[0].attributes.size``."""
    out: list[str] = []

    def check(where: str, names: Iterable[str], *, parent: bool) -> None:
        out.extend(f"{where}.{n}" for n in names if not recording.answers(n, parent=parent))

    for i, rule in enumerate(cls.match):
        check(f"match[{i}].attributes", rule.attributes, parent=False)
        check(f"match[{i}].parentAttributes", rule.parent_attributes, parent=True)
    if cls.health is not None:
        check("health.attributes", cls.health.attributes, parent=False)
        check("health.parentAttributes", cls.health.parent_attributes, parent=True)
    for template in cls.templates():
        for f in template.fields:
            if f.name in ("attribute", "parent_attribute") and f.key is not None:
                if not recording.answers(f.key, parent=f.name == "parent_attribute"):
                    out.append(f"{{{f.name}[{f.key}]}} in {template.source!r}")
            elif f.name == "numa" and not recording.numa:
                out.append(f"{{numa}} in {template.source!r}")
    return list(dict.fromkeys(out))


def warn_unanswered(cls: str, config: ClassConfig, recording: Recording) -> bool:
    """One ``warning:`` line on stderr when ``cls`` reads what ``recording`` lacks: a rule
    would silently match nothing (or a template render empty). Whether it warned.

    A warning, not an error: the output is still right for what the recording holds, a
    recording made for other classes is still useful for these, and the exit status keeps
    saying what it says without a recording (``render`` exits 1 when nothing matches).
    """
    from cdi_gen.sources.records import EXPORT_DB

    fields = unanswered(config, recording)
    if not fields:
        return False
    if recording.format == EXPORT_DB:
        limit = f"{EXPORT_DB} holds udev properties only, no sysfs attributes and no NUMA node"
    else:  # a JSON recording: only a list of records answers everything
        device = ", ".join(sorted(recording.attributes or ())) or "none"
        parent = ", ".join(sorted(recording.parent_attributes or ())) or "none"
        limit = f"the recording read only these sysfs attributes: {device}; of parents: {parent}"
    click.echo(
        f"warning: class {cls!r}: {', '.join(fields)}: {limit}, so a rule reading them matches "
        "nothing here, a health check fails and a template lacks them; record this machine "
        "with `cdi-gen record --config CONFIG -o FILE` "
        "(JSON with the sysfs attributes the config reads) and pass that FILE to --records",
        err=True,
    )
    return True


def warn_skipped(discovery: Discovery, cls: str) -> int:
    """One ``warning:`` line on stderr per device of ``cls`` that discovery skipped, or whose
    slots would have invalid names (the agent skips it too, and its spec has none); how many."""
    from cdi_gen.discovery.sharing import expand_devices

    warnings = list(discovery.warnings(cls))
    replicas = discovery.config_of(cls).sharing.replicas
    if replicas > 1:
        warnings += expand_devices(discovery.devices(cls), replicas)[1]
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    return len(warnings)


def warn_missing_paths(discovery: Discovery, cls: str) -> int:
    """One ``warning:`` line on stderr per device of ``cls`` and host path of its extra
    ``deviceNodes`` or bind ``mounts`` missing on this machine (not ``optional``); how many.

    A warning, and the device kept: this machine may not be the node (``--records``), or the
    path may come with a module loaded later; the agent, on the node, leaves such a device
    out, and ``doctor`` fails it."""
    import os

    from cdi_gen.discovery.spec import missing_host_paths

    config = discovery.config_of(cls)
    count = 0
    for device in discovery.devices(cls):
        for problem in missing_host_paths(config, device, os.path.exists):
            click.echo(f"warning: class {cls!r}: device {device.name!r}: {problem}", err=True)
            count += 1
    return count


def hint_links(discovery: Discovery, cls: str, records: Sequence[DeviceRecord]) -> None:
    """A ``hint:`` line on stderr for each rule of ``cls`` whose ``devnode`` pattern names a
    udev link and matched none of ``records``: "no device" alone does not say that links
    come from udevd's database, or that in a link ``*`` stops at ``/``."""
    from cdi_gen.discovery.match import link_hints

    for hint in link_hints(discovery.config_of(cls), records):
        click.echo(f"hint: {hint}", err=True)


def warn_left_out(cls: str, spec: ClassSpec) -> int:
    """One ``warning:`` line on stderr per device left out of the spec of ``cls`` (naming
    the device, the field and the rule, as the agent logs it); how many."""
    for left in spec.left_out:
        click.echo(f"warning: class {cls!r}: {left}", err=True)
    return len(spec.left_out)


def left_out_error(count: int, rest: str) -> LeftOutError:
    """The error a command ends with (exit 1) when it left ``count`` devices out of what it
    wrote or printed (``rest`` says where the others went)."""
    from cdi_gen.errors import LeftOutError

    devices = f"{count} device{'s' if count != 1 else ''}"
    return LeftOutError(f"{devices} left out (named in the warnings above); {rest}")


def emit_document(
    doc: Mapping[str, Any], *, fmt: Format = "json", output: Path | None = None
) -> None:
    """Print the spec document ``doc`` or write it atomically to ``output``.

    Raises :class:`~cdi_gen.errors.SpecError` when it breaks a runtime rule (nothing is
    written), :class:`~cdi_gen.errors.ConfigError` when ``output`` names something that is
    not a regular file, :class:`~cdi_gen.errors.SpecWriteError` when it cannot be written.
    """
    from cdi_gen.cdi.codec import dump_document
    from cdi_gen.cdi.validation import check_document
    from cdi_gen.errors import SpecError

    problems = check_document(doc)
    if problems:
        raise SpecError(problems, str(doc.get("kind", "")))
    emit(dump_document(dict(doc), fmt), output)


def emit(data: bytes, output: Path | None = None) -> None:
    """Print ``data`` or write it atomically to ``output``.

    Raises :class:`~cdi_gen.errors.ConfigError` when ``output`` names something that is not
    a regular file, :class:`~cdi_gen.errors.SpecWriteError` when it cannot be written.
    """
    from cdi_gen.cdi.atomicfile import write_file
    from cdi_gen.errors import ConfigError

    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    # The file is replaced by a rename: never do that to a device, FIFO or folder someone
    # names here (as root, `-o /dev/full` would replace the device node with a file).
    try:
        mode: int | None = os.stat(output).st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise ConfigError(
            f"--output {str(output)!r}: exists and is not a regular file; "
            "to write into it, leave --output out and redirect stdout"
        )
    write_file(output, data)
