"""A device node replaced inside a running container, with the real kernel: what ``follow``
pays per container for the node.

    python benchmarks/bench_containernode.py [--quick]

The container is a real process in a private mount namespace with a tmpfs on its ``/dev``
holding a stale node; each replacement is one ``replace_node`` call (a child process of the
same interpreter started isolated, pidfd, start time, ``setns``, the node made beside the
stale one, owned, and renamed over it), alternating between two numbers so every call changes
something. The floor, timed in the same run, is the child alone: the same interpreter started
with the same flags and exiting at once (``python -I -S -c pass``). The share of the rest is what
the module's import and the calls in the namespace cost.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import Row, percentile, print_table, timed

from cdi_gen.containernode.node import ContainerProcess, DeviceNode
from cdi_gen.containernode.replace import CHILD, replace_node

#: The share of follow's one-second budget (udev event to the device usable) one container's
#: node may take: a node with a few dozen containers holding the device still fits.
TARGET_MS = 50.0
#: The floor's command as the table names it: the child's interpreter and flags.
FLOOR = " ".join(["python", *CHILD[1:3], "-c", "pass"])
CONTAINER = (
    "import os, stat, subprocess, sys\n"
    "subprocess.run(['mount', '-t', 'tmpfs', 'cdi-gen-bench-dev', '/dev'], check=True)\n"
    "os.mknod('/dev/ttyUSB0', stat.S_IFCHR | 0o600, os.makedev(1, 3))\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)


def _ms(samples: list[float]) -> tuple[float, float]:
    return percentile(samples, 50) * 1e3, percentile(samples, 99) * 1e3


def run(quick: bool = False) -> list[Row]:
    """Measure; return rows of (metric, measured value, target)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return [("container node replacement", "skipped: needs root and unshare", "")]
    n = 30 if quick else 100
    container = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", CONTAINER],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert container.stdout is not None and container.stdout.readline() == "ready\n"
        at = ContainerProcess.now(container.pid)
        assert at is not None
        nodes = [DeviceNode("/dev/ttyUSB0", "c", 1, minor, 0o660, 1000, 5) for minor in (5, 3)]
        calls = [0]

        def replace() -> None:
            result = replace_node(at, nodes[calls[0] % 2])
            calls[0] += 1
            assert result.done, result.line

        replace()  # the first call writes the bytecode an installed package has
        replacements = timed(replace, n)
    finally:
        assert container.stdin is not None
        container.stdin.close()
        container.wait(10)
    bare = [*CHILD[:3], "-c", "pass"]
    floor = timed(lambda: subprocess.run(bare, check=True), n)
    (p50, p99), (f50, f99) = _ms(replacements), _ms(floor)
    return [
        (f"replace one node in a namespace ({n} runs): p50", f"{p50:.2f} ms", ""),
        (
            f"replace one node in a namespace ({n} runs): p99",
            f"{p99:.2f} ms",
            f"< {TARGET_MS:g} ms",
        ),
        (f"floor, the child alone ({FLOOR}): p50 / p99", f"{f50:.2f} / {f99:.2f} ms", ""),
        ("replace / floor (p50)", f"{p50 / f50:.2f}x", ""),
    ]


if __name__ == "__main__":
    print_table("containernode", run(quick="--quick" in sys.argv[1:]))
