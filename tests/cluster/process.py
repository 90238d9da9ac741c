"""One cluster component as a child process: its log file, its readiness, its orderly end.

Processes are stopped by their PID (SIGTERM, then SIGKILL), never by name: other sessions on the
same machine run their own etcd, kubelet or containerd.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from processes import terminate


class ComponentError(RuntimeError):
    """A component did not start or died; the message names it and quotes its log."""


@dataclass
class Component:
    name: str
    argv: Sequence[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    #: Seconds from spawn to ready at the last start.
    ready_seconds: float = 0.0

    def start(self) -> None:
        # Append: a restarted component keeps its earlier log for the failure report.
        with open(self.log_path, "ab") as log:
            log.write(f"===== {self.name} starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.env},
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, ready: Callable[[], bool], timeout: float, started: float) -> None:
        """Poll ``ready`` until true; fail naming the component if it exits or times out."""
        deadline = started + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise ComponentError(
                    f"{self.name} exited {self.process.returncode} while starting:\n"
                    f"{self.log_tail()}"
                )
            try:
                if ready():
                    self.ready_seconds = time.monotonic() - started
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ComponentError(
                    f"{self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self, grace: float = 10.0) -> None:
        if self.process is not None:
            terminate(self.process, grace)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return f"({self.log_path}: no log)"
        return "\n".join(text.splitlines()[-lines:])
