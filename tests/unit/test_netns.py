"""An interface moved into another network namespace is told from one unplugged
(:mod:`cdi_gen.sources.netns`), on a sysfs tree laid out in a temporary folder as the kernel
leaves it: a USB NIC's (recorded layout, net-handwritten.json) parent keeps its ``net/``
folder while its interface lives in a pod, and loses it with an unplug; a veth's peer on the
host names the moved end by ``iflink``. Discovery keeps an interface away as it was, applies
``whenGone`` to an unplug and withdraws a virtual interface destroyed with its namespace.
The real kernel's side (veth pairs, ``ip netns``, uevents) is tests/integration/test_net_real.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cdi_gen.config.loader import parse_config
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.model import DeviceRecord
from cdi_gen.sources.netns import AWAY, ENDED, NetWhereabouts, lives_elsewhere
from cdi_gen.sources.records import load_recording

DATA = Path(__file__).resolve().parents[1] / "data" / "udev"
USB = "/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0"


def _usb_nic(sysfs: Path) -> DeviceRecord:
    """The recorded USB NIC (r8152), its paths under ``sysfs``, its folders made."""
    record = next(
        r
        for r in load_recording(DATA / "net-handwritten.json").records
        if r.sys_name == "enx00e04c680001"
    )
    path = f"{sysfs}{USB}/net/enx00e04c680001"
    Path(path).mkdir(parents=True)
    return dataclasses.replace(record, sys_path=path)


def _removed(record: DeviceRecord) -> DeviceRecord:
    """The remove uevent's record: what the kernel says (no sysfs left to read)."""
    return DeviceRecord(
        sys_path=record.sys_path,
        subsystem="net",
        sys_name=record.sys_name,
        properties={k: record.properties[k] for k in ("IFINDEX", "INTERFACE", "SUBSYSTEM")},
        action="remove",
    )


def _discovery(when_gone: str) -> Discovery:
    cls = {
        "name": "usb-nic",
        "match": {"subsystem": "net", "driver": "r8152"},
        "deviceName": "{property[ID_NET_NAME_MAC]}",
        "whenGone": when_gone,
    }
    return Discovery(parse_config({"vendor": "example.com", "classes": [cls]}, "t.yaml"))


def test_a_usb_nic_in_a_pod_stays_and_an_unplug_follows_when_gone(tmp_path: Path) -> None:
    nic = _usb_nic(tmp_path)
    nets = NetWhereabouts(str(tmp_path))
    discovery = _discovery("unhealthy")
    discovery.replace(nets.enumerated([nic]))
    before = discovery.advertised("usb-nic")
    assert [(d.id, d.healthy) for d in before] == [("enx00e04c680001", True)]

    Path(nic.sys_path).rmdir()  # moved into a pod: the parent's net/ stays, empty
    away = nets.removed(_removed(nic))
    assert away == dataclasses.replace(nic, action=AWAY)
    assert discovery.apply([away]) == []  # nothing changed: published as it was
    assert discovery.advertised("usb-nic") == before
    assert nets.recheck() == []  # a later uevent: still in the pod
    # A resync's enumeration does not see it on the host, and keeps it all the same.
    assert discovery.replace(nets.enumerated([])) == []

    Path(nic.sys_path).parent.rmdir()  # unplugged in the pod: the kernel drops net/
    (gone,) = nets.recheck()
    assert (gone.sys_path, gone.action) == (nic.sys_path, "remove")
    (change,) = discovery.apply([gone])
    assert [(d.name, d.healthy, d.gone) for d in change.devices] == [
        ("enx00e04c680001", False, True)
    ]
    assert not nets.away


def test_a_usb_nic_returned_under_its_pod_name_is_the_same_device(tmp_path: Path) -> None:
    """The kernel gives a physical interface back under the name it had in the pod."""
    nic = _usb_nic(tmp_path)
    nets = NetWhereabouts(str(tmp_path))
    discovery = _discovery("withdraw")
    discovery.replace(nets.enumerated([nic]))
    Path(nic.sys_path).rmdir()
    discovery.apply([nets.removed(_removed(nic))])

    back_path = f"{tmp_path}{USB}/net/lan1"
    Path(back_path).mkdir()
    back = dataclasses.replace(nic, sys_path=back_path, sys_name="lan1", action="add")
    old, new = nets.seen(back)
    assert (old.sys_path, old.action) == (nic.sys_path, "remove")
    assert new is back
    (change,) = discovery.apply([old, new])
    assert change.changed == ("enx00e04c680001",) and not change.removed
    (device,) = change.devices
    assert device.healthy
    assert device.edits["netDevices"] == [{"hostInterfaceName": "lan1", "name": "lan1"}]


def test_an_interface_unplugged_on_the_host_is_removed(tmp_path: Path) -> None:
    nic = _usb_nic(tmp_path)
    nets = NetWhereabouts(str(tmp_path))
    nets.enumerated([nic])
    Path(nic.sys_path).rmdir()
    Path(nic.sys_path).parent.rmdir()  # the kernel dropped net/ with its last interface
    removed = _removed(nic)
    assert nets.removed(removed) is removed
    assert not nets.away


def test_a_veth_end_lives_on_while_its_peer_on_the_host_links_to_it(tmp_path: Path) -> None:
    sysfs = str(tmp_path)
    gone = f"{sysfs}/devices/virtual/net/cgh0"
    peer = tmp_path / "class" / "net" / "cgp0"
    peer.mkdir(parents=True)
    (peer / "ifindex").write_text("98\n")
    (peer / "iflink").write_text("99\n")
    assert lives_elsewhere(gone, 99, sysfs)
    assert not lives_elsewhere(gone, 97, sysfs)  # nothing links to that one
    assert not lives_elsewhere(gone, None, sysfs)
    (peer / "iflink").write_text("98\n")  # not a peer: a device that links to itself
    assert not lives_elsewhere(f"{sysfs}/devices/virtual/net/cgp0", 98, sysfs)


def test_a_veth_end_destroyed_with_its_namespace_ends_and_is_withdrawn(tmp_path: Path) -> None:
    """``ended`` withdraws the device although the class keeps gone ones: not an unplug."""
    sysfs = str(tmp_path)
    peer = tmp_path / "class" / "net" / "cgp0"
    peer.mkdir(parents=True)
    (peer / "ifindex").write_text("98\n")
    (peer / "iflink").write_text("99\n")
    veth = DeviceRecord(
        sys_path=f"{sysfs}/devices/virtual/net/cgh0",
        subsystem="net",
        sys_name="cgh0",
        properties={"IFINDEX": "99", "INTERFACE": "cgh0"},
    )
    cls = {"name": "veth", "match": {"subsystem": "net", "kernel": "cgh*"}, "whenGone": "taint"}
    discovery = Discovery(parse_config({"vendor": "example.com", "classes": [cls]}, "t.yaml"))
    nets = NetWhereabouts(sysfs)
    discovery.replace(nets.enumerated([veth]))
    assert nets.removed(dataclasses.replace(veth, action="remove")).action == AWAY
    (peer / "ifindex").unlink()
    (peer / "iflink").unlink()
    peer.rmdir()  # the namespace is destroyed, the pair with it
    (ended,) = nets.recheck()
    assert ended.action == ENDED
    (change,) = discovery.apply([ended])
    assert change.removed == ("cgh0",) and change.devices == ()


def test_a_sibling_interface_of_the_same_adapter_is_not_taken_for_the_one_away(
    tmp_path: Path,
) -> None:
    """A two-channel CAN adapter: both interfaces sit in one ``net/`` folder. A change of the
    channel that stayed is not the other's return; the other comes back by its ifindex,
    or, alone away, under any name and ifindex the pod's namespace left it."""
    nic = _usb_nic(tmp_path)
    folder = Path(nic.sys_path).parent
    can = [
        dataclasses.replace(
            nic,
            sys_path=str(folder / name),
            sys_name=name,
            properties={**nic.properties, "IFINDEX": str(index), "INTERFACE": name},
        )
        for name, index in (("can0", 7), ("can1", 8))
    ]
    for record in can:
        Path(record.sys_path).mkdir()
    nets = NetWhereabouts(str(tmp_path))
    nets.enumerated([nic, *can])
    Path(can[0].sys_path).rmdir()
    assert nets.removed(_removed(can[0])).action == AWAY
    assert nets.seen(dataclasses.replace(can[1], action="change")) == [
        dataclasses.replace(can[1], action="change")
    ]
    assert list(nets.away) == [can[0].sys_path]
    # Two away: the one back is told by its ifindex.
    Path(can[1].sys_path).rmdir()
    assert nets.removed(_removed(can[1])).action == AWAY
    back = dataclasses.replace(can[1], sys_path=str(folder / "dev8"), sys_name="dev8", action="add")
    old, _ = nets.seen(back)
    assert old.sys_path == can[1].sys_path
    # One away, back under another name and ifindex: still that one.
    other = dataclasses.replace(
        can[0],
        sys_path=str(folder / "dev12"),
        properties={**can[0].properties, "IFINDEX": "12"},
        action="add",
    )
    old, _ = nets.seen(other)
    assert old.sys_path == can[0].sys_path
    assert not nets.away
