"""The cookbook's examples (docs/examples/<scenario>/): each folder's config, recorded udev
data and the spec file of each of its classes, rendered as ``cdi-gen render --records``
does for the runtime :data:`RUNTIME`.

``tests/unit/test_examples.py`` compares what is rendered with the shipped specs;
``docs/examples/render.sh`` runs this module to write them anew
(``python -m tests.examples``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from click.testing import CliRunner

from cdi_gen.cli.main import cli

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "docs" / "examples"
#: The runtime the examples are rendered for (``--runtime``).
RUNTIME = "containerd@2.3.7,runc@1.4.0"


@dataclass(frozen=True)
class Example:
    """One class of one scenario: where its inputs are and which spec file it renders to."""

    folder: Path
    cls: str
    #: ``spec.json`` for a scenario of one class, ``spec-<class>.json`` for one of several.
    spec: Path


def scenarios() -> list[Path]:
    """The scenario folders, sorted."""
    return sorted(p for p in EXAMPLES.iterdir() if p.is_dir())


def class_names(folder: Path) -> list[str]:
    """The classes of ``folder``'s config.yaml, in the config's order."""
    doc = yaml.safe_load((folder / "config.yaml").read_text())
    return [c["name"] for c in doc["classes"]]


def examples() -> list[Example]:
    """Every class of every scenario."""
    out = []
    for folder in scenarios():
        names = class_names(folder)
        for cls in names:
            spec = folder / ("spec.json" if len(names) == 1 else f"spec-{cls}.json")
            out.append(Example(folder, cls, spec))
    return out


def render(example: Example) -> tuple[int, bytes, str]:
    """Exit status, spec bytes and stderr of ``cdi-gen render`` for ``example``."""
    result = CliRunner().invoke(
        cli,
        [
            "render",
            "--config",
            str(example.folder / "config.yaml"),
            "--records",
            str(example.folder / "records.json"),
            "--class",
            example.cls,
            # The node's runtime, named so that the render does not depend on which runtime
            # this machine has on PATH: a current one, which reads every version and moves
            # network interfaces.
            "--runtime",
            RUNTIME,
        ],
    )
    return result.exit_code, result.stdout_bytes, result.stderr


def main() -> int:
    """Write every example's spec anew; 1 if one does not render."""
    failed = 0
    for example in examples():
        code, out, err = render(example)
        where = example.spec.relative_to(REPO)
        sys.stderr.write(err)
        if code != 0:
            print(f"{where}: cdi-gen render exited {code}", file=sys.stderr)
            failed += 1
            continue
        example.spec.write_bytes(out)
        print(f"wrote {where}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
