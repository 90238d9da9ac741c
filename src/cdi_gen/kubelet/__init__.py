"""What both kubelet features (:mod:`cdi_gen.deviceplugin`, :mod:`cdi_gen.dra`) use to speak
to the kubelet over gRPC.

* :mod:`~cdi_gen.kubelet.transport`: unix socket files and the synchronous gRPC server every
  kubelet plugin serves on;
* :mod:`~cdi_gen.kubelet.supervisor`: serve, register, notice a kubelet restart, serve and
  register again (the device plugin's Register call, the DRA plugin's plugin-watcher socket);
* :mod:`~cdi_gen.kubelet.registration`: the plugin watcher's ``pluginregistration`` socket;
* :mod:`~cdi_gen.kubelet.socketwatch`: inotify on the kubelet's socket folders;
* :mod:`~cdi_gen.kubelet.streams`: server streams following a versioned value;
* :mod:`~cdi_gen.kubelet.boundary`: where the gRPC server's threads meet the agent's loop;
* :mod:`~cdi_gen.kubelet.podresources`: which containers hold a device, from the kubelet's
  pod-resources socket;
* :mod:`~cdi_gen.kubelet.containers`: those containers' processes and OCI specs, from the
  runtime's CRI socket,
  both through :mod:`cdi_gen.localclient`, the short-lived, bounded client of a local socket.

grpc reads ``GRPC_EXPERIMENTS`` once, when it is first imported: a process that serves
kubelet plugins calls :func:`apply_grpc_experiments` before anything loads grpc (``cdi-gen
run`` does, first thing). Importing the package changes nothing.
"""

from __future__ import annotations

import os
import sys

__all__ = ["GRPC_EXPERIMENTS", "apply_grpc_experiments"]

#: grpc core experiments cdi-gen turns off. The event-engine listener adds ~30 µs to every
#: call a client in another process makes (the kubelet is one), a quarter of Allocate's time.
#: An experiment name may disappear in a later grpcio; tests check the installed one still
#: knows it (grpc only logs an unknown name, so a stale one would cost speed, not service).
GRPC_EXPERIMENTS = "-event_engine_listener"


def apply_grpc_experiments() -> bool:
    """Add :data:`GRPC_EXPERIMENTS` to the environment unless grpc is loaded already.

    An operator's own ``GRPC_EXPERIMENTS`` is kept, and wins for any experiment it names.
    Returns whether grpc will see the setting.
    """
    if "grpc" in sys.modules:
        return False
    current = os.environ.get("GRPC_EXPERIMENTS", "")
    named = {item.strip().lstrip("-") for item in current.split(",") if item.strip()}
    ours = [e for e in GRPC_EXPERIMENTS.split(",") if e.lstrip("-") not in named]
    if ours:
        os.environ["GRPC_EXPERIMENTS"] = ",".join([*filter(None, [current]), *ours])
    return True
