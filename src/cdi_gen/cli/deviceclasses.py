"""``cdi-gen deviceclasses``: the DeviceClass manifests of the configured classes."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cdi_gen.cli import options


@click.command()
@options.CONFIG_FILE
@click.option("--driver", "driver", help="The DRA driver name; default: the config's vendor.")
@click.option("--dra-only", is_flag=True, help="Only the classes whose config says `api: dra`.")
def deviceclasses(config_path: Path | None, driver: str | None, dra_only: bool) -> None:
    """Print a DeviceClass (YAML documents) per class: `<class>.<driver>`, selecting the
    driver's devices of that class, with `extendedResourceName: <vendor>/<class>` so pods
    asking for the extended resource are served by DRA."""
    import yaml

    from cdi_gen.cli.slices import _driver
    from cdi_gen.config.loader import load_config
    from cdi_gen.dra.driver.deviceclasses import device_classes

    config = load_config(config_path)
    driver = _driver(driver, config.vendor)
    names = [c.name for c in config.classes if not dra_only or c.api == "dra"]
    docs = device_classes(names, driver, config.vendor)
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, width=1 << 16))
