"""``whenBack`` as the agent applies it, without sockets or kernel: which devices came back
(:mod:`cdi_gen.agent.comebacks`), the policy a class runs with for the privileges it has
(:mod:`cdi_gen.agent.privileges`), and what the kubelet knows a device by
(:func:`cdi_gen.agent.whenback.device_keys`). The real re-plugs are in
tests/integration/test_when_back_real.py."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from cdi_gen.agent.comebacks import Comebacks
from cdi_gen.agent.follow import Hierarchies
from cdi_gen.agent.privileges import (
    FOLLOW_CAPABILITIES,
    Privileges,
    effective_capabilities,
    effective_policy,
)
from cdi_gen.agent.whenback import ContainerOutcome, announced, device_keys, spec_node
from cdi_gen.config.loader import parse_config
from cdi_gen.dra.driver.poolentries import device_name
from cdi_gen.model import ClassChange, DiscoveredDevice, NodeInfo

ALL = sum(1 << bit for bit, _ in FOLLOW_CAPABILITIES.values())
MKNOD = 1 << FOLLOW_CAPABILITIES["CAP_MKNOD"][0]


def _device(name: str, minor: int, path: str = "/dev/held") -> DiscoveredDevice:
    node = NodeInfo(f"/dev/loop{minor}", path, 7, minor, "b", f"/sys/block/loop{minor}")
    return DiscoveredDevice(name, "held", f"/sys/block/loop{minor}", (node,), None, True, (), {})


def _change(*devices: DiscoveredDevice, **names: tuple[str, ...]) -> ClassChange:
    return ClassChange("held", tuple(devices), **names)


def _seen(*devices: DiscoveredDevice) -> Comebacks:
    """Comebacks that saw ``devices`` added."""
    comebacks = Comebacks()
    assert comebacks.of(_change(*devices, added=tuple(d.name for d in devices))) == []
    return comebacks


def test_a_device_removed_and_added_with_other_numbers_came_back() -> None:
    comebacks = _seen(_device("disk", 1))
    assert comebacks.of(_change(removed=("disk",))) == []
    [back] = comebacks.of(_change(_device("disk", 9), added=("disk",)))
    assert back.name == "disk"
    [moved] = back.moved
    assert (moved.old, moved.new, moved.node.container_path) == ((7, 1), (7, 9), "/dev/held")
    assert len(comebacks) == 0, "a comeback is forgotten once seen"


def test_the_same_numbers_or_a_new_device_are_no_move() -> None:
    comebacks = _seen(_device("disk", 1))
    comebacks.of(_change(removed=("disk",)))
    [same] = comebacks.of(_change(_device("disk", 1), added=("disk",)))
    assert same.moved == ()
    assert comebacks.of(_change(_device("disk", 1), _device("new", 3), added=("new",))) == []


def test_a_device_changed_within_one_batch_came_back() -> None:
    """Detached and attached again within one batch: discovery says changed."""
    comebacks = _seen(_device("disk", 1))
    [back] = comebacks.of(_change(_device("disk", 9), changed=("disk",)))
    assert [m.old for m in back.moved] == [(7, 1)]


def test_a_device_back_at_another_path_came_back_from_its_old_path() -> None:
    """A node whose path names the kernel's numbering (/dev/loopN, /dev/bus/usb/BBB/DDD,
    /dev/ttyUSBn without node.path) comes back at another path: still a comeback, paired
    with the old node of its type."""
    comebacks = _seen(_device("disk", 1, "/dev/loop1"))
    comebacks.of(_change(removed=("disk",)))
    [back] = comebacks.of(_change(_device("disk", 9, "/dev/loop9"), added=("disk",)))
    [moved] = back.moved
    assert (moved.old, moved.new, moved.old_path) == ((7, 1), (7, 9), "/dev/loop1")
    assert moved.node.container_path == "/dev/loop9"
    # Within one batch too; and a node at the same path keeps no old path.
    comebacks = _seen(_device("disk", 1, "/dev/loop1"))
    [back] = comebacks.of(_change(_device("disk", 9, "/dev/loop9"), changed=("disk",)))
    assert [m.old_path for m in back.moved] == ["/dev/loop1"]
    comebacks = _seen(_device("disk", 1))
    [back] = comebacks.of(_change(_device("disk", 9), changed=("disk",)))
    assert [m.old_path for m in back.moved] == [None]


def test_the_removed_devices_remembered_are_bounded() -> None:
    comebacks = Comebacks(remembered=2)
    devices = [_device(f"d{i}", i) for i in range(3)]
    comebacks.of(_change(*devices, added=tuple(d.name for d in devices)))
    for i in range(3):
        comebacks.of(_change(*devices[i + 1 :], removed=(f"d{i}",)))
    assert len(comebacks) == 2
    assert comebacks.of(_change(_device("d0", 9), added=("d0",))) == []
    assert len(comebacks.of(_change(_device("d0", 9), _device("d2", 9), added=("d2",)))) == 1


def _privileges(tmp: Path, caps: int = ALL, mounted: bool = True) -> Privileges:
    return Privileges.now(
        tmp / "absent-pr.sock",
        [tmp / "absent-cri.sock"],
        capabilities=lambda: caps,
        hierarchies=lambda: Hierarchies(None, str(tmp) if mounted else None),
    )


def test_without_sockets_follow_and_restart_run_as_keep_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    privileges = _privileges(tmp_path)
    assert privileges.cri_socket is None
    for wanted in ("follow", "restart"):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert effective_policy("example.com/held", wanted, privileges) == "keep"
        [record] = caplog.records
        line = record.getMessage()
        assert f"whenBack {wanted} runs as keep" in line and "no pod-resources socket" in line
        assert "no CRI socket" in line and "\n" not in line


def test_without_capabilities_or_a_writable_cgroup_follow_lacks_them(tmp_path: Path) -> None:
    lacks = _privileges(tmp_path, caps=ALL & ~MKNOD).follow_lacks
    assert "no CAP_MKNOD in the effective capabilities" in lacks
    lacks = _privileges(tmp_path, caps=MKNOD).follow_lacks
    assert (
        "no CAP_SYS_ADMIN, CAP_SYS_CHROOT, CAP_SYS_PTRACE, CAP_CHOWN, CAP_FOWNER in the "
        "effective capabilities"
    ) in lacks
    assert _privileges(tmp_path).follow_lacks == _privileges(tmp_path).restart_lacks
    lacks = _privileges(tmp_path, mounted=False).follow_lacks
    assert any("no writable cgroup hierarchy" in why for why in lacks)


def test_follow_without_its_privileges_runs_as_restart(caplog: pytest.LogCaptureFixture) -> None:
    privileges = Privileges(("no CAP_MKNOD in the effective capabilities",), (), Path("/x"))
    with caplog.at_level(logging.INFO):
        assert effective_policy("example.com/held", "follow", privileges) == "restart"
        assert effective_policy("example.com/held", "restart", privileges) == "restart"
        assert effective_policy("example.com/held", "keep", privileges) == "keep"
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "class example.com/held: whenBack follow runs as restart: no CAP_MKNOD in the "
        "effective capabilities",
        "class example.com/held: whenBack restart applied",
    ]


def test_host_mode_runs_every_policy_as_keep(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert effective_policy("example.com/held", "follow", None) == "keep"
    [record] = caplog.records
    assert "no kubelet" in record.getMessage()


def test_the_effective_capabilities_are_read_from_the_status() -> None:
    assert effective_capabilities("Name:\tx\nCapEff:\t00000000082c0009\n") == ALL
    assert effective_capabilities("Name:\tx\n") == 0


def _class(**fields: object) -> object:
    config = parse_config(
        {"vendor": "example.com", "classes": [{"name": "held", "match": {"subsystem": "block"},
                                               **fields}]},
        "t.yaml",
    )  # fmt: skip
    return config.classes[0]


def test_a_device_is_known_by_its_ids_and_slots_or_by_its_pool_and_cdi_names() -> None:
    plugin = _class(sharing={"replicas": 2})
    keys = device_keys(plugin, "example.com", None)("disk")  # type: ignore[arg-type]
    assert keys.resource == "example.com/held"
    assert keys.device_ids == ("disk", "disk-0", "disk-1")
    dra = _class(api="dra")
    keys = device_keys(dra, "example.com", ("drv.example.com", "node-a", ["held"]))("disk")  # type: ignore[arg-type]
    assert (keys.driver, keys.pool) == ("drv.example.com", "node-a")
    assert keys.pool_devices == (device_name("held", "disk", ["held"]),)
    assert keys.cdi_names == ("example.com/held=disk",)


def test_the_node_given_is_the_specs_path_mode_and_owner() -> None:
    cls = _class(node={"path": "/dev/held", "fileMode": "0640", "uid": 5, "gid": 6})
    comebacks = _seen(_device("disk", 1))
    [moved] = comebacks.of(_change(_device("disk", 9), changed=("disk",)))[0].moved
    node = spec_node(cls.node, moved)  # type: ignore[attr-defined]
    assert (node.path, node.type, node.major, node.minor) == ("/dev/held", "b", 7, 9)
    assert (node.mode, node.uid, node.gid) == (0o640, 5, 6)


def test_a_dra_class_pinning_numbers_is_told_its_claim_specs_keep_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A claim's own spec copies the class's nodes at prepare: with pinned numbers it keeps
    the old ones after a comeback, said at start; without (the default) it names none."""
    from cdi_gen.agent.whenback import class_policy
    from cdi_gen.metrics import Metrics

    privileges = Privileges((), (), Path("/x"))
    for pin, lines in ((False, 0), (True, 1)):
        caplog.clear()
        cls = _class(api="dra", whenBack="follow", node={"pinNumbers": pin})
        with caplog.at_level(logging.WARNING):
            class_policy(
                cls, "example.com", privileges, Path("/pr.sock"),  # type: ignore[arg-type]
                driver=("example.com", "node-a", ["held"]), metrics=Metrics(),
            )  # fmt: skip
        found = [r.getMessage() for r in caplog.records if "pinNumbers" in r.getMessage()]
        assert len(found) == lines, found


def test_a_dra_classs_outcomes_are_announced_then_passed_on() -> None:
    """What the agent did reaches the DRA driver (the holders' claims and pods: Events, the
    claim's status), one line per container, failed when one was refused; the agent's own
    hook gets the outcomes after."""
    told: list[tuple[str, str, str, list[str], bool]] = []
    passed: list[tuple[str, str, int]] = []

    class Driver:
        def announce(
            self,
            class_name: str,
            device_id: str,
            action: str,
            lines: Sequence[str],
            *,
            failed: bool,
        ) -> None:
            told.append((class_name, device_id, action, list(lines), failed))

    hook = announced(
        Driver(), "held", "follow", lambda r, d, outcomes: passed.append((r, d, len(outcomes)))
    )
    done = ContainerOutcome("ns/p/app", "id-app", "done", "")
    refused = ContainerOutcome("ns/q/app", "id-q", "refused", "a link at /dev/held")
    hook("example.com/held", "loop-a", [done])
    hook("example.com/held", "loop-a", [done, refused])
    assert told == [
        ("held", "loop-a", "follow", [done.line("example.com/held", "loop-a")], False),
        (
            "held",
            "loop-a",
            "follow",
            [done.line("example.com/held", "loop-a"), refused.line("example.com/held", "loop-a")],
            True,
        ),
    ]
    assert "container ns/q/app: refused: a link at /dev/held" in told[1][3][1]
    assert passed == [("example.com/held", "loop-a", 1), ("example.com/held", "loop-a", 2)]
