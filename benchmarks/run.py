"""Run every benchmark and print one table per area.

    python benchmarks/run.py [--quick] [--only NAME[,NAME...]]

Each ``bench_*.py`` module exposes ``run(quick: bool) -> list[(metric, value, target)]``.
Benchmarks that need root or real runtimes say so in their rows instead of failing silently.
"""

from __future__ import annotations

import importlib
import platform
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _table import print_table  # noqa: E402


def main() -> int:
    quick = "--quick" in sys.argv
    only: set[str] = set()
    if "--only" in sys.argv:
        only = set(sys.argv[sys.argv.index("--only") + 1].split(","))
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    import os

    print(
        f"# cdi-gen benchmarks: {platform.node()}, {cpu}, {os.cpu_count()} cores, "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )
    failed = 0
    for path in sorted(HERE.glob("bench_*.py")):
        name = path.stem.removeprefix("bench_")
        if only and name not in only:
            continue
        try:
            rows = importlib.import_module(path.stem).run(quick)
        except Exception:
            failed += 1
            print(f"\n## {name}: FAILED")
            traceback.print_exc()
            continue
        print_table(name, rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
