"""Loop devices of their own for each node of a several-node cluster (``Cluster(node_count=3)``).

The nodes share this machine's devices. Each node's mount namespace hides the other nodes'
loop devices in sysfs (``NodeNamespace.hide``), so that one config naming every node's devices
is what every agent gets, as on real machines, and each agent finds only its own. Used by the
several-node tests and the benchmarks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from loopdev import LoopDevice, LoopDevices

from .cluster import Cluster, Node

SYS_BLOCK = Path("/sys/devices/virtual/block")


@contextlib.contextmanager
def devices_per_node(
    fleet: Cluster, loops: LoopDevices, count: int = 2
) -> Iterator[dict[str, list[LoopDevice]]]:
    """``count`` loop devices per node, each hidden from the other nodes; node name ->
    devices (unhidden at the end)."""
    devices = {node.name: [loops.add() for _ in range(count)] for node in fleet.nodes}
    hidden: list[tuple[Node, Path]] = []
    try:
        for node in fleet.nodes:
            assert node.namespace is not None
            for other, theirs in devices.items():
                if other == node.name:
                    continue
                for device in theirs:
                    path = SYS_BLOCK / device.name
                    node.namespace.hide(path)
                    hidden.append((node, path))
        yield devices
    finally:
        for node, path in hidden:
            assert node.namespace is not None
            node.namespace.unhide(path)
