"""Writes net-handwritten.json: HAND-WRITTEN records of network interfaces this CI machine
lacks (two USB NICs, two CAN adapters, a WWAN modem with its control node), as udev
(systemd 252) reports them. The veth pair and macvlan of net-veth-macvlan.json are the
recorded ones (``cdi-gen record --subsystem net --attribute address --attribute ifindex``);
net-can-recorded.json is a real candleLight CAN adapter's udev record, published by its owner
(the file says where), against which the hand-written gs_usb record below was checked.

Sysfs layouts follow the kernel drivers (r8152, cdc_ether, gs_usb, peak_usb, cdc_mbim): the
interface sits under its USB interface, under the USB device. Run it after editing; the JSON
file is what the tests read.
"""

import json
from pathlib import Path

HUB = "/sys/devices/pci0000:00/0000:00:14.0/usb2"
NOTE = "hand-written (see make_net.py), not recorded"


def parent(path, subsystem=None, driver=None, devtype=None, attributes=None):
    out = {"sys_path": path, "sys_name": path.rsplit("/", 1)[-1]}
    for k, v in (
        ("subsystem", subsystem),
        ("driver", driver),
        ("devtype", devtype),
        ("attributes", attributes),
    ):
        if v is not None:
            out[k] = v
    return out


def usb_chain(port, interface, driver, vid, pid):
    dev = f"{HUB}/{port}"
    return [
        parent(f"{dev}/{port}:{interface}", "usb", driver, "usb_interface"),
        parent(dev, "usb", "usb", "usb_device", {"idVendor": vid, "idProduct": pid}),
        parent(HUB, "usb", "usb", "usb_device"),
        parent("/sys/devices/pci0000:00/0000:00:14.0", "pci", "xhci_hcd"),
    ]


def usb_props(  # noqa: PLR0917 - one USB device's identity, as the tuples below hold it
    port, interface, driver, vid, pid, vendor, model, serial
):
    props = {
        "ID_BUS": "usb",
        "ID_VENDOR_ID": vid,
        "ID_MODEL_ID": pid,
        "ID_VENDOR": vendor,
        "ID_MODEL": model,
        "ID_SERIAL": f"{vendor}_{model}" + (f"_{serial}" if serial else ""),
        "ID_USB_DRIVER": driver,
        "ID_USB_INTERFACE_NUM": interface.rsplit(".", 1)[-1].zfill(2),
        "ID_PATH": f"pci-0000:00:14.0-usb-0:{port.removeprefix('2-')}:{interface}",
    }
    if serial:
        props["ID_SERIAL_SHORT"] = serial
    return props


def net(name, ifindex, usb, address=None, devtype=None, extra=None):  # noqa: PLR0917 - a builder
    port, interface, driver, vid, pid = usb[:5]
    path = f"{HUB}/{port}/{port}:{interface}/net/{name}"
    props = {
        "DEVPATH": path.removeprefix("/sys"),
        "IFINDEX": str(ifindex),
        "INTERFACE": name,
        "SUBSYSTEM": "net",
        "ID_NET_DRIVER": driver,
        **usb_props(*usb),
        **(extra or {}),
    }
    if devtype:
        props["DEVTYPE"] = devtype
    attributes = {"ifindex": str(ifindex)}
    if address:
        attributes["address"] = address
    out = {"comment": NOTE, "sys_path": path, "subsystem": "net", "sys_name": name}
    if devtype:
        out["devtype"] = devtype
    out.update(
        properties=dict(sorted(props.items())),
        attributes=attributes,
        parents=usb_chain(port, interface, driver, vid, pid),
        node_exists=False,
    )
    return out


R8152 = ("2-1", "1.0", "r8152", "0bda", "8153", "Realtek", "USB_10_100_1000_LAN", "000001")
AX88179 = ("2-2", "1.0", "cdc_ether", "0b95", "1790", "ASIX", "AX88179", "0000249B8D2F8A")
GS_USB = ("2-3", "1.0", "gs_usb", "1d50", "606f", "bytewerk", "candleLight", "004C0034524657")
PEAK = ("2-4", "1.0", "peak_usb", "0c72", "000c", "PEAK_System", "PCAN-USB", "")
EM05 = ("2-5", "1.4", "cdc_mbim", "2c7c", "0125", "Quectel", "EM05-G", "0123456789")

RECORDS = [
    # Renamed by udev's default link policy to its MAC name (enx...).
    net(
        "enx00e04c680001",
        5,
        R8152,
        "00:e0:4c:68:00:01",
        extra={
            "ID_NET_NAME_MAC": "enx00e04c680001",
            "ID_NET_NAME_PATH": "enp0s20f0u1",
            "ID_NET_NAMING_SCHEME": "v252",
        },
    ),
    # Still under its kernel name (a link file or net.ifnames=0 kept it).
    net(
        "usb0",
        6,
        AX88179,
        "00:24:9b:8d:2f:8a",
        extra={"ID_NET_NAME_MAC": "enx00249b8d2f8a", "ID_NET_NAME_PATH": "enp0s20f0u2"},
    ),
    # CAN interfaces have no hardware address and no ID_NET_NAME_* (udev names none).
    net("can0", 7, GS_USB),
    net("can1", 8, PEAK),
    net(
        "wwan0",
        9,
        EM05,
        "6a:1b:2c:3d:4e:5f",
        devtype="wwan",
        extra={"ID_NET_NAME_PATH": "wwp0s20f0u5i4"},
    ),
    # The modem's MBIM control node, beside wwan0 under the same USB interface.
    {
        "comment": NOTE,
        "sys_path": f"{HUB}/2-5/2-5:1.4/usbmisc/cdc-wdm0",
        "subsystem": "usbmisc",
        "sys_name": "cdc-wdm0",
        "sys_number": "0",
        "devnode": "/dev/cdc-wdm0",
        "major": 180,
        "minor": 176,
        "properties": {
            "DEVNAME": "/dev/cdc-wdm0",
            "DEVPATH": "/devices/pci0000:00/0000:00:14.0/usb2/2-5/2-5:1.4/usbmisc/cdc-wdm0",
            "MAJOR": "180",
            "MINOR": "176",
            "SUBSYSTEM": "usbmisc",
            **usb_props(*EM05),
        },
        "parents": usb_chain(*EM05[:5]),
    },
]

if __name__ == "__main__":
    doc = {
        "format": "cdi-gen records",
        "version": 1,
        "comment": "HAND-WRITTEN by make_net.py, not recorded: this machine has no USB NIC, "
        "CAN adapter or WWAN modem",
        "attributes": ["address", "ifindex"],
        "parent_attributes": [],
        "records": RECORDS,
    }
    out = Path(__file__).with_name("net-handwritten.json")
    out.write_text(json.dumps(doc, indent=1) + "\n")
