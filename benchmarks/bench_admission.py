"""The admission webhook's memory under a flood, against the Deployment's limit.

    python benchmarks/bench_admission.py [--quick]

A real ``cdi-gen admission`` process (tests/admissionload.py) and, at once, one TLS client
per body: valid reviews at the body limit (3 MiB: the API server's own request limit), JSON
at the limit that decodes to the most objects (``[{},{},...]``, refused unread beyond the
values bound), and the heaviest JSON still decoded (one object of distinct keys, just under
the bound). Rows: the process's RSS idle and its peak (VmHWM) over the flood, against the
container's memory limit (128 MiB in deploy/). The same flood is the test
``tests/integration/test_admission_limits.py``; before the bounds its peak was 255 MiB.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

from _table import Row, print_table

from cdi_gen.admission.https import AdmissionLimits
from tests.admissionload import (
    MIB,
    admission_process,
    bomb_body,
    flood,
    keys_body,
    peak_rss,
    review_body,
)
from tests.pki import Authority

#: The container's limit, as deploy/kubernetes/admission and the chart set it.
LIMIT_MIB = 128


def run(quick: bool = False) -> list[Row]:
    limits = AdmissionLimits()
    scale = 1 if quick else 2
    bodies = (
        [review_body(limits.max_body)] * (40 * scale)
        + [bomb_body(limits.max_body)] * (8 * scale)
        + [keys_body(limits.max_body_values - 1)] * (8 * scale)
    )
    with tempfile.TemporaryDirectory(prefix="cg-bench-admission-") as tmp:
        ca = Authority(Path(tmp))
        pair = ca.issue("w", "cdi-gen-admission", ips=("127.0.0.1",), server=True)
        with admission_process(pair.cert, pair.key, ca.cert) as (proc, port):
            idle = peak_rss(proc.pid)
            answers = Counter(flood(port, ca.cert, bodies))
            peak = peak_rss(proc.pid)
    label = f"{len(bodies)} clients at once, 3 MiB bodies"
    return [
        ("cdi-gen admission RSS, idle", f"{idle / MIB:.0f} MiB", ""),
        (f"peak RSS, {label}", f"{peak / MIB:.0f} MiB", f"< {LIMIT_MIB} MiB (the limit)"),
        (
            "answers (status: clients)",
            ", ".join(f"{k}: {v}" for k, v in sorted(answers.items(), key=str)),
            "",
        ),
    ]


if __name__ == "__main__":
    print_table("admission", run("--quick" in sys.argv))
