"""Shared helpers of the benchmark scripts: timing and the result table.

Importing it also puts the repository root on ``sys.path``, so that benchmarks run as
``python benchmarks/bench_x.py`` can use the test fixtures (fake kubelet, loop devices).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(1, _REPO)

Row = tuple[str, str, str]


def cli_env() -> dict[str, str]:
    """The environment for timing ``cdi-gen`` processes as installed ones run.

    A sandbox may set PYTHONDONTWRITEBYTECODE, which makes every start compile the package
    from source (~50 ms); an installed package has its bytecode, so the timed runs get it
    too (the first, untimed run writes it).
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    """Fastest of ``repeat`` runs in milliseconds (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def timed(call: Callable[[], object], n: int) -> list[float]:
    """The seconds each of ``n`` calls took, in order."""
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0-100) of ``samples`` by linear interpolation."""
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[int(q) - 1]


def print_table(title: str, rows: list[Row]) -> None:
    widths = [max(len(r[i]) for r in [("metric", "value", "target"), *rows]) for i in range(3)]
    print(f"\n## {title}")
    header = ("metric", "value", "target")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
