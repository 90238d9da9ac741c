"""A prepared device's network interface as its claim's status shows it (KEP-4817
``networkData`` of ``status.devices[]``): the interface's name in the pod, from the class's
spec (``netDevices[].name``), and its hardware address, read from the host's sysfs at
prepare, while the interface is still on the host (the runtime moves it when the container
starts; a move keeps the address). No IP is given: the driver assigns none. A CAN interface
has no hardware address (its ``address`` is empty) and shows only its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi_gen.errors import InvalidNameError
from cdi_gen.files import FileRefused, read_regular
from cdi_gen.names import validate_interface_name

__all__ = ["MAX_HARDWARE_ADDRESS", "MAX_INTERFACE_NAME", "hardware_address", "network_data"]

#: The API's bounds on ``networkData.interfaceName`` and ``hardwareAddress`` (bytes).
MAX_INTERFACE_NAME = 256
MAX_HARDWARE_ADDRESS = 128
_SYSFS_PAGE = 4096
_HEX = frozenset("0123456789abcdefABCDEF:")


def hardware_address(interface: str, sysfs: str = "/sys") -> str | None:
    """The hardware address of host interface ``interface`` (``aa:bb:...``), or None when it
    has none (CAN), is not on the host, or its name or address is not one."""
    try:
        validate_interface_name(interface)
        # sysfs says every attribute is a page long, whatever it holds.
        raw = read_regular(f"{sysfs}/class/net/{interface}/address", _SYSFS_PAGE)
    except (InvalidNameError, OSError, FileRefused):
        return None
    text = raw.decode("ascii", "replace").strip()
    if not text or len(text) > MAX_HARDWARE_ADDRESS or not set(text) <= _HEX:
        return None
    return text


def network_data(edits: Mapping[str, Any], sysfs: str = "/sys") -> dict[str, str]:
    """The ``networkData`` of a device whose spec entry has ``edits`` (its first interface;
    a device moves one in practice), or empty when it moves none."""
    first = next((n for n in edits.get("netDevices") or () if isinstance(n, Mapping)), None)
    if first is None:
        return {}
    out: dict[str, str] = {}
    host, inside = first.get("hostInterfaceName"), first.get("name")
    if isinstance(inside, str) and 0 < len(inside.encode("utf-8", "replace")) <= MAX_INTERFACE_NAME:
        out["interfaceName"] = inside
    address = hardware_address(host, sysfs) if isinstance(host, str) else None
    if address is not None:
        out["hardwareAddress"] = address
    return out
