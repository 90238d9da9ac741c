"""Shared fixtures: short socket folders, the upstream CDI schema."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
UPSTREAM_SCHEMA_DIR = SHARED / "cdi-schema"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="cg"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def upstream_validator() -> Any:
    """A jsonschema validator for the upstream CDI schema (schema.json + defs.json)."""
    import jsonschema
    from referencing import Registry
    from referencing.jsonschema import DRAFT7

    schema = orjson.loads((UPSTREAM_SCHEMA_DIR / "schema.json").read_bytes())
    defs = orjson.loads((UPSTREAM_SCHEMA_DIR / "defs.json").read_bytes())
    registry = Registry().with_resource("defs.json", DRAFT7.create_resource(defs))
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, registry=registry)
