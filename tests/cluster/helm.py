"""Helm, built from its Go module like the lanes' programs, for the chart's tests.

No Debian package ships Helm 3.22, so ``helm.sh/helm/v3/cmd/helm`` is built from the release
pinned in ``tools/helm/go.mod`` by ``build.py`` into ``/var/cache/cdi-gen-test/helm/``: a warm
run builds nothing. ``setup.py`` builds it (``scripts/setup.sh test`` runs that); the tests only
look it up, so a missing build fails them naming the setup command instead of spending minutes.
"""

from __future__ import annotations

import re
from pathlib import Path

from containerd.fetch import CACHE_ROOT

from .build import HERE, Binaries, GoProgram, build

PIN = HERE / "tools" / "helm"
# <root>/helm/helm: the layout of a lane (<root>/<lane>/<program>), so build.py finds the
# shared Go toolchain folder <root>/go two levels up.
CACHE = CACHE_ROOT / "helm" / "helm"
_PACKAGE = "helm.sh/helm/v3"
_CLIENT_GO = re.compile(r"^\s*k8s\.io/client-go v0\.(\d+)\.\d+", re.M)


def _ldflags(version: str) -> str:
    # What Helm's Makefile stamps. Without the version `helm version` says "v3.22"; without
    # the Kubernetes version `helm lint` and `.Capabilities.KubeVersion` assume client-go's
    # default instead of the 1.<minor> the release was built against.
    found = _CLIENT_GO.search((PIN / "go.mod").read_text())
    minor = found.group(1) if found else "0"
    flags = ["-s", "-w", f"-X {_PACKAGE}/internal/version.version={version}",
             f"-X {_PACKAGE}/internal/version.gitTreeState=clean"]  # fmt: skip
    for package in ("pkg/lint/rules", "pkg/chartutil"):
        flags += [f"-X {_PACKAGE}/{package}.k8sVersionMajor=1",
                  f"-X {_PACKAGE}/{package}.k8sVersionMinor={minor}"]  # fmt: skip
    return " ".join(flags)


PROGRAM = GoProgram("helm", _PACKAGE, PIN, (f"{_PACKAGE}/cmd/helm",), _ldflags)


def helm_build(*, allow_build: bool = False) -> Binaries:
    """Helm's binaries (raises BuildError naming the setup command when not built)."""
    return build(PROGRAM, CACHE, allow_build=allow_build)


def helm(*, allow_build: bool = False) -> Path:
    """The ``helm`` binary of the pinned release."""
    return helm_build(allow_build=allow_build).path("helm")
