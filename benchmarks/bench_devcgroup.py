"""A container's device access changed in place, with the real kernel: what ``follow`` pays
per cgroup when a device comes back with new numbers.

    python benchmarks/bench_devcgroup.py [--quick]

cgroup v2: a 30-rule list (runc's 11 defaults, a deny-all and 18 devices of the spec) is
attached to a fresh cgroup v2 child; each replacement builds the program for the list with one
device moved (rules read, access computed, assembled), loads it, lists the cgroup's programs,
opens the attached one by ID and swaps it with ``BPF_F_REPLACE``, then closes every
descriptor; the lists alternate so every replacement changes something. The floor, timed in
the same run, is one bare ``BPF_PROG_QUERY`` on the same cgroup (the cheapest of the four
calls). cgroup v1: the pair ``follow`` writes (allow the new numbers, deny the old ones, each
file opened, written and closed beneath the held cgroup folder) against a bare ``write`` of one
rule to a ``devices.allow`` already open. The v2 rows also say where the time goes: the
program built in Python, and its load (the kernel's verifier and JIT).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import Row, percentile, print_table, timed

from cdi_gen.devcgroup.access import DeviceAccess
from cdi_gen.devcgroup.bpf import Bpf
from cdi_gen.devcgroup.cgroupv1 import DEVICES_HIERARCHY, DevicesCgroup
from cdi_gen.devcgroup.cgroupv2 import UNIFIED_HIERARCHY, ProgramCgroup
from cdi_gen.devcgroup.program import assemble, encode
from cdi_gen.devcgroup.rules import DeviceRule, moved, parse_oci_devices, with_runc_defaults

#: The share of follow's one-second budget (udev event to the device usable) one cgroup may
#: take: a node with a few dozen containers holding the device still fits.
TARGET_MS = 10.0
SPEC = [
    {"allow": False, "access": "rwm"},
    *({"allow": True, "type": "c", "major": 188, "minor": i, "access": "rw"} for i in range(18)),
]
RULES = with_runc_defaults(parse_oci_devices(SPEC))
MOVED = moved(RULES, "c", (188, 0), (188, 100))


@contextmanager
def _cgroup(hierarchy: str) -> Iterator[str]:
    path = f"{hierarchy}/cdi-gen-bench-{uuid.uuid4().hex[:12]}"
    os.mkdir(path)
    try:
        yield path
    finally:
        os.rmdir(path)


def _ms(samples: list[float]) -> tuple[float, float]:
    return percentile(samples, 50) * 1e3, percentile(samples, 99) * 1e3


def _v2(n: int) -> list[Row]:
    bpf = Bpf()
    with _cgroup(UNIFIED_HIERARCHY) as path, ProgramCgroup(path, bpf=bpf) as cgroup:
        current = [cgroup.attach(RULES)]
        lists = [MOVED, RULES]

        def replace() -> None:
            current[0] = cgroup.replace(lists[len(current) % 2], expected=current[0])
            current.append(current[0])

        replacements = timed(replace, n)
        assert cgroup.attached() == [current[0]]
        floor = timed(cgroup.attached, n)
    # Where the time goes: the program built in Python, and the kernel's load (verifier, JIT).
    build = timed(lambda: encode(assemble(DeviceAccess.of(MOVED))), n)
    code = encode(assemble(DeviceAccess.of(MOVED)))
    load = timed(lambda: os.close(bpf.load(code)), n)
    (p50, p99), (f50, f99) = _ms(replacements), _ms(floor)
    return [
        (f"v2 replace, {len(RULES)} rules: p50", f"{p50:.3f} ms", ""),
        (f"v2 replace, {len(RULES)} rules: p99", f"{p99:.3f} ms", f"< {TARGET_MS:g} ms"),
        ("v2 floor, bare BPF_PROG_QUERY: p50 / p99", f"{f50:.4f} / {f99:.4f} ms", ""),
        ("v2 replace / floor (p50)", f"{p50 / f50:.0f}x", ""),
        ("v2 of which rules -> program bytes: p50", f"{_ms(build)[0]:.3f} ms", ""),
        (f"v2 of which BPF_PROG_LOAD ({len(code) // 8} insns): p50", f"{_ms(load)[0]:.3f} ms", ""),
    ]


def _v1(n: int) -> list[Row]:
    new, old = DeviceRule(True, "c", 188, 100, 6), DeviceRule(False, "c", 188, 0, 6)
    with _cgroup(DEVICES_HIERARCHY) as path, DevicesCgroup(path) as cgroup:
        cgroup.apply(RULES)
        moves = [0]

        def pair() -> None:
            # Forth and back, so that every pair changes the cgroup.
            there = moves[0] % 2 == 0
            cgroup.allow(new if there else old)
            cgroup.deny(old if there else new)
            moves[0] += 1

        pairs = timed(pair, n)
        fd = os.open(f"{path}/devices.allow", os.O_WRONLY)
        try:
            floor = timed(lambda: os.write(fd, b"c 188:0 rw"), n)
        finally:
            os.close(fd)
    (p50, p99), (f50, f99) = _ms(pairs), _ms(floor)
    return [
        ("v1 allow + deny pair: p50", f"{p50:.3f} ms", ""),
        ("v1 allow + deny pair: p99", f"{p99:.3f} ms", f"< {TARGET_MS:g} ms"),
        ("v1 floor, bare write of one rule: p50 / p99", f"{f50:.4f} / {f99:.4f} ms", ""),
        ("v1 pair / floor (p50)", f"{p50 / f50:.1f}x", ""),
    ]


def run(quick: bool = False) -> list[Row]:
    """Measure; return rows of (metric, measured value, target)."""
    if os.geteuid() != 0:
        return [("device cgroup changes", "skipped: needs root", "")]
    n = 50 if quick else 200
    return _v2(n) + _v1(n)


if __name__ == "__main__":
    print_table("devcgroup", run(quick="--quick" in sys.argv[1:]))
