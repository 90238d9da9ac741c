"""Reading and writing CDI spec documents.

Output is deterministic (same document → byte-identical file), because the writer skips files whose
bytes would not change and runtimes rescan the folder on every write. Input is parsed strictly
and judged completely: structure (pydantic), semantics (:mod:`cdi_gen.cdi.validation`) and version,
every problem reported with its path.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Literal

import orjson

from cdi_gen.cdi.validation import check_spec
from cdi_gen.errors import QUOTE_LIMIT, Problem, SpecError, quote

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

    from cdi_gen.cdi.spec import Spec

Format = Literal["json", "yaml"]
FORMATS: tuple[Format, ...] = ("json", "yaml")


def dump_document(doc: dict[str, Any], fmt: Format = "json") -> bytes:
    """Serialise a wire document; JSON is indented and ends with a newline."""
    if fmt == "json":
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    if fmt == "yaml":
        import yaml  # lazy: only YAML users pay for the import

        text = yaml.dump(
            doc,
            Dumper=_plain_dumper(),
            sort_keys=False,
            default_flow_style=False,
            allow_unicode=True,
        )
        return b"---\n" + text.encode()
    raise ValueError(f"unknown format {fmt!r}, should be one of {', '.join(FORMATS)}")


def _plain_dumper() -> Any:
    """PyYAML's safe dumper without anchors and aliases.

    The slots of a shared device share one edits object; the safe dumper would write it once
    as ``&id001`` and then ``*id001``, which readers of a spec (people, ``yq``, grep) should
    not have to resolve. Every value is written out where it is used instead.
    """
    import yaml

    class PlainDumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return PlainDumper


def _loc_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            name = part if len(part) <= QUOTE_LIMIT else f"{part[:QUOTE_LIMIT]}..."
            path += f".{name}" if path else name
    return path


def _message(err: ErrorDetails) -> str:
    loc = err["loc"]
    if err["type"] == "extra_forbidden":
        return f"unknown field {quote(loc[-1])}"
    if err["type"] == "missing":
        return f"missing required field {quote(loc[-1])}"
    return f"{err['msg']} (got {quote(err.get('input'))})"


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Runtimes parse strictly: a key given twice rejects the file instead of "last one wins".
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {quote(key)}")
        obj[key] = value
    return obj


def no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


#: Deepest nesting a YAML document may have: a spec needs 5 levels, a config 8. libyaml's
#: composer recurses in C (200,000 levels crash the process) and its parser slows down
#: quadratically with depth, so depth is checked on the event stream before composing.
YAML_MAX_DEPTH = 64
#: Nodes a YAML document may expand to through aliases, beyond one node per byte of text: a
#: document without aliases never has more nodes than bytes, so this only stops aliases that
#: multiply (a 500-byte "billion laughs" expands to 10^9 nodes).
YAML_ALIAS_ALLOWANCE = 10_000


def one_line(exc: BaseException) -> str:
    """The message of a parser's exception on one line, without Python-specific advice."""
    text = " ".join(str(exc).split())
    # int(): "...; use sys.set_int_max_str_digits() to increase the limit" means nothing here.
    return text.split("; use sys.set_int_max_str_digits", 1)[0]


#: Set on the YAML errors raised for our own bounds: their message is ours, never the file's
#: text, so a caller that hides the parser's words (they quote the file) may still show it.
BOUND_ERROR = "cdi_gen_bound"


def _yaml_error(message: str, mark: Any) -> Exception:
    import yaml

    exc = yaml.constructor.ConstructorError(None, None, message, mark)
    setattr(exc, BOUND_ERROR, True)
    return exc


def _check_yaml_shape(text: str | bytes, base: Any) -> None:
    """Raise a YAML error if the document nests too deep or aliases blow it up."""
    import yaml

    budget = len(text) + YAML_ALIAS_ALLOWANCE
    nodes = 0
    sizes: dict[str, int] = {}  # anchor -> nodes it expands to
    open_: list[tuple[str | None, int]] = []  # collections being read: (anchor, nodes before)
    try:
        _walk_events(yaml.parse(text, Loader=base), budget, sizes, open_, nodes)
    except yaml.MarkedYAMLError as exc:
        # libyaml >= 0.2.5 as PyYAML 6.0.3+ bundles it refuses 1,000 flow levels in its scanner,
        # which reads flow collections ahead of the events: the same rule, said as ours.
        if "maximum nesting depth" not in str(exc.problem):
            raise
        raise _yaml_error(f"nested deeper than {YAML_MAX_DEPTH} levels", exc.problem_mark) from None


# Complexity exception (C901): one pass over the YAML events; depth, anchors and the
# budget are state every branch shares.
def _walk_events(  # noqa: C901
    events: Any,
    budget: int,
    sizes: dict[str, int],
    open_: list[tuple[str | None, int]],
    nodes: int,
) -> None:
    import yaml

    for event in events:
        if isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in open_):
                raise _yaml_error(
                    f"alias *{event.anchor} is inside the node it names (a cycle)",
                    event.start_mark,
                )
            nodes += sizes.get(event.anchor or "", 1)
        elif isinstance(event, yaml.ScalarEvent):
            nodes += 1
            if event.anchor:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            open_.append((event.anchor, nodes))
            nodes += 1
            if len(open_) > YAML_MAX_DEPTH:
                raise _yaml_error(f"nested deeper than {YAML_MAX_DEPTH} levels", event.start_mark)
        elif isinstance(event, yaml.CollectionEndEvent) and open_:
            anchor, before = open_.pop()
            if anchor:
                sizes[anchor] = nodes - before
        if nodes > budget:
            raise _yaml_error(
                f"aliases expand the document to more than {budget} nodes "
                f"(the limit is one per byte of text plus {YAML_ALIAS_ALLOWANCE})",
                event.start_mark,
            )


def _strict_mapping(loader: Any, node: Any) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str | int | float | bool | None):
            # "? [a, b]": a complex key no runtime or config field accepts.
            raise _yaml_error(
                f"a mapping key must be a string, got {type(key).__name__} {quote(key)}",
                key_node.start_mark,
            )
        if key in out:
            mark = key_node.start_mark
            raise _yaml_error(f"duplicate key {quote(key)} (line {mark.line + 1})", mark)
        out[key] = loader.construct_object(value_node, deep=True)
    return out


@functools.cache
def _strict_loader() -> Any:
    import yaml

    # libyaml's parser when PyYAML has it: ~10x faster than the pure-Python one.
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):  # type: ignore[misc, valid-type]
        """A safe loader that refuses duplicate keys (PyYAML silently keeps the last one)
        and turns a value its tag cannot hold (``!!int abc``) into a YAML error."""

        def construct_object(self, node: Any, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep)
            except yaml.YAMLError:
                raise
            except Exception as exc:  # PyYAML's constructors fail in many ways on bad values
                # ("!!int " is an IndexError, "!!bool maybe" a KeyError)
                tag = node.tag.rsplit(":", 1)[-1]
                value = node.value if isinstance(node.value, str) else node.tag
                why = "unknown value" if isinstance(exc, KeyError) else one_line(exc)
                raise _yaml_error(
                    f"{quote(value)} is not a valid !!{tag}: {why}", node.start_mark
                ) from None

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _strict_mapping)
    return StrictLoader


def load_yaml(text: str | bytes) -> Any:
    """Parse YAML safely and strictly (a key given twice is an error, as for the runtimes).

    Bounded: nesting deeper than :data:`YAML_MAX_DEPTH` and alias expansion beyond
    :data:`YAML_ALIAS_ALLOWANCE` are errors, checked before anything is built; a complex key
    or a value its tag cannot hold is an error too. Raises ``yaml.YAMLError`` (with line and
    column where known), never another exception.
    """
    import yaml

    loader = _strict_loader()
    _check_yaml_shape(text, loader.__mro__[1])
    return yaml.load(text, Loader=loader)


def parse_document(data: bytes, fmt: Format = "json") -> Any:
    """Parse bytes into plain data; raise :class:`SpecError` on a syntax error or a key
    given twice in one object."""
    import json

    try:
        if fmt == "json":
            return json.loads(data, object_pairs_hook=unique_keys, parse_constant=no_constant)
        return load_yaml(data)
    except RecursionError:
        raise SpecError([Problem("", f"cannot parse {fmt.upper()}: nested too deep")]) from None
    except Exception as exc:  # ValueError, and yaml.YAMLError which we do not import eagerly
        raise SpecError([Problem("", f"cannot parse {fmt.upper()}: {one_line(exc)}")]) from exc


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
    # Here, not at import: writing specs and reading configs (the CLI, the agent's start)
    # never build the spec models, about 30 ms of pydantic class creation.
    from pydantic import ValidationError

    from cdi_gen.cdi.spec import Spec
    from cdi_gen.strictmodel import problems as field_problems

    try:
        spec = Spec.model_validate(doc)
    except ValidationError as exc:
        raise SpecError(field_problems(exc, where=_loc_path, message=_message), source) from None
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
