"""JSON Schemas of the documents cdi-gen reads and writes, generated from the models.

``schemas/cdi-spec.schema.json`` is the CDI spec as this project validates it (strict: unknown
fields refused); ``schemas/config.schema.json`` is the agent config. Tests keep the committed
files in sync with the models.
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
    from cdi_gen.config.models import config_json_schema

    return config_json_schema()


@click.command()
@click.argument("which", type=click.Choice(["spec", "config"]))
def schema(which: str) -> None:
    """Print the JSON Schema of a CDI spec (as cdi-gen validates it) or of the config file."""
    sys.stdout.buffer.write(dump_schema(cdi_spec_schema() if which == "spec" else config_schema()))
