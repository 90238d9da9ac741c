"""The operator docs against the code: every config field, template field, setting and chart
value is documented, nothing documented is gone, and README.md and docs/ link only to files
that exist.

docs/configuration.md documents fields in tables whose first cell is the field's full path
(`classes[].node.fileMode`), templates in a table whose first cell is the field
(`{property[NAME]}`), and settings in tables whose first cell is the variable
(`CDI_GEN_SPEC_DIR`); docs/install.md documents the chart's values the same way
(`metrics.serviceMonitor.enabled`). Each test compares those cells with what the code
defines, both ways, and names every difference.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click
import yaml

from cdi_gen.cli.run import run as run_command
from cdi_gen.config.settings import ENV_PREFIX, NAMES
from cdi_gen.config.templates import DEVICE_NAME_FIELDS, EDIT_FIELDS, FILTERS
from tests.conftest import REPO

CONFIGURATION = REPO / "docs" / "configuration.md"
INSTALL = REPO / "docs" / "install.md"
README = REPO / "README.md"
README_MAX_LINES = 300

_CELL_RE = re.compile(r"^\|\s*`([^`]+)`\s*\|")


def _sections(text: str, title: str) -> str:
    """The text of every section whose heading contains ``title``, its subsections
    included."""
    out: list[str] = []
    level = 0  # of the section being kept; 0: none
    for line in text.splitlines():
        heading = re.match(r"(#+) ", line)
        if heading:
            depth = len(heading.group(1))
            if level and depth <= level:
                level = 0
            if not level and title in line:
                level = depth
        if level:
            out.append(line)
    assert out, f"no section '{title}'"
    return "\n".join(out)


def _rows(text: str) -> list[list[str]]:
    """Table rows whose first cell is one code span: the cells, the first without its
    backticks."""
    rows = []
    for line in text.splitlines():
        m = _CELL_RE.match(line)
        if m:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows.append([m.group(1), *cells[1:]])
    return rows


def _schema_paths(schema: Mapping[str, Any]) -> set[str]:
    """Every field path of a JSON Schema as the docs write it: ``a[].b.c``."""
    defs = schema.get("$defs", {})
    out: set[str] = set()

    def walk(node: Mapping[str, Any], path: str) -> None:
        if "$ref" in node:
            walk(defs[node["$ref"].split("/")[-1]], path)
            return
        for key in ("anyOf", "oneOf", "allOf"):
            for sub in node.get(key, []):
                walk(sub, path)
        if isinstance(node.get("items"), Mapping):
            walk(node["items"], path + "[]")
        for name, sub in node.get("properties", {}).items():
            child = f"{path}.{name}" if path else name
            out.add(child)
            walk(sub, child)

    walk(schema, "")
    return out


def _canonical(paths: set[str]) -> dict[str, str]:
    """Each path's canonical form → the path as written. A class's `match` is one rule or a
    list of rules: `classes[].match.kernel` and `classes[].match[].kernel` are one field."""
    return {p.replace("[]", ""): p for p in sorted(paths, reverse=True)}


def _compare(documented: set[str], defined: set[str], where: str, what: str) -> list[str]:
    problems = [
        f"{where}: {what} {name} is not documented" for name in sorted(defined - documented)
    ]
    problems += [
        f"{where}: documents {what} {name}, which does not exist"
        for name in sorted(documented - defined)
    ]
    return problems


def _documented_fields(title: str) -> set[str]:
    return {row[0] for row in _rows(_sections(CONFIGURATION.read_text(), title))}


def test_every_config_field_is_documented_and_every_documented_one_exists() -> None:
    schema = json.loads((REPO / "schemas" / "config.schema.json").read_text())
    documented = _canonical(_documented_fields("Field reference"))
    defined = _canonical(_schema_paths(schema))
    problems = [
        f"docs/configuration.md: config field {defined[key]} is not documented"
        for key in sorted(defined.keys() - documented.keys())
    ]
    problems += [
        f"docs/configuration.md: documents config field {documented[key]}, which does not exist"
        for key in sorted(documented.keys() - defined.keys())
    ]
    assert not problems, "\n".join(problems)


def test_every_deviceconfig_field_is_documented_and_every_documented_one_exists() -> None:
    schema = json.loads((REPO / "schemas" / "deviceconfig.schema.json").read_text())
    documented = _documented_fields("Per-claim configuration (DeviceConfig)")
    problems = _compare(
        documented, _schema_paths(schema), "docs/configuration.md", "DeviceConfig field"
    )
    assert not problems, "\n".join(problems)


def _template_rows() -> dict[str, list[str]]:
    rows = _rows(_sections(CONFIGURATION.read_text(), "Templates"))
    out = {}
    for row in rows:
        m = re.fullmatch(r"\{([a-z_]+)(\[[A-Z]+\])?\}", row[0])
        assert m, f"template row {row[0]!r} is not {{field}} or {{field[KEY]}}"
        out[m.group(1)] = row
    return out


def test_every_template_field_is_documented_and_every_documented_one_exists() -> None:
    rows = _template_rows()
    problems = _compare(
        {f"{{{name}}}" for name in rows},
        {f"{{{name}}}" for name in EDIT_FIELDS},
        "docs/configuration.md",
        "template field",
    )
    for name, row in rows.items():
        if name not in EDIT_FIELDS:
            continue
        said = row[1]
        meant = "yes" if name in DEVICE_NAME_FIELDS else "no"
        if said != meant:
            problems.append(
                f"docs/configuration.md: {{{name}}} in deviceName says {said!r}, the code {meant!r}"
            )
    assert not problems, "\n".join(problems)


def test_every_template_filter_is_documented_and_every_documented_one_exists() -> None:
    documented = {row[0] for row in _rows(_sections(CONFIGURATION.read_text(), "Template filters"))}
    problems = _compare(documented, set(FILTERS), "docs/configuration.md", "template filter")
    assert not problems, "\n".join(problems)


def _run_flags() -> dict[str, str]:
    """Each variable of a setting that `cdi-gen run` has a flag for → the flag."""
    out = {}
    for param in run_command.params:
        if isinstance(param, click.Option) and param.name in NAMES:
            out[ENV_PREFIX + param.name.upper()] = max(param.opts, key=len)
    return out


def test_every_setting_is_documented_with_its_flag_and_every_documented_one_exists() -> None:
    rows = {row[0]: row for row in _rows(_sections(CONFIGURATION.read_text(), "Settings"))}
    defined = {ENV_PREFIX + name.upper() for name in NAMES}
    problems = _compare(set(rows), defined, "docs/configuration.md", "setting")
    flags = _run_flags()
    for variable, row in rows.items():
        if variable not in defined:
            continue
        want = f"`{flags[variable]}`" if variable in flags else "—"
        if row[1] != want:
            problems.append(
                f"docs/configuration.md: {variable}'s flag is written {row[1]!r}, "
                f"cdi-gen run has {want!r}"
            )
    assert not problems, "\n".join(problems)


def _value_paths(values: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _value_paths(value, path + ".")
        else:
            yield path


def test_every_chart_value_is_documented_and_every_documented_one_exists() -> None:
    values = yaml.safe_load((REPO / "deploy" / "helm" / "cdi-gen" / "values.yaml").read_text())
    documented = {row[0] for row in _rows(_sections(INSTALL.read_text(), "Helm values"))}
    problems = _compare(documented, set(_value_paths(values)), "docs/install.md", "chart value")
    assert not problems, "\n".join(problems)


def test_readme_stays_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, at most {README_MAX_LINES}: move detail into docs/"
    )


_LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [README, *sorted((REPO / "docs").rglob("*.md"))]


def test_every_relative_link_of_the_docs_points_at_a_file_that_exists() -> None:
    problems = []
    for page in _pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in _LINK_RE.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, or an anchor of the same page
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                problems.append(f"{page.relative_to(REPO)}: link to {target}: no such file")
    assert not problems, "\n".join(problems)


def test_every_config_shown_in_the_readme_and_the_reference_is_a_valid_config() -> None:
    """A YAML block that starts with `vendor:` is an agent config a reader may copy."""
    from cdi_gen.config.loader import parse_config

    shown = 0
    for page in (README, CONFIGURATION, INSTALL):
        for block in re.findall(r"```yaml\n(vendor:.*?)```", page.read_text(), re.DOTALL):
            parse_config(yaml.safe_load(block), str(page.relative_to(REPO)))
            shown += 1
    assert shown >= 4
