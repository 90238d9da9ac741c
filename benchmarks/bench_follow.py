"""The ``follow`` step of a device that came back, with the real kernel: what one holding
container costs, cgroups and node together.

    python benchmarks/bench_follow.py [--quick]

The container is a real process in a private mount namespace with a tmpfs on its ``/dev``,
in a fresh cgroup v1 devices child and a fresh cgroup v2 child whose device program holds
runc's defaults and the device's rule. Each run is one ``follow`` call for that one holder:
v1 allow, v2 program replaced (old and new numbers), the node replaced in the namespace, v1
deny, v2 program replaced again (the runtime's rules moved); the device alternates between
``c 1:3`` and ``c 1:5`` so every call changes something. The floor, timed in the same run on
the same container, is ``replace_node`` alone: the node without the cgroups.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import Row, percentile, print_table, timed

from cdi_gen.agent.follow import CameBack, Hierarchies, Holder, follow
from cdi_gen.containernode.node import ContainerProcess, DeviceNode
from cdi_gen.containernode.replace import replace_node
from cdi_gen.devcgroup.cgroupv1 import DEVICES_HIERARCHY, DevicesCgroup
from cdi_gen.devcgroup.cgroupv2 import UNIFIED_HIERARCHY, ProgramCgroup
from cdi_gen.devcgroup.rules import moved, parse_oci_devices, with_runc_defaults

#: follow's budget is a second from udev event to device usable, for every holder: one
#: holder's share, as for the node alone (benchmarks/bench_containernode.py).
TARGET_MS = 60.0
RUNS = 30
CONTAINER = (
    "import os, stat, subprocess, sys\n"
    "subprocess.run(['mount', '-t', 'tmpfs', 'cdi-gen-bench-dev', '/dev'], check=True)\n"
    "os.mknod('/dev/held', stat.S_IFCHR | 0o660, os.makedev(1, 3))\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)


def _ms(samples: list[float]) -> tuple[float, float]:
    return percentile(samples, 50) * 1e3, percentile(samples, 99) * 1e3


def _measure(cgroup: str) -> tuple[list[float], list[float]]:
    spec = [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"},
    ]
    rules = with_runc_defaults(parse_oci_devices(spec), ["/dev/null", "/dev/zero"])
    with DevicesCgroup(DEVICES_HIERARCHY + cgroup) as v1:
        v1.apply(rules)
    with ProgramCgroup(UNIFIED_HIERARCHY + cgroup) as v2:
        v2.attach(rules)
    container = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", CONTAINER],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert container.stdout is not None and container.stdout.readline() == "ready\n"
        for hierarchy in (DEVICES_HIERARCHY, UNIFIED_HIERARCHY):
            Path(hierarchy + cgroup, "cgroup.procs").write_text(str(container.pid))
        at = ContainerProcess.now(container.pid)
        assert at is not None
        where = Hierarchies.now()
        minor, current = [3], [rules]

        def one() -> None:
            old, new = minor[0], 8 - minor[0]  # 3 <-> 5
            came = CameBack("held", DeviceNode("/dev/held", "c", 1, new, 0o660, 0, 5), (1, old))
            [result] = follow(came, [Holder("bench/pod/c", at, cgroup, current[0])], where)
            assert result.status == "done", result.line
            current[0], minor[0] = moved(current[0], "c", (1, old), (1, new)), new

        one()  # the first call writes the bytecode an installed package has
        follows = timed(one, RUNS)
        nodes = [DeviceNode("/dev/held", "c", 1, minor, 0o660, 0, 5) for minor in (3, 5)]
        calls = [0]

        def node() -> None:
            result = replace_node(at, nodes[calls[0] % 2])
            calls[0] += 1
            assert result.done, result.line

        floor = timed(node, RUNS)
    finally:
        assert container.stdin is not None
        container.stdin.close()
        container.wait(10)
    return follows, floor


def run(quick: bool = False) -> list[Row]:
    """Measure; return rows of (metric, measured value, target)."""
    del quick  # 30 runs either way: the figure the issue asks for
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return [("follow, one holder", "skipped: needs root and unshare", "")]
    cgroup = f"/cdi-gen-bench-{uuid.uuid4().hex[:12]}"
    folders = [DEVICES_HIERARCHY + cgroup, UNIFIED_HIERARCHY + cgroup]
    for folder in folders:
        os.mkdir(folder)
    try:
        follows, floor = _measure(cgroup)
    finally:
        for folder in folders:
            os.rmdir(folder)
    (p50, p99), (f50, f99) = _ms(follows), _ms(floor)
    return [
        (f"follow, one holder, cgroups v1+v2 and node ({RUNS} runs): p50", f"{p50:.2f} ms", ""),
        (
            f"follow, one holder, cgroups v1+v2 and node ({RUNS} runs): p99",
            f"{p99:.2f} ms",
            f"< {TARGET_MS:g} ms",
        ),
        (f"floor, replace_node alone ({RUNS} runs): p50 / p99", f"{f50:.2f} / {f99:.2f} ms", ""),
        ("follow / floor (p50)", f"{p50 / f50:.2f}x", ""),
    ]


if __name__ == "__main__":
    print_table("follow", run(quick="--quick" in sys.argv[1:]))
