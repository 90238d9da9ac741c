"""A Python program run in a private mount namespace (``unshare --mount``), where a test may
mount a small tmpfs or bind a file over a kernel one without touching the machine's mounts:
the integration tier's full-disk and reboot scenarios."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_private(args: list[str], *, cwd: Path | None = None, timeout: float = 100) -> str:
    """Run ``python ARGS`` in a private mount namespace; its standard output. Fails the test,
    with both outputs, when it does not exit 0 or a tool is missing."""
    for tool in ("unshare", "mount"):
        assert shutil.which(tool), f"{tool} is needed for this test (util-linux)"
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def reported(stdout: str, prefix: str) -> Any:
    """The one JSON document the program printed after ``prefix`` (e.g. ``"STEPS "``)."""
    [line] = [x for x in stdout.splitlines() if x.startswith(prefix)]
    return json.loads(line.removeprefix(prefix))
