"""docs/architecture.md names only modules that exist, and every package of src/cdi_gen."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PAGE = ROOT / "docs" / "architecture.md"


def exists(dotted: str) -> bool:
    path = SRC.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def named_modules(text: str) -> set[str]:
    paths = {
        m.removesuffix(".py").removesuffix("/").replace("/", ".")
        for m in re.findall(r"src/cdi_gen(?:/[A-Za-z0-9_]+)*(?:\.py)?/?", text)
    }
    dotted = {m.rstrip(".") for m in re.findall(r"cdi_gen(?:\.[A-Za-z_][A-Za-z0-9_]*)+", text)}
    return {p.removeprefix("src.") for p in paths} | dotted


def test_every_named_module_exists() -> None:
    missing = sorted(m for m in named_modules(PAGE.read_text()) if not exists(m))
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_package_is_mentioned() -> None:
    text = PAGE.read_text()
    packages = sorted(p.parent.name for p in (SRC / "cdi_gen").glob("*/__init__.py"))
    absent = [p for p in packages if f"cdi_gen.{p}" not in text and f"src/cdi_gen/{p}" not in text]
    assert not absent, f"docs/architecture.md does not mention these packages: {absent}"
