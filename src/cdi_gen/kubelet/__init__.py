"""The kubelet-facing consumers: the device plugin and the DRA driver; the only grpc user
(also of the runtime's CRI socket, asked for its version).

* :mod:`~cdi_gen.kubelet.transport`: unix socket files and the synchronous gRPC server every
  kubelet plugin serves on;
* :mod:`~cdi_gen.kubelet.supervisor`: serve, register, notice a kubelet restart, serve and
  register again, shared by every kubelet plugin (the device plugin's Register call, the DRA
  plugin's plugin-watcher socket);
* :mod:`~cdi_gen.kubelet.deviceplugin`: the ``deviceplugin/v1beta1`` plugin of one class;
* :mod:`~cdi_gen.kubelet.draplugin`: the DRA driver's node service (``dra.v1``/``v1beta1``,
  health), the gRPC side, with :mod:`~cdi_gen.kubelet.registration` (the plugin watcher's
  socket); the driver's state behind it, without grpc: :mod:`~cdi_gen.kubelet.preparer`
  (which claims are prepared), :mod:`~cdi_gen.kubelet.claims` (what a claim gets, pure) and
  :mod:`~cdi_gen.kubelet.checkpoint` (the prepared claims on disk);
* :mod:`~cdi_gen.kubelet.allocation`: the rules the device plugin's answers follow (the list
  it advertises is the class's :class:`~cdi_gen.discovery.board.DeviceBoard`);
* :mod:`~cdi_gen.kubelet.cri`: the container runtime's name and version from its CRI socket,
  for ``--cdi-version runtime`` and the doctor where no runtime binary is visible.

Importing the package sets :data:`GRPC_EXPERIMENTS` before any of its modules loads grpc,
since grpc reads the variable once, when it is first imported.
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


apply_grpc_experiments()
