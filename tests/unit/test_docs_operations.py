"""docs/operations.md cannot drift from the code: its metrics table lists exactly the metrics
the agent registers (name, type, labels), and every message its troubleshooting section is
keyed by is still printed by src/ in those words."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from cdi_gen.metrics import Metrics
from tests.conftest import REPO

PAGE = REPO / "docs" / "operations.md"
SRC = REPO / "src" / "cdi_gen"

# A %-style directive (``%s``, ``%(attempt)d``, ``%.1f``, ``%g``) or a ``{name}`` of
# str.format: the places where a printed message has a value instead of fixed words.
_DIRECTIVE = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdifgrxo%]|\{[^{}]*\}")
# The head of an agent's log line (text format): time and level.
_LOG_HEAD = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z [A-Z]+ +")


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _page() -> str:
    return PAGE.read_text(encoding="utf-8")


def _documented_metrics(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name → (type, labels) of each row of the metrics table."""
    rows: dict[str, tuple[str, tuple[str, ...]]] = {}
    for line in _section(text, "Metrics reference").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`cdi_gen_"):
            continue
        name = cells[0].strip("`")
        labels = tuple(re.findall(r"`([^`]+)`", cells[2]))
        assert name not in rows, f"{name} has two rows"
        rows[name] = (cells[1], labels)
    return rows


def _registered_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name → (type, labels) of every metric the agent's registry holds, as exported."""
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for value in vars(Metrics()).values():
        if not isinstance(value, MetricWrapperBase):
            continue
        kind = value._type  # the client keeps no public accessor
        name = value._name + ("_total" if kind == "counter" else "")
        found[name] = (kind, tuple(value._labelnames))
    return found


def test_the_metrics_table_is_every_metric_the_agent_exports() -> None:
    documented = _documented_metrics(_page())
    registered = _registered_metrics()
    assert registered, "no metric found in cdi_gen.metrics.Metrics"
    missing = sorted(set(registered) - set(documented))
    extra = sorted(set(documented) - set(registered))
    assert not missing, f"metrics in the code but not in docs/operations.md: {missing}"
    assert not extra, f"metrics in docs/operations.md but not in the code: {extra}"
    for name, (kind, labels) in registered.items():
        assert documented[name] == (kind, labels), (
            f"{name}: the page says {documented[name]}, the code registers {(kind, labels)}"
        )


def _imports_prometheus(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prometheus"):
            return True
        if isinstance(node, ast.Import) and any(
            a.name.startswith("prometheus") for a in node.names
        ):
            return True
    return False


def test_metrics_are_registered_in_one_module_only() -> None:
    """The table is checked against ``Metrics``: a metric made anywhere else would escape."""
    users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if _imports_prometheus(p))
    assert users == ["metrics.py"], users


@cache
def _fragments() -> tuple[str, ...]:
    """Every run of fixed words in a string of src/: string constants and the constant parts
    of f-strings (implicit concatenation already joined), cut at each value's place."""
    out: list[str] = []
    for path in SRC.rglob("*.py"):
        if "_proto" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.extend(_DIRECTIVE.split(node.value))
    return tuple(f for f in out if len(f.strip()) >= 4)


def _in_src(phrase: str) -> bool:
    return any(phrase in fragment for fragment in _fragments())


def _entries(text: str) -> dict[str, list[str]]:
    """Key phrase → the message lines quoted under it, per troubleshooting entry."""
    section = _section(text, "Troubleshooting by message")
    entries: dict[str, list[str]] = {}
    for part in section.split("\n### ")[1:]:
        heading, _, body = part.partition("\n")
        match = re.fullmatch(r"`([^`]+)`", heading.strip())
        assert match, f"a troubleshooting heading is not a quoted phrase: {heading!r}"
        blocks = re.findall(r"```text\n(.*?)```", body, re.DOTALL)
        entries[match.group(1)] = [line for b in blocks for line in b.splitlines() if line]
    return entries


def test_the_troubleshooting_section_covers_the_common_messages() -> None:
    entries = _entries(_page())
    assert 15 <= len(entries) <= 25, len(entries)
    for phrase, lines in entries.items():
        assert lines, f"entry {phrase!r} quotes no message"
        assert any(phrase in line for line in lines), f"{phrase!r} is in none of its messages"


def test_each_key_phrase_is_printed_by_src_in_those_words() -> None:
    """A message reworded in src/ fails here until its entry is updated."""
    gone = [phrase for phrase in _entries(_page()) if not _in_src(phrase)]
    assert not gone, f"key phrases no string of src/ holds any more: {gone}"


def test_each_quoted_line_has_fixed_words_of_src() -> None:
    """Every quoted line, not only its key phrase, comes from a message of src/: its fixed
    words up to the first value's place are a fragment of one of src/'s strings."""
    stale = []
    for lines in _entries(_page()).values():
        for line in lines:
            body = _LOG_HEAD.sub("", line)
            longest = max((f for f in _fragments() if f.strip() in body), key=len, default="")
            if len(longest.strip()) < 10:
                stale.append(line)
    assert not stale, f"quoted lines with no fixed words from src/: {stale}"
