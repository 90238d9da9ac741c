"""Ending a process a test or benchmark started, as the kubelet ends a pod's: SIGTERM, a grace
period to exit, then SIGKILL.

One helper for every harness that starts a daemon (the cluster's components and agents, the
e2e runtimes and agents, the benchmarks' agents), so that none waits forever on a process
that ignores SIGTERM and each stops the same way.
"""

from __future__ import annotations

import signal
import subprocess
from typing import Any


def terminate(process: subprocess.Popen[Any], grace: float = 10.0) -> int | None:
    """End ``process`` if it still runs: SIGTERM, ``grace`` seconds to exit, then SIGKILL.
    Its exit status, or None when it had to be killed."""
    if process.poll() is not None:
        return process.returncode
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
        return None
