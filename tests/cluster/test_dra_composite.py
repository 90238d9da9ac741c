"""Issue 56 on a real node: a loop device with a partition table (``losetup -P``: ``loopN``,
``loopNp1``, ``loopNp2``) served by a composite class (``group.offer: both``). The scheduler
allocates the whole disk or its partitions, never both; partitions go to pods side by side;
each container sees exactly its nodes; the partition table rewritten (a partition removed
while nothing is allocated, added while two are) is followed by the pool.

The slices' form depends on the API server: with ``DRAPartitionableDevices`` (on by default
from 1.36; the oldest lane switches 1.35's alpha gate on, ``lane.py``) the whole and its parts
with counters, else the partitions alone (the agent asks once, by a dry run). The test reads
the gate the lane's API server reports, checks that the published form is the one for it, and
prints which it was (``published form: ...``, in the report's captured output).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from loopdev import LoopDevice, LoopDevices, mbr_partitions, partitioned_image

from .agent import DRIVER, VENDOR
from .claims import (
    CLAIMS,
    Claims,
    allocated_devices,
    device_attribute,
    generated_device_classes,
    slice_devices,
)
from .cluster import Cluster
from .conftest import DraAgentFactory

CLASS = "disk"
PART = f'device.attributes["{DRIVER}"].part'
WHOLE = f"!{PART}"


def _config(dev: LoopDevice) -> str:
    cls = {
        "name": CLASS,
        # Exactly this disk and its partitions: other suites' loop devices stay out.
        "match": [
            {"subsystem": "block", "kernel": dev.name},
            {"subsystem": "block", "kernel": f"{dev.name}p[0-9]*"},
        ],
        "group": {"by": "parent", "subsystem": "block", "offer": "both"},
        "deviceName": "{group}",
        "containerEdits": {"env": ["FPGA_DEVICE={name}"]},
    }
    return json.dumps({"vendor": VENDOR, "classes": [cls]}, indent=2) + "\n"


def _rdev(path: str) -> str:
    st = os.stat(path)
    return f"{os.major(st.st_rdev):x}:{os.minor(st.st_rdev):x}"


def _nodes(*paths: str) -> dict[str, str]:
    return {p: _rdev(p) for p in paths}


def _form(slices: list[dict[str, Any]]) -> str:
    devices = slice_devices(slices)
    wholes = [d for d in devices.values() if device_attribute(d, DRIVER, "part") is False]
    counted = any(d.get("consumesCounters") for d in devices.values())
    if wholes and counted:
        return "whole and parts, with counters"
    return "parts alone" if not wholes else "whole and parts WITHOUT counters"


@pytest.mark.lanes("current", "oldest")
def test_a_disk_and_its_partitions_never_go_to_two_pods_at_once(
    cluster: Cluster,
    loops: LoopDevices,
    dra_agent: DraAgentFactory,
    claims: Claims,
    tmp_path: Path,
) -> None:
    pods = claims.pods
    dev = loops.add()
    image = partitioned_image(tmp_path / "disk.img", [4, 4, 4])
    assert loops.attach_partitioned(dev, image) == 3
    disk, p1, p2, p3 = str(dev.path), *(f"{dev.path}p{n}" for n in (1, 2, 3))
    config = _config(dev)
    agent = dra_agent(config)
    config_path = tmp_path / "composite.yaml"
    config_path.write_text(config)
    (device_class,) = generated_device_classes(config_path)
    claims.ensure_device_class(device_class)
    class_name = device_class["metadata"]["name"]

    counters = cluster.feature_gates("kube-apiserver").get("DRAPartitionableDevices", False)
    whole = f"{CLASS}-{dev.name}"
    part1, part2, part3 = (f"{whole}p{n}" for n in (1, 2, 3))

    def offered(*parts: str) -> dict[str, Any]:
        """Wait until the slices offer exactly ``parts`` (and the whole, counting each of
        them, where counters are kept)."""
        wanted = {whole, *parts} if counters else set(parts)

        def right(found: dict[str, Any]) -> bool:
            if set(found) != wanted:
                return False
            uses = (found.get(whole) or {}).get("consumesCounters") or []
            return not counters or {c for u in uses for c in u["counters"]} == set(parts)

        return claims.wait_devices(DRIVER, right, f"the slices offer {sorted(wanted)}")

    offered(part1, part2, part3)
    slices = claims.slices(DRIVER)
    form = _form(slices)
    print(f"published form: {form}; slices: {json.dumps([s['spec'] for s in slices])}")
    assert form == ("whole and parts, with counters" if counters else "parts alone"), agent.log()
    if not counters:
        assert "composite classes published as their parts alone" in agent.log()

    # The partition table rewritten while nothing is allocated: the third partition goes.
    loops.delete_partition(dev, 3)
    offered(part1, part2)

    claims.template("whole", class_name, selectors=[WHOLE])
    claims.template("partition", class_name, selectors=[PART])

    # Two partitions side by side, each container with exactly its node.
    claims.pod_with_template("part-a", "partition")
    claims.pod_with_template("part-b", "partition")
    pods.wait_running("part-a", timeout=90)
    pods.wait_running("part-b", timeout=90)
    seen = {name: pods.seen(name).devices for name in ("part-a", "part-b")}
    assert sorted(seen.values(), key=sorted) == [_nodes(p1), _nodes(p2)], seen

    # A partition added while two are held: the pool follows, and a third pod gets it
    # beside the other two.
    start, count = mbr_partitions(image)[2]
    loops.add_partition(dev, 3, start, count)
    offered(part1, part2, part3)
    claims.pod_with_template("part-c", "partition")
    pods.wait_running("part-c", timeout=90)
    assert pods.seen("part-c").devices == _nodes(p3)
    if not counters:
        return  # no whole is offered: nothing more to keep apart

    _whole_and_parts_apart(claims, disk, p1, p2, p3)


def _whole_and_parts_apart(claims: Claims, disk: str, *parts: str) -> None:
    """With pods part-a, part-b and part-c holding the partitions: the whole disk waits until
    none is held, and a partition waits while the whole disk is."""
    pods = claims.pods
    # The whole disk waits while any partition is held...
    claims.pod_with_template("whole-disk", "whole")
    message = pods.wait_unschedulable("whole-disk")
    assert "cannot allocate all claims" in message, message
    held = claims.pod_claim("part-a")
    assert held is not None
    pods.delete("part-a")
    path = f"{CLAIMS}/{held['metadata']['name']}"
    claims.api.wait_for(path, lambda c: c is None, 60, "part-a's claim deleted")
    # The scheduler tries again once a claim is freed: still nothing for the whole disk.
    assert pods.wait_unschedulable("whole-disk")
    assert allocated_devices(claims.pod_claim("whole-disk")) == []
    # ... and runs once none is, with every node of the disk.
    pods.delete("part-b")
    pods.delete("part-c")
    pods.wait_running("whole-disk", timeout=90)
    assert pods.seen("whole-disk").devices == _nodes(disk, *parts)

    # A partition waits while the whole disk is held.
    claims.pod_with_template("part-d", "partition")
    message = pods.wait_unschedulable("part-d")
    assert "cannot allocate all claims" in message, message
    pods.delete("whole-disk")
    pods.wait_running("part-d", timeout=90)
    assert list(pods.seen("part-d").devices) in [[p] for p in parts]
