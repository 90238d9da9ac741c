"""A real single-node Kubernetes cluster for tests: built, started and stopped by the suite.

kubelet, kube-apiserver, kube-scheduler, kube-controller-manager and kubectl are built from the Go
module ``k8s.io/kubernetes`` pinned per lane in ``lanes/<lane>/kubernetes/go.mod`` (``lane.py``,
``build.py``), containerd 2.3 and CRI-O 1.36 likewise; etcd and containerd 1.7 are Debian 13's
packages unpacked privately (``dist.py``); ``setup.py`` prepares all of it once.
The containerd machinery of ``tests/e2e/containerd`` (config from ``deploy/containerd``, the
daemon, the busybox image, package fetching) is reused, so ``tests/e2e`` joins ``sys.path`` here.
"""

from __future__ import annotations

import sys
from pathlib import Path

_E2E = str(Path(__file__).resolve().parent.parent / "e2e")
if _E2E not in sys.path:
    sys.path.append(_E2E)
