"""The lanes of the cluster tests: which Kubernetes, which CRI runtime, which feature gates.

- ``current`` (the default of every cluster test): Kubernetes 1.37 and containerd 2.3 (the LTS),
  both built from their Go modules, containerd's config in its native version 4 with CDI left at
  its default (on), runc 1.5 built from its Go module (it applies OCI ``linux.netDevices``:
  network interfaces move into pods), and **no feature gates**: a cluster as users run it at
  the end of 2026.
- ``oldest``: Kubernetes 1.35 with Debian 13's containerd 1.7 (config version 2, CDI switched on
  as ``deploy/containerd/containerd-1.7-cdi.toml`` says), Debian 12's runc 1.1 and the DRA alpha
  gates of 1.35: the oldest pair we support (neither moves network interfaces). The
  device-plugin scenarios and one DRA scenario run here too
  (``@pytest.mark.lanes("current", "oldest")``).
- ``crio``: Kubernetes 1.36 with CRI-O 1.36, both built from their Go modules (CRI-O with cgo
  against Debian's libseccomp; conmon from Debian, runc the current lane's), cgroupfs, CDI at
  CRI-O's defaults and no feature gates (every DRA feature the tests use is on by default in
  1.36: see DRA_FEATURES). The runtime reads images from containers-storage, so images reach
  the node through ``podman load`` into CRI-O's own store (``crio.py``), not ``ctr images
  import``.

Every lane builds or fetches into its own folder ``/var/cache/cdi-gen-test/<lane>/``; etcd (Debian
13's 3.5, which both releases support) and the built runc (``/var/cache/cdi-gen-test/runc/``) are
shared. A lane whose parts cannot be had fails the tests that run on it, naming the lane and
the part; nothing skips.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from containerd.fetch import CACHE_ROOT

from .build import (
    HERE,
    Binaries,
    BuildError,
    GoProgram,
    build,
    containerd,
    crio,
    kubernetes,
    runc,
)
from .dist import FetchError, fetch_containerd

#: The features the DRA scenarios use, and where each matters: the apiserver keeps the
#: fields, the scheduler allocates with them, the controller-manager evicts, the kubelet
#: prepares and reports health. On by default from 1.36 or 1.37 (GA or beta); alpha in 1.35.
DRA_FEATURES = {
    # DeviceClass.spec.extendedResourceName: the apiserver keeps the field, the scheduler
    # allocates a pod's `limits: {vendor/class: 1}` through DRA, the kubelet prepares it.
    # GA (locked on) in 1.37.
    "DRAExtendedResource": ("kube-apiserver", "kube-scheduler", "kube-controller-manager",
                            "kubelet"),
    # Device taints in slices: kept by the apiserver, honoured by the scheduler, NoExecute
    # evictions by the controller-manager's device-taint-eviction controller. GA in 1.37.
    "DRADeviceTaints": ("kube-apiserver", "kube-scheduler", "kube-controller-manager"),
    # sharedCounters / consumesCounters in slices (kept by the apiserver, counted by the
    # scheduler): a shared device's slots. Beta, on, in 1.36 and 1.37.
    "DRAPartitionableDevices": ("kube-apiserver", "kube-scheduler"),
    # containerStatuses[].allocatedResourcesStatus: the kubelet fills it from the driver's
    # health stream, and the apiserver drops the field from pod status while the gate is off.
    # Beta, on, from 1.36 (so the crio lane sets none of these four either: each is on by
    # default in v1.36.3's pkg/features/kube_features.go).
    "ResourceHealthStatus": ("kube-apiserver", "kubelet"),
}  # fmt: skip


#: The node's CRI runtime, named as it names itself in the CRI Version answer.
RuntimeKind = Literal["containerd", "cri-o"]


@dataclass(frozen=True)
class Lane:
    name: str
    #: What the lane stands for (README's matrix says the same).
    proves: str
    kubernetes: GoProgram
    #: Which daemon serves the node's CRI socket.
    runtime: RuntimeKind
    #: The Go program the runtime is built from; None: Debian 13's containerd 1.7, unpacked
    #: (``dist.py``).
    runtime_program: GoProgram | None
    #: Set in every component; an unknown gate makes a component refuse to start, so each
    #: was checked against the release's pkg/features/kube_features.go.
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    #: The runc the runtime runs, built from its Go module into ``RUNC_CACHE`` (shared by the
    #: lanes that run it); None: Debian 12's ``DEBIAN_RUNC``.
    runc_program: GoProgram | None = None

    @property
    def cache(self) -> Path:
        return CACHE_ROOT / self.name

    @property
    def containerd_config_version(self) -> int:
        """containerd's native config format: 2 for 1.7, 4 for 2.3."""
        return 2 if self.runtime_program is None else 4

    def runtime_release(self) -> str | None:
        """The runtime's pinned release without its ``v`` (None for Debian's containerd)."""
        if self.runtime_program is None:
            return None
        return self.runtime_program.release().removeprefix("v")

    def binaries(self, *, allow_build: bool = True) -> Binaries:
        """The lane's Kubernetes binaries (raises :class:`LaneError` naming the lane)."""
        try:
            return build(self.kubernetes, self.cache / "kubernetes", allow_build=allow_build)
        except BuildError as exc:
            raise LaneError(f"lane {self.name}: Kubernetes: {exc}") from exc

    def runtime_build(self, *, allow_build: bool = True) -> Binaries | None:
        """The built runtime of the lane (None for Debian's containerd)."""
        program = self.runtime_program
        if program is None:
            return None
        try:
            return build(program, self.cache / program.name, allow_build=allow_build)
        except BuildError as exc:
            raise LaneError(f"lane {self.name}: {self.runtime}: {exc}") from exc

    def runtime_root(self, *, allow_build: bool = True) -> Path:
        """A root with the runtime's commands in ``usr/bin``: containerd's
        (``containerd``, ``containerd-shim-runc-v2``, ``ctr``) or CRI-O's (``crio``,
        ``pinns``)."""
        built = self.runtime_build(allow_build=allow_build)
        if built is not None:
            return built.bin.parent.parent
        try:
            return fetch_containerd()
        except FetchError as exc:
            raise LaneError(f"lane {self.name}: containerd 1.7: {exc}") from exc

    def runc_build(self, *, allow_build: bool = True) -> Binaries | None:
        """The lane's built runc (None: Debian's; raises :class:`LaneError` naming the lane)."""
        if self.runc_program is None:
            return None
        try:
            return build(self.runc_program, RUNC_CACHE, allow_build=allow_build)
        except BuildError as exc:
            raise LaneError(f"lane {self.name}: runc: {exc}") from exc

    def runc(self, *, allow_build: bool = True) -> Path:
        """The ``runc`` binary the lane's runtime runs."""
        built = self.runc_build(allow_build=allow_build)
        return DEBIAN_RUNC if built is None else built.path("runc")


#: Debian 12's runc (1.1.5): it ignores ``linux.netDevices``.
DEBIAN_RUNC = Path("/usr/sbin/runc")
#: <root>/runc/runc: the layout of a lane's program (<root>/<lane>/<program>), so build.py finds
#: the shared Go toolchain folder <root>/go two levels up.
RUNC_CACHE = CACHE_ROOT / "runc" / "runc"


class LaneError(RuntimeError):
    """A part of a lane could not be had; the message names the lane and the part."""


_LANES_DIR = HERE / "lanes"

CURRENT = Lane(
    "current",
    "Kubernetes 1.37 + containerd 2.3 (LTS) + runc 1.5, no feature gates: what users run",
    kubernetes(_LANES_DIR / "current/kubernetes"),
    "containerd",
    containerd(_LANES_DIR / "current/containerd"),
    runc_program=runc(HERE / "tools/runc"),
)
OLDEST = Lane(
    "oldest",
    (
        "Kubernetes 1.35 + containerd 1.7 (Debian's runc 1.1) with the DRA alpha gates: "
        "the oldest pair supported"
    ),
    kubernetes(_LANES_DIR / "oldest/kubernetes"),
    "containerd",
    None,
    dict.fromkeys(DRA_FEATURES, True),
)
CRIO = Lane(
    "crio",
    "Kubernetes 1.36 + CRI-O 1.36 (cgroupfs, conmon from Debian, runc 1.5), no feature gates: "
    "the other runtime users run",
    kubernetes(_LANES_DIR / "crio/kubernetes"),
    "cri-o",
    crio(_LANES_DIR / "crio/crio"),
    runc_program=runc(HERE / "tools/runc"),
)
LANES = {lane.name: lane for lane in (CURRENT, OLDEST, CRIO)}
