"""``cdi-gen discover``: the devices each class matches now."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cdi_gen.cli import options
from cdi_gen.cli.inputs import discover_devices, hint_links, warn_skipped

if TYPE_CHECKING:
    from cdi_gen.discovery.inventory import Discovery
    from cdi_gen.model import DeviceRecord


@click.command()
@options.CONFIG_FILE
@click.option("--class", "classes", multiple=True, help="Only this class (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@options.RECORDS
def discover(
    config_path: Path | None, classes: tuple[str, ...], as_json: bool, records_path: Path | None
) -> None:
    """The devices each class matches now: names, nodes, major:minor, NUMA, matching rule."""
    records: list[DeviceRecord] = []
    discovery = discover_devices(config_path, classes, records_path, seen=records)
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
                            "slots": slot_ids(discovery, cls, d.name),
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
            click.echo(f"{vendor}/{cls}: no device{_left_out_note(discovery, cls)}")
            warn_skipped(discovery, cls)
            hint_links(discovery, cls, records)
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
            slots = slot_ids(discovery, cls, d.name)
            shared = f"  slots={len(slots)} ({slots[0]}..{slots[-1]})" if len(slots) > 1 else ""
            click.echo(f"  {d.name:<{width}}  {nodes}  numa={numa}{health}{shared}  [{rules}]")
        warn_skipped(discovery, cls)


def _left_out_note(discovery: Discovery, cls: str) -> str:
    """For a class without devices: how many matched and were left out, so that "no device"
    is not read as "nothing matched" (the warnings that follow say why, one per device)."""
    skipped = len({w.sys_path for w in discovery.warnings(cls)})
    if not skipped:
        return ""
    return f": {skipped} matched, {skipped} left out (why: the warnings below)"


def slot_ids(discovery: Discovery, cls: str, device: str) -> list[str]:
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
