"""Property-based fuzzing of every input cdi-gen parses, through the real entry points.

Configs go through :func:`cdi_gen.config.loader.load_config` (from a file, as ``--config`` does),
specs through :func:`cdi_gen.cdi.registry.load_file` (as ``list`` and the device plugin read a
spec folder), udev records through the ``--records`` loader and then discovery and spec
building. The only property: each input ends in the result or the one documented error type
(never another exception, so never a traceback), quickly (hypothesis' deadline, 2 s), and
every error line is short.

The suite runs a few dozen inputs per test. ``make fuzz`` runs many more:
``CDI_GEN_FUZZ_EXAMPLES=N`` sets the count.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdi_gen.cdi.registry import load_file
from cdi_gen.cli.inputs import load_records_file
from cdi_gen.config.loader import catalogue_text, load_config
from cdi_gen.config.models import AgentConfig
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.errors import CdiGenError, ConfigError
from cdi_gen.sources.records import record_from_json, records_from_export_db
from tests.conftest import examples

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = examples(int(os.environ.get("CDI_GEN_FUZZ_EXAMPLES", "40")))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: A message line may quote a value, cut short; nothing near a page.
MAX_LINE = 600

#: Pieces of YAML syntax that trip parsers: anchors, aliases, tags, complex keys, flows.
YAML_TOKENS = [
    "&a ", "*a", "&b [*a, *a, *a, *a, *a, *a, *a, *a]", "*b", "!!int ", "!!bool ", "!!float ",
    "!!str ", "!!binary ", "!!timestamp ", "!!set ", "!!omap ", "!!python/object:os.system ",
    "? ", "- ", ": ", "[", "]", "{", "}", ", ", "\n", "\n  ", "\t", "'", '"', "# ", "---\n",
    "...\n", "%YAML 1.1\n", "<<: *a", "|\n  ", ">\n  ", "~", "null", "true", "maybe", "0x1F",
    "1e-300", ".inf", ".nan", "9" * 4400, "vendor", "classes", "name", "match", "subsystem",
    "resyncSeconds", "containerEdits", "deviceNodes", "path", "devices", "kind", "cdiVersion",
    "\x00", "\ufeff", "\u2028", "é",
]  # fmt: skip

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(4000, 4400).map(lambda n: 10**n)
    | st.floats()
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=25,
)
token_soup = st.lists(st.sampled_from(YAML_TOKENS) | st.text(max_size=6), max_size=60).map("".join)


@st.composite
def mutated(draw: st.DrawFn, text: str) -> str:
    """``text`` with a few random edits: insertions of tokens, deletions, repeats."""
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["insert", "delete", "repeat"]))
        if edit == "insert":
            text = text[:at] + draw(st.sampled_from(YAML_TOKENS) | st.text(max_size=8)) + text[at:]
        elif edit == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)) :]
        else:
            piece = text[at : at + draw(st.integers(1, 80))]
            text = text[:at] + piece * draw(st.integers(2, 6)) + text[at:]
    return text


def replace_somewhere(doc: Any, value: Any, path: list[int]) -> Any:
    """``doc`` with the node chosen by ``path`` (indexes into containers) replaced."""
    if not path or not isinstance(doc, dict | list) or not doc:
        return value
    keys = list(doc) if isinstance(doc, dict) else list(range(len(doc)))
    key = keys[path[0] % len(keys)]
    copy: Any = dict(doc) if isinstance(doc, dict) else list(doc)
    copy[key] = replace_somewhere(doc[key], value, path[1:])
    return copy


def dump(doc: Any, fmt: str) -> str:
    # The generator may hold integers past Python's 4,300-digit str() limit; the parsers
    # under test must refuse them, so only writing them lifts the limit.
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        if fmt == "json":
            return json.dumps(doc)
        return yaml.safe_dump(doc, allow_unicode=True)
    finally:
        sys.set_int_max_str_digits(limit)


@st.composite
def structured(draw: st.DrawFn, doc: Any) -> tuple[str, str]:
    """A valid document with one node replaced by a random value, as JSON or YAML text."""
    value = draw(json_values)
    path = draw(st.lists(st.integers(0, 50), max_size=6))
    fmt = draw(st.sampled_from(["json", "yaml"]))
    return dump(replace_somewhere(doc, value, path), fmt), fmt


@contextlib.contextmanager
def written(data: str | bytes, suffix: str) -> Iterator[Path]:
    """``data`` in a file of its own (the entry points read files)."""
    with tempfile.TemporaryDirectory(prefix="cg-fuzz") as folder:
        path = Path(folder) / f"input{suffix}"
        path.write_bytes(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
        yield path


class InputTooSlowError(Exception):
    """One input used more CPU than the bound: a hang or a blow-up, i.e. a finding."""


@contextlib.contextmanager
def cpu_bound(seconds: float = 2.0) -> Iterator[None]:
    """Fail one input that spins: hypothesis' deadline only judges inputs that finish.

    CPU time (SIGPROF), so it does not clash with pytest-timeout's SIGALRM.
    """

    def expire(signum: int, frame: object) -> None:
        raise InputTooSlowError(f"one input took over {seconds}s of CPU")

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def short_lines(message: str) -> None:
    for line in message.splitlines():
        assert len(line) <= MAX_LINE, line[:200]


# --- configs -------------------------------------------------------------------------------

CATALOGUE = catalogue_text()
CATALOGUE_DOC = yaml.safe_load(CATALOGUE)
config_inputs = st.one_of(
    st.binary(max_size=300).map(lambda b: (b, "yaml")),
    token_soup.map(lambda t: (t, "yaml")),
    mutated(CATALOGUE).map(lambda t: (t, "yaml")),
    structured(CATALOGUE_DOC),
)


def check_config(data: str | bytes, fmt: str) -> None:
    with written(data, f".{fmt}") as path, cpu_bound():
        try:
            config = load_config(path)
        except ConfigError as exc:
            assert str(exc).startswith(str(path)), str(exc)[:200]
            short_lines(str(exc))
            return
    assert isinstance(config, AgentConfig)


@FUZZ
@given(config_inputs)
def test_fuzz_config(case: tuple[str | bytes, str]) -> None:
    check_config(*case)


# --- specs ---------------------------------------------------------------------------------

SAMPLES = sorted((ROOT / "cdi-samples").glob("*.json"))
SAMPLE_TEXTS = [p.read_text() for p in SAMPLES]
SAMPLE_DOCS = [orjson.loads(t) for t in SAMPLE_TEXTS]
spec_inputs = st.one_of(
    st.binary(max_size=300).map(lambda b: (b, "json")),
    token_soup.map(lambda t: (t, "yaml")),
    st.sampled_from(SAMPLE_TEXTS).flatmap(mutated).map(lambda t: (t, "json")),
    st.sampled_from(SAMPLE_DOCS)
    .map(lambda d: dump(d, "yaml"))
    .flatmap(mutated)
    .map(lambda t: (t, "yaml")),
    st.sampled_from(SAMPLE_DOCS).flatmap(structured),
)


def check_spec(data: str | bytes, fmt: str) -> None:
    with written(data, f".{fmt}") as path, cpu_bound():
        loaded = load_file(path, 0)
    assert (not loaded.loaded) == bool(loaded.errors)
    for error in loaded.errors:
        short_lines(error)


@FUZZ
@given(spec_inputs)
def test_fuzz_spec(case: tuple[str | bytes, str]) -> None:
    check_spec(*case)


# --- udev records --------------------------------------------------------------------------

RECORD_DOCS = orjson.loads((ROOT / "tests" / "data" / "udev" / "hardware.json").read_bytes())
EXPORT_DB = (ROOT / "tests" / "data" / "udev" / "export-db-vm.txt").read_text()
EXPORT_LINES = st.sampled_from(["P: ", "N: ", "S: ", "E: ", "M: ", "U: ", "T: ", "V: ", "\n"])
records_inputs = st.one_of(
    st.lists(st.sampled_from(RECORD_DOCS), min_size=1, max_size=3)
    .flatmap(structured)
    .map(lambda case: (case[0], "json")),
    st.lists(json_values, max_size=3).map(lambda v: (dump(v, "json"), "json")),
    mutated(EXPORT_DB[:3000]).map(lambda t: (t, "txt")),
    st.lists(EXPORT_LINES | st.text(max_size=30), max_size=40).map(
        lambda parts: ("".join(parts), "txt")
    ),
)
DISCOVERY_CONFIG = load_config(None)


def check_records(data: str, suffix: str) -> None:
    with written(data, f".{suffix}") as path, cpu_bound():
        try:
            records = load_records_file(path).records
        except ConfigError as exc:
            assert "\n" not in str(exc)
            short_lines(str(exc))
            return
        discovery = Discovery(DISCOVERY_CONFIG)
        try:
            discovery.replace(records)
            for cls in discovery.class_names:
                for left in discovery.class_spec(cls).left_out:
                    short_lines(str(left))
                for warning in discovery.warnings(cls):
                    short_lines(str(warning))
        except CdiGenError as exc:  # a documented refusal, with its message
            short_lines(str(exc))


@FUZZ
@given(records_inputs)
def test_fuzz_udev_records(case: tuple[str, str]) -> None:
    check_records(*case)


@FUZZ
@given(json_values)
def test_fuzz_record_from_json(value: Any) -> None:
    with cpu_bound():
        try:
            record_from_json(value)
        except ValueError as exc:
            short_lines(str(exc))


@FUZZ
@given(st.text(max_size=400))
def test_fuzz_export_db_text(text: str) -> None:
    with cpu_bound():
        records_from_export_db(text)


@pytest.mark.timeout(20)
def test_export_db_path_without_a_slash_ends() -> None:
    # Found by `make fuzz`: a P: line without "/" made the parent walk loop forever (14 GB).
    records = records_from_export_db("P: x\nN: loopx\nE: SUBSYSTEM=block\n\nP: y/z\nN: z\n")
    assert [r.sys_path for r in records] == ["/sysx", "/sysy/z"]
    assert records[0].parents == ()


export_db_entries = st.lists(
    st.tuples(
        st.text("/abc.", max_size=12),
        st.sampled_from(["", "N: node\n", "E: DEVNAME=/dev/x\n"]),
        st.sampled_from(["", "E: SUBSYSTEM=block\n", "E: DRIVER=d\nU: usb\n"]),
    ),
    max_size=8,
).map(lambda entries: "".join(f"P: {p}\n{n}{e}\n" for p, n, e in entries))


@FUZZ
@given(export_db_entries)
def test_fuzz_export_db_entries(text: str) -> None:
    with cpu_bound():
        records_from_export_db(text)
