"""podman with a private image store, set up the way the project's machines need.

Shared by the e2e tests (tests/e2e/consumers.py) and the agent image build
(tests/cluster/image.py), so that both drive podman with the same settings. Named after what
it provides, not ``podman``: pytest puts test folders on ``sys.path``, and a module named like a
program or a package would be shadowed or shadow one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# The VM lacks CAP_SYS_RESOURCE (podman's default ulimits fail) and crun refuses the hybrid
# cgroup layout; events go to a file because there is no journald.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
events_logger = "file"
cgroup_manager = "cgroupfs"
"""


@dataclass(frozen=True)
class PodmanStore:
    """podman with its image store, run state and containers.conf under ``home``."""

    home: Path

    @property
    def conf(self) -> Path:
        return self.home / "containers.conf"

    def write_conf(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(CONTAINERS_CONF)

    def argv(self, args: Sequence[str | Path]) -> list[str]:
        return [
            "podman",
            "--root",
            str(self.home / "storage"),
            "--runroot",
            str(self.home / "runroot"),
            "--tmpdir",
            str(self.home / "tmp"),
            "--storage-driver",
            "overlay",
            *map(str, args),
        ]

    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}
