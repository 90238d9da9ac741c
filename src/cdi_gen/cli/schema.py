"""JSON Schemas of the documents cdi-gen reads and writes, generated from the models.

``schemas/cdi-spec.schema.json`` is the CDI spec as this project validates it (strict: unknown
fields refused); ``schemas/config.schema.json`` is the agent config;
``schemas/deviceconfig.schema.json`` a DRA claim's opaque configuration for the driver. Tests
keep the committed files in sync with the models.
"""

from __future__ import annotations

import sys
from typing import Any

import click
import orjson


def cdi_spec_schema() -> dict[str, Any]:
    from cdi_gen.cdi.spec import Spec

    schema = Spec.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "CDI spec (cdi-gen strict form, cdiVersion 0.3.0-1.1.0)"
    return schema


def dump_schema(schema: dict[str, Any]) -> bytes:
    return orjson.dumps(schema, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def config_schema() -> dict[str, Any]:
    from cdi_gen.config.loader import config_json_schema

    return config_json_schema()


def device_config_schema() -> dict[str, Any]:
    from cdi_gen.dra.driver.claimconfig import device_config_schema as schema

    return schema()


@click.command()
@click.argument("which", type=click.Choice(["spec", "config", "deviceconfig"]))
def schema(which: str) -> None:
    """Print the JSON Schema of a CDI spec (as cdi-gen validates it), of the config file or of
    a DRA claim's DeviceConfig."""
    make = {"spec": cdi_spec_schema, "config": config_schema, "deviceconfig": device_config_schema}
    sys.stdout.buffer.write(dump_schema(make[which]()))
