"""Reading a config file, or the embedded catalogue, into the models; one line per problem.
The classes' cdiVersion pins made concrete (:func:`pin_versions`).

A config is YAML or JSON, read bounded (:mod:`cdi_gen.files`) and parsed strictly (unknown
and duplicate keys are errors). Every problem becomes ``file: path.to.field: message``
quoting the offending value, so a bad config never produces a traceback.

``--config`` may name any file the caller can make us read (``/etc/shadow`` parses as a
YAML mapping of one key per line), so what a message quotes of the file's own text is
short and redacted (:func:`fragment`): a key or a parser's complaint shows at most its first
24 name characters and its length, and a file with none of the config's top-level keys is
called so in one line that quotes nothing of it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from cdi_gen.cdi.codec import load_yaml, no_constant, one_line, unique_keys
from cdi_gen.cdi.runtimes import Lookup, node_limit, runtimes_or_fallback
from cdi_gen.cdi.version import normalize
from cdi_gen.config.models import RUNTIME_PIN, AgentConfig
from cdi_gen.errors import QUOTE_LIMIT, ConfigError, Problem, fragment, quote
from cdi_gen.files import CONFIG_MAX_BYTES, FileRefused, read_regular
from cdi_gen.strictmodel import problems

__all__ = [
    "CATALOGUE_NAME",
    "catalogue_text",
    "config_json_schema",
    "load_config",
    "parse_config",
    "pin_versions",
    "resolve_version",
]

log = logging.getLogger(__name__)

#: The embedded catalogue, package data beside this module.
CATALOGUE_NAME = "catalogue.yaml"


def _loc_path(loc: tuple[int | str, ...], raw: Any) -> str:
    out = ""
    node = raw
    for part in loc:
        if isinstance(part, int):
            if isinstance(node, Mapping):
                continue  # a single rule written as a mapping: no index in the user's file
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
        else:
            if part in ("function-after", "function-before") or part.startswith("function-"):
                continue
            node = node.get(part) if isinstance(node, Mapping) else None
            name = _path_part(part)
            out += f".{name}" if out else name
    return out


_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")

#: A quoted segment of a parser's message ('...' or "..."); short ones (one character the
#: parser stopped at) are harmless and say the most.
_QUOTED = re.compile(r"'([^'\n]*)'|\"([^\"\n]*)\"")
_SHORT_QUOTE = 4
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _redact(message: str) -> str:
    """A parser's message with every long quoted segment made a :func:`fragment`."""

    def one(match: re.Match[str]) -> str:
        inner = match.group(1) if match.group(1) is not None else match.group(2)
        return match.group(0) if len(inner) <= _SHORT_QUOTE else fragment(inner)

    return _QUOTED.sub(one, message)


def _path_part(part: str) -> str:
    # Keys of mappings the user names (attributes, properties) are the file's text too.
    return part if _NAME.fullmatch(part) and len(part) <= QUOTE_LIMIT else fragment(part)


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model that validated the mapping at ``loc`` (to list its keys)."""
    model: type[BaseModel] = AgentConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = next(
            (f for n, f in model.model_fields.items() if part in (n, f.alias)),
            None,
        )
        if field is None:
            return None
        found = _find_model(field.annotation)
        if found is None:
            return None
        model = found
    return model


def _find_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _find_model(arg)
        if found is not None:
            return found
    return None


def _message(err: ErrorDetails, raw: Any) -> str:
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        model = _model_at(err["loc"][:-1])
        allowed = (
            f", allowed: {', '.join(f.alias or n for n, f in model.model_fields.items())}"
            if model is not None
            else ""
        )
        return f"unknown key {fragment(err['loc'][-1])}{allowed}"
    if kind == "missing":
        return "required key is missing"
    msg = err["msg"]
    for prefix in _PYDANTIC_PREFIXES:
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    if kind.startswith("literal_error") or kind in (
        "string_type",
        "int_type",
        "int_parsing",
        "float_type",
        "float_parsing",
        "bool_type",
        "bool_parsing",
        "list_type",
        "dict_type",
        "model_type",
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "int_from_float",
    ):
        return f"{msg[0].lower()}{msg[1:]}, got {quote(value)}"
    return f"{msg}, got {quote(value)}"


def _problems(exc: ValidationError, raw: Any) -> list[Problem]:
    return problems(
        exc,
        where=lambda loc: _loc_path(loc, raw),
        message=lambda err: _message(err, raw),
        unknown_at_parent=True,
    )


def parse_config(data: Any, source: str = "config") -> AgentConfig:
    """Validate already-parsed data; raise ConfigError with one ``source: path: msg`` line each."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: should be a mapping with vendor and classes, got {_kind(data)}"
        )
    keys = {f.alias or n for n, f in AgentConfig.model_fields.items()}
    known = keys | set(AgentConfig.model_fields)  # snake_case names are accepted too
    if data and not known.intersection(k for k in data if isinstance(k, str)):
        # Not a config at all (a password file, a kubeconfig): naming its keys would print
        # its content.
        raise ConfigError(
            f"{source}: not a cdi-gen config: none of its {len(data)} top-level keys is one "
            f"of {', '.join(sorted(keys))}"
        )
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"{source}: {p}" for p in _problems(exc, data)]
        error = ConfigError("\n".join(lines))
        error.problems = _problems(exc, data)  # type: ignore[attr-defined]
        raise error from None


def _kind(data: Any) -> str:
    if isinstance(data, str):
        return f"a text of {len(data)} characters"
    return fragment(data)


def _parse_text(text: str, source: str, fmt: Literal["yaml", "json"]) -> Any:
    if fmt == "json":
        try:
            # Duplicate keys are refused as in YAML configs and in specs: "last one wins"
            # would hide a typo.
            return json.loads(text, object_pairs_hook=unique_keys, parse_constant=no_constant)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{source}: line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}"
            ) from None
        except RecursionError:
            raise ConfigError(f"{source}: invalid JSON: nested too deep") from None
        except ValueError as exc:  # a duplicate key, NaN, an integer of 5,000 digits
            raise ConfigError(f"{source}: invalid JSON: {_redact(one_line(exc))}") from None
    try:
        return load_yaml(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        # Never str(exc): it quotes the line around the mark.
        what = _redact(" ".join((exc.problem or exc.context or type(exc).__name__).split()))
        raise ConfigError(f"{source}: {where}invalid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {_redact(one_line(exc))}") from None


def catalogue_text() -> str:
    """The embedded default config, as shipped."""
    return resources.files("cdi_gen.config").joinpath(CATALOGUE_NAME).read_text(encoding="utf-8")


def load_config(path: Path | None) -> AgentConfig:
    """Load the config at ``path``, or the embedded catalogue when ``path`` is None.

    ``.json`` files are read as JSON, anything else as YAML. Raises ConfigError (exit 2) with
    one ``file: path.to.field: message`` line per problem; never another exception.
    """
    if path is None:
        return parse_config(_parse_text(catalogue_text(), CATALOGUE_NAME, "yaml"), CATALOGUE_NAME)
    source = str(path)
    if not source:
        raise ConfigError("config path is empty: give a file, or leave it out for the catalogue")
    try:
        # A FIFO would block, a huge file would take minutes: regular files up to a cap only.
        text = read_regular(path, CONFIG_MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except FileRefused as exc:
        raise ConfigError(f"{source}: {exc}, expected a YAML or JSON file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    fmt: Literal["yaml", "json"] = "json" if path.suffix.lower() == ".json" else "yaml"
    return parse_config(_parse_text(text, source, fmt), source)


def config_json_schema() -> dict[str, Any]:
    """JSON schema of the config file (``schemas/config.schema.json``)."""
    schema = AgentConfig.model_json_schema(by_alias=True, mode="validation")
    # The model stores a list; the file may also hold a single rule as a mapping.
    match = schema["$defs"]["ClassConfig"]["properties"]["match"]
    rule = match.pop("items")
    match.pop("type")
    match["anyOf"] = [rule, {"type": "array", "items": rule, "minItems": 1}]
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "cdi-gen agent config"
    return schema


def resolve_version(
    value: str | None, runtime_refs: Sequence[str], what: str, fallback: Lookup | None = None
) -> str | None:
    """A concrete cdiVersion for a pin: ``runtime`` becomes the node's limit, found now
    (through ``fallback`` when no runtime binary answers and none is named).

    Raises :class:`ConfigError` naming ``what`` for an unknown version.
    """
    if value is None:
        return None
    if value == RUNTIME_PIN:
        return node_limit(*runtimes_or_fallback(runtime_refs, fallback))
    try:
        return normalize(value)
    except ValueError as exc:
        raise ConfigError(f"{what}: {exc} or {RUNTIME_PIN!r}") from None


def pin_versions(
    config: AgentConfig,
    default: str | None,
    runtime_refs: Sequence[str],
    *,
    fallback: Lookup | None = None,
) -> AgentConfig:
    """``config`` with every class's cdiVersion pin concrete: its own pin, else ``default``;
    ``runtime`` resolved once for all classes (``fallback``: see :func:`resolve_version`)."""
    wanted = {c.cdi_version or default for c in config.classes}
    if wanted <= {None} and default is None:
        return config
    limit = (
        resolve_version(RUNTIME_PIN, runtime_refs, "cdiVersion runtime", fallback)
        if RUNTIME_PIN in wanted
        else None
    )
    default = limit if default == RUNTIME_PIN else resolve_version(default, (), "--cdi-version")
    classes = [
        c.model_copy(
            update={
                "cdi_version": limit if c.cdi_version == RUNTIME_PIN else c.cdi_version or default
            }
        )
        for c in config.classes
    ]
    return config.model_copy(update={"classes": classes})
