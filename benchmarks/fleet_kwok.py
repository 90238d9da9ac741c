"""kwok, the fleet benchmark's fake kubelets: built from its Go module, started as one process.

The ``kwok`` controller (``sigs.k8s.io/kwok/cmd/kwok``, pinned in ``benchmarks/kwok/go.mod``)
is built by the cluster tests' machinery (``tests/cluster/build.py``) into
``/var/cache/cdi-gen-test/kwok/``. It manages every Node of a control plane without kubelets:
the Nodes we create become Ready and keep a Lease, and their pods are marked Running once
scheduled and removed once deleted. What it does is told by its Stage objects, which the
controller itself does not carry (kwokctl does): the stages of the pinned release are read from
its module source, which the Go module cache holds after the build.
"""

from __future__ import annotations

import os
from pathlib import Path

import _cluster  # noqa: F401  (puts tests/ on sys.path)
from cluster.build import GoProgram, build, module_source
from cluster.process import Component
from containerd.fetch import CACHE_ROOT

PIN = Path(__file__).resolve().parent / "kwok"
CACHE = CACHE_ROOT / "kwok" / "kwok"
#: The stages of the pinned release, as kwokctl runs its clusters: Nodes Ready with a Lease
#: (heartbeat), pods Running when scheduled, a Job's pods completed, deleted pods removed.
STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
#: Seconds a Node's Lease lasts; kwok renews it, so the node lifecycle controller keeps the
#: fake Nodes Ready as it would real ones.
LEASE_SECONDS = 40


def program() -> GoProgram:
    return GoProgram(
        "kwok",
        "sigs.k8s.io/kwok",
        PIN,
        ("sigs.k8s.io/kwok/cmd/kwok",),
        # Its version constants already name the release; nothing to stamp.
        lambda version: "-s -w",
    )


def binary() -> tuple[Path, float]:
    """The kwok binary (built on first use) and the seconds its cold build took."""
    built = build(program(), CACHE)
    return built.path("kwok"), built.cold_seconds


def stages(out: Path) -> Path:
    """The release's stages in one YAML file at ``out``, read from its module source
    (``go mod download`` of the pinned version: nothing when the cache holds it)."""
    go = Path(os.environ.get("CDI_GEN_GO") or "/usr/local/go/bin/go")
    source = module_source(go, "sigs.k8s.io/kwok", PIN, goflags="-mod=readonly")
    out.write_text("\n---\n".join((source / stage).read_text() for stage in STAGES))
    return out


def kwok(kubeconfig: Path, work: Path, logs: Path) -> Component:
    """The kwok controller managing every Node of the cluster (not started)."""
    path, _ = binary()
    config = stages(work / "kwok-stages.yaml")
    return Component(
        "kwok",
        [
            str(path),
            "--kubeconfig", str(kubeconfig),
            "--config", str(config),
            "--manage-all-nodes=true",
            "--node-lease-duration-seconds", str(LEASE_SECONDS),
            # Room for every pod's address (its default is one /24).
            "--cidr", "10.128.0.0/12",
            "--node-ip", "10.127.0.1",
        ],
        logs / "kwok.log",
        {"HOME": str(work)},
    )  # fmt: skip
