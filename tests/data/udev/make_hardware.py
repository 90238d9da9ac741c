"""Writes hardware.json: records of devices this CI machine lacks, as udev reports them.

Sysfs layouts follow the kernel drivers (drivers/fpga/dfl.c, drm, usb-serial, cdc_acm,
vfio, XRT xclmgmt). Run it after editing; the JSON file is what the tests read.
"""

import json
from pathlib import Path

PCI = "/sys/devices/pci0000:5d/0000:5d:00.0"


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


def record(  # noqa: PLR0917 - a fixture builder mirroring the record fields
    path,
    subsystem,
    devnode,
    major,
    minor,
    parents,
    driver=None,
    numa=None,
    props=None,
    devtype=None,
    attributes=None,
    number=None,
):
    name = path.rsplit("/", 1)[-1]
    p = {
        "DEVPATH": path.removeprefix("/sys"),
        "SUBSYSTEM": subsystem,
        "DEVNAME": devnode,
        "MAJOR": str(major),
        "MINOR": str(minor),
    }
    if devtype:
        p["DEVTYPE"] = devtype
    if driver:
        p["DRIVER"] = driver
    p.update(props or {})
    out = {
        "sys_path": path,
        "subsystem": subsystem,
        "sys_name": name,
        "devnode": devnode,
        "major": major,
        "minor": minor,
        "properties": p,
        "parents": parents,
    }
    digits = len(name) - len(name.rstrip("0123456789"))
    if number is not None or digits:
        out["sys_number"] = number if number is not None else name[-digits:]
    for k, v in (
        ("driver", driver),
        ("numa_node", numa),
        ("devtype", devtype),
        ("attributes", attributes),
    ):
        if v is not None:
            out[k] = v
    return out


def dfl(card, bdf, numa):
    pci = f"/sys/devices/pci0000:{bdf[5:7]}/{bdf}"
    region = f"{pci}/fpga_region/region{card}"
    chain = [
        parent(region, "fpga_region"),
        parent(pci, "pci", "dfl-pci", attributes={"vendor": "0x8086"}),
    ]
    return [
        record(
            f"{region}/dfl-fme.{card}",
            "platform",
            f"/dev/dfl-fme.{card}",
            509,
            card,
            chain,
            driver="dfl-fme",
            numa=numa,
            number=str(card),
        ),
        record(
            f"{region}/dfl-port.{card}",
            "platform",
            f"/dev/dfl-port.{card}",
            508,
            card,
            chain,
            driver="dfl-port",
            numa=numa,
            number=str(card),
        ),
    ]


def gpu():
    pci = "/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0"
    chain = [
        parent(pci, "pci", "amdgpu"),
        parent("/sys/devices/pci0000:00/0000:00:01.0", "pci", "pcieport"),
    ]
    drm = f"{pci}/drm"
    connector = record(
        f"{drm}/card1/card1-HDMI-A-1",
        "drm",
        None,
        None,
        None,
        [parent(f"{drm}/card1", "drm", devtype="drm_minor"), *chain],
        devtype="drm_connector",
    )
    del connector["devnode"], connector["major"], connector["minor"]
    connector["properties"] = {
        "DEVPATH": connector["sys_path"][4:],
        "SUBSYSTEM": "drm",
        "DEVTYPE": "drm_connector",
    }
    return [
        record(f"{drm}/card1", "drm", "/dev/dri/card1", 226, 1, chain, numa=0, devtype="drm_minor"),
        record(
            f"{drm}/renderD128",
            "drm",
            "/dev/dri/renderD128",
            226,
            128,
            chain,
            numa=0,
            devtype="drm_minor",
        ),
        connector,
    ]


def usb_serial(bus_port, tty, serial, minor):
    usb = f"/sys/devices/pci0000:00/0000:00:14.0/usb1/{bus_port}"
    intf = f"{usb}/{bus_port}:1.0"
    chain = [
        parent(f"{intf}/{tty}", "usb-serial", "ftdi_sio"),
        parent(intf, "usb", "ftdi_sio", "usb_interface"),
        parent(
            usb,
            "usb",
            "usb",
            "usb_device",
            {"idVendor": "0403", "idProduct": "6001", "serial": serial},
        ),
        parent(
            "/sys/devices/pci0000:00/0000:00:14.0/usb1",
            "usb",
            "usb",
            "usb_device",
            {"idVendor": "1d6b", "idProduct": "0002"},
        ),
        parent("/sys/devices/pci0000:00/0000:00:14.0", "pci", "xhci_hcd"),
    ]
    return record(
        f"{intf}/{tty}/tty/{tty}",
        "tty",
        f"/dev/{tty}",
        188,
        minor,
        chain,
        props={"ID_SERIAL_SHORT": serial, "ID_VENDOR_ID": "0403"},
    )


def acm():
    usb = "/sys/devices/pci0000:00/0000:00:14.0/usb1/1-4"
    intf = f"{usb}/1-4:1.0"
    chain = [
        parent(intf, "usb", "cdc_acm", "usb_interface"),
        parent(usb, "usb", "usb", "usb_device", {"idVendor": "2341", "idProduct": "0043"}),
    ]
    return record(f"{intf}/tty/ttyACM0", "tty", "/dev/ttyACM0", 166, 0, chain)


def xilinx():
    pci = "/sys/devices/pci0000:00/0000:00:03.0/0000:65:00.0"
    user = "/sys/devices/pci0000:00/0000:00:03.0/0000:65:00.1"
    return [
        record(
            f"{pci}/xrt_mgmt/xclmgmt25856",
            "xrt_mgmt",
            "/dev/xclmgmt25856",
            235,
            0,
            [parent(pci, "pci", "xclmgmt")],
            numa=1,
        ),
        record(
            f"{user}/drm/renderD129",
            "drm",
            "/dev/dri/renderD129",
            226,
            129,
            [parent(user, "pci", "xocl")],
            numa=1,
            devtype="drm_minor",
        ),
    ]


def vfio():
    return record("/sys/devices/virtual/vfio/42", "vfio", "/dev/vfio/42", 243, 0, [])


records = [
    *dfl(0, "0000:5e:00.0", 0),
    *dfl(1, "0000:af:00.0", 1),
    *gpu(),
    usb_serial("1-2", "ttyUSB0", "A10K5ABC", 0),
    usb_serial("1-3", "ttyUSB1", "A10K5XYZ", 1),
    acm(),
    *xilinx(),
    vfio(),
]
out = Path(__file__).with_name("hardware.json")
out.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
