"""Helm 3 and Helm 4, built from their Go modules like the lanes' programs, for the chart's tests.

The chart is a Helm 3 API chart (apiVersion v2) that both majors install; the unit tests render
and lint it with each, the cluster test installs it with Helm 3. No Debian package ships Helm
3.22 or 4.3, so ``helm.sh/helm/v3/cmd/helm`` and ``helm.sh/helm/v4/cmd/helm`` are built from the
releases pinned in ``tools/helm/go.mod`` and ``tools/helm4/go.mod`` by ``build.py`` into
``/var/cache/cdi-gen-test/helm/``: a warm run builds nothing. ``setup.py`` builds them
(``scripts/setup.sh test`` runs that); the tests only look them up, so a missing build fails
them naming the setup command instead of spending minutes.
"""

from __future__ import annotations

import re
from pathlib import Path

from containerd.fetch import CACHE_ROOT

from .build import HERE, Binaries, GoProgram, build

# <root>/helm/helm: the layout of a lane (<root>/<lane>/<program>), so build.py finds the
# shared Go toolchain folder <root>/go two levels up.
CACHE = CACHE_ROOT / "helm" / "helm"
_CLIENT_GO = re.compile(r"^\s*k8s\.io/client-go v0\.(\d+)\.\d+", re.M)


def _helm3_ldflags(version: str) -> str:
    # What Helm 3's Makefile stamps. Without the version `helm version` says "v3.22"; without
    # the Kubernetes version `helm lint` and `.Capabilities.KubeVersion` assume client-go's
    # default instead of the 1.<minor> the release was built against (Helm 4 reads that from
    # its build information).
    found = _CLIENT_GO.search((HERE / "tools/helm/go.mod").read_text())
    minor = found.group(1) if found else "0"
    package = "helm.sh/helm/v3"
    flags = ["-s", "-w", f"-X {package}/internal/version.version={version}",
             f"-X {package}/internal/version.gitTreeState=clean"]  # fmt: skip
    for stamped in ("pkg/lint/rules", "pkg/chartutil"):
        flags += [f"-X {package}/{stamped}.k8sVersionMajor=1",
                  f"-X {package}/{stamped}.k8sVersionMinor={minor}"]  # fmt: skip
    return " ".join(flags)


def _helm4_ldflags(version: str) -> str:
    package = "helm.sh/helm/v4/internal/version"
    return f"-s -w -X {package}.version={version} -X {package}.gitTreeState=clean"


PROGRAMS = {
    "helm3": GoProgram(
        "helm", "helm.sh/helm/v3", HERE / "tools/helm", ("helm.sh/helm/v3/cmd/helm",),
        _helm3_ldflags,
    ),
    "helm4": GoProgram(
        "helm", "helm.sh/helm/v4", HERE / "tools/helm4", ("helm.sh/helm/v4/cmd/helm",),
        _helm4_ldflags,
    ),
}  # fmt: skip


def helm_build(major: str = "helm3", *, allow_build: bool = False) -> Binaries:
    """One Helm's binaries (raises BuildError naming the setup command when not built)."""
    return build(PROGRAMS[major], CACHE, allow_build=allow_build)


def helm(major: str = "helm3", *, allow_build: bool = False) -> Path:
    """The ``helm`` binary of a pinned release: ``helm3`` or ``helm4``."""
    return helm_build(major, allow_build=allow_build).path("helm")
