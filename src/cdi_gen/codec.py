"""Reading and writing CDI spec documents.

Output is deterministic (same spec → byte-identical file), because the writer skips files whose
bytes would not change and runtimes rescan the folder on every write. Input is parsed strictly
and judged completely: structure (pydantic), semantics (:mod:`cdi_gen.validation`) and version,
every problem reported with its path.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import orjson
from pydantic import ValidationError

from cdi_gen.errors import Problem, SpecError
from cdi_gen.spec import Spec
from cdi_gen.validation import check_spec

Format = Literal["json", "yaml"]
FORMATS: tuple[Format, ...] = ("json", "yaml")


def _canonical(doc: dict[str, Any]) -> dict[str, Any]:
    # Field order comes from the models; only free-form maps need sorting to be stable.
    if doc.get("annotations"):
        doc["annotations"] = dict(sorted(doc["annotations"].items()))
    for device in doc.get("devices", ()):
        if device.get("annotations"):
            device["annotations"] = dict(sorted(device["annotations"].items()))
    return doc


def spec_document(spec: Spec) -> dict[str, Any]:
    """The wire document of ``spec`` (camelCase keys, unset fields left out, stable order)."""
    return _canonical(spec.to_wire())


def dump_document(doc: dict[str, Any], fmt: Format = "json") -> bytes:
    """Serialise a wire document; JSON is indented and ends with a newline."""
    if fmt == "json":
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    if fmt == "yaml":
        import yaml  # lazy: only YAML users pay for the import

        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True)
        return b"---\n" + text.encode()
    raise ValueError(f"unknown format {fmt!r}, should be one of {', '.join(FORMATS)}")


def dump_spec(spec: Spec, fmt: Format = "json") -> bytes:
    """Serialise ``spec`` deterministically as JSON (default) or YAML."""
    return dump_document(spec_document(spec), fmt)


def _loc_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def validation_problems(exc: ValidationError) -> list[Problem]:
    """One :class:`Problem` per pydantic error, with the document path of the field."""
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            message = f"unknown field {loc[-1]!r}"
        elif err["type"] == "missing":
            message = f"missing required field {loc[-1]!r}"
        else:
            message = f"{err['msg']} (got {err.get('input')!r})"
        problems.append(Problem(_loc_path(loc), message))
    return problems


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Runtimes parse strictly: a key given twice rejects the file instead of "last one wins".
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _strict_mapping(loader: Any, node: Any) -> dict[Any, Any]:
    import yaml

    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in out:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1})", mark
            )
        out[key] = loader.construct_object(value_node, deep=True)
    return out


@functools.cache
def _strict_loader() -> Any:
    import yaml

    # libyaml's parser when PyYAML has it: ~10x faster than the pure-Python one.
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):  # type: ignore[misc, valid-type]
        """A safe loader that refuses duplicate keys (PyYAML silently keeps the last one)."""

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _strict_mapping)
    return StrictLoader


def load_yaml(text: str | bytes) -> Any:
    """Parse YAML safely and strictly (a key given twice is an error, as for the runtimes).

    Raises ``yaml.YAMLError`` (with line and column where known).
    """
    import yaml

    return yaml.load(text, Loader=_strict_loader())


def parse_document(data: bytes, fmt: Format = "json") -> Any:
    """Parse bytes into plain data; raise :class:`SpecError` on a syntax error or a key
    given twice in one object."""
    import json

    try:
        if fmt == "json":
            return json.loads(data, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
        return load_yaml(data)
    except ValueError as exc:
        raise SpecError([Problem("", f"cannot parse {fmt.upper()}: {exc}")]) from exc
    except Exception as exc:  # yaml.YAMLError has no common base we import eagerly
        one_line = " ".join(str(exc).split())
        raise SpecError([Problem("", f"cannot parse {fmt.upper()}: {one_line}")]) from exc


def load_spec(data: bytes, fmt: Format = "json", source: str = "") -> Spec:
    """Parse and fully validate a spec document.

    Raises :class:`SpecError` listing every problem (syntax, unknown or missing fields, wrong
    types, semantic rules, version) with ``source`` as its prefix.
    """
    try:
        doc = parse_document(data, fmt)
    except SpecError as exc:
        raise SpecError(exc.problems, source) from None
    if not isinstance(doc, dict):
        raise SpecError(
            [Problem("", f"a spec must be an object, got {type(doc).__name__}")], source
        )
    try:
        spec = Spec.model_validate(doc)
    except ValidationError as exc:
        raise SpecError(validation_problems(exc), source) from None
    problems = check_spec(spec)
    if problems:
        raise SpecError(problems, source)
    return spec


def format_of(path: str) -> Format | None:
    """The format runtimes infer from a file name: ``.json`` or ``.yaml`` (not ``.yml``)."""
    if path.endswith(".json"):
        return "json"
    if path.endswith(".yaml"):
        return "yaml"
    return None
