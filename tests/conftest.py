"""Shared fixtures: short socket folders, the upstream CDI schema."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import settings

# Hypothesis's per-example deadline is a timing assertion: on a loaded 2-core machine (a
# fresh `make test` building Kubernetes beside the suite) a 200 ms deadline failed a correct
# test. Speed is the benchmarks' business; examples only have to be right.
#: make test-fast's cap on the examples of each property-based test (CDI_GEN_FAST_EXAMPLES): the
#: inner loop tries the first inputs of every property, make test (unset) all it asks for.
FAST_EXAMPLES = int(os.environ.get("CDI_GEN_FAST_EXAMPLES", "0"))


def examples(wanted: int) -> int:
    """The examples a property-based test asking for ``wanted`` runs in this tier."""
    return min(wanted, FAST_EXAMPLES) if FAST_EXAMPLES > 0 else wanted


settings.register_profile("cdi-gen", deadline=None, max_examples=examples(100))
settings.load_profile("cdi-gen")

pytest_plugins = ["tests.plugins.no_skips", "tests.plugins.environment", "tests.plugins.machine"]

REPO = Path(__file__).resolve().parent.parent
# The upstream CDI schema and its good/bad test data, as Debian's package of the Go CDI library
# installs them (scripts/setup.sh test installs it for the e2e tests anyway). Nothing outside
# the repository is read except what that setup installs.
UPSTREAM_SCHEMA_DIR = Path(
    "/usr/share/gocode/src/github.com/container-orchestrated-devices/container-device-interface/schema"
)
SETUP_HINT = "run `make test` (scripts/setup.sh test installs it)"


def upstream_schema_file(name: str) -> Path:
    """A file of the installed upstream schema, or a test failure saying how to get it."""
    path = UPSTREAM_SCHEMA_DIR / name
    if not path.is_file():
        pytest.fail(f"upstream CDI schema file {path} missing; {SETUP_HINT}", False)
    return path


def upstream_testdata(kind: str) -> list[Path]:
    """The upstream schema's ``testdata/good`` or ``testdata/bad`` files; never an empty list,
    which would turn a parametrised test into a silent skip."""
    files = sorted((UPSTREAM_SCHEMA_DIR / "testdata" / kind).glob("*.json"))
    if not files:
        raise pytest.UsageError(
            f"no upstream CDI schema test data in {UPSTREAM_SCHEMA_DIR / 'testdata' / kind}; "
            + SETUP_HINT
        )
    return files


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

    schema = orjson.loads(upstream_schema_file("schema.json").read_bytes())
    defs = orjson.loads(upstream_schema_file("defs.json").read_bytes())
    registry = Registry().with_resource("defs.json", DRAFT7.create_resource(defs))
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, registry=registry)
