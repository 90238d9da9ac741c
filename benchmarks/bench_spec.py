"""Spec building, validation and serialisation cost, and CLI start-up wall time.

python benchmarks/bench_spec.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import Row, best_ms, cli_env, print_table

from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.cdi.codec import dump_document, load_spec

N = 10_000
REPO = Path(__file__).resolve().parent.parent


def _edits(i: int) -> dict[str, object]:
    return {"deviceNodes": [{"path": f"/dev/dfl-port.{i}"}], "env": [f"FPGA_PORT={i}"]}


def _cold() -> bytes:
    entries = [build_entry(f"fpga-{i}", _edits(i)) for i in range(N)]
    return dump_document(assemble("example.com/fpga", entries))


def _cli_ms(args: list[str], repeat: int) -> float:
    env = cli_env()

    def once() -> None:
        subprocess.run(
            [sys.executable, "-m", "cdi_gen", *args],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )

    once()  # writes the bytecode an installed package would have
    return best_ms(once, repeat)


def run(quick: bool = False) -> list[Row]:
    repeat = 3 if quick else 10
    entries = [build_entry(f"fpga-{i}", _edits(i)) for i in range(N)]
    doc = assemble("example.com/fpga", entries)
    floor = best_ms(lambda: orjson.dumps(doc, option=orjson.OPT_INDENT_2), repeat)
    cold = best_ms(_cold, repeat)
    warm = best_ms(lambda: dump_document(assemble("example.com/fpga", entries)), repeat)
    data = dump_document(doc)
    parse = best_ms(lambda: load_spec(data), max(1, repeat // 3))
    rows: list[Row] = [
        ("bare orjson.dumps, 10k devices", f"{floor:.2f} ms", "floor"),
        (
            "re-assemble + serialise after a change, 10k",
            f"{warm:.2f} ms ({warm / floor:.1f}x)",
            "<= 3x floor",
        ),
        (
            "build + validate + serialise from scratch, 10k",
            f"{cold:.1f} ms ({cold / floor:.0f}x)",
            "<= 3x floor",
        ),
        ("parse + validate a 10k-device file (models)", f"{parse:.0f} ms", "-"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "example.com-fpga.json"
        small.write_bytes(dump_document(assemble("example.com/fpga", entries[:4])))
        validate_ms = _cli_ms(["validate", str(small)], repeat)
        rows.append(("cdi-gen validate (4 devices) wall", f"{validate_ms:.0f} ms", "-"))
    samples = REPO / "cdi-samples" / "source"
    render = [
        "render",
        "--config",
        str(samples / "config.yaml"),
        "--records",
        str(samples / "records.json"),
        "--class",
        "fpga",
    ]
    rows.append(
        (
            "cdi-gen render (recorded fpga class) wall",
            f"{_cli_ms(render, repeat):.0f} ms",
            "<= 300 ms",
        )
    )
    rows.append(
        (
            "cdi-gen render --class loop (this machine) wall",
            f"{_cli_ms(['render', '--class', 'loop'], repeat):.0f} ms",
            "<= 300 ms",
        )
    )
    rows.append(("cdi-gen --help wall", f"{_cli_ms(['--help'], repeat):.0f} ms", "-"))
    return rows


if __name__ == "__main__":
    print_table("spec building", run("--quick" in sys.argv))
