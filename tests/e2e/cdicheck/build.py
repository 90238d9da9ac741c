"""How to build cdicheck offline against Debian's Go CDI library (GOPATH mode, no proxy).

Shared by the e2e fixture and the validate benchmark, which differ only in how they report a
failure; it imports nothing from pytest.
"""

from __future__ import annotations

import os
from pathlib import Path

CDICHECK_SRC = Path(__file__).resolve().parent
GO_CDI_SRC = Path(
    "/usr/share/gocode/src/github.com/container-orchestrated-devices/container-device-interface"
)


def build_command(go: str, workdir: Path) -> tuple[list[str], dict[str, str], Path]:
    """(argv, environment, binary path) of the build; run it with cwd=CDICHECK_SRC."""
    binary = workdir / "cdicheck"
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": f"{workdir / 'gopath'}:/usr/share/gocode",
        "GOPROXY": "off",
        "GOFLAGS": "",
        "GOCACHE": str(workdir / "gocache"),
        "CGO_ENABLED": "0",
    }
    return [go, "build", "-o", str(binary), "."], env, binary
