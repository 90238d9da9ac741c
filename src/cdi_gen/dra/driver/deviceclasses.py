"""DeviceClass manifests (``resource.k8s.io/v1``) for the configured classes, as plain dicts.

One DeviceClass per cdi-gen class, named ``<class>.<driver>``, selecting this driver's devices
of that class by the ``class`` attribute every pool device carries. With
``extendedResourceName: <vendor>/<class>`` (KEP-5004, gate ``DRAExtendedResource``) a pod that
asks for ``limits: {<vendor>/<class>: 1}`` is served by DRA, unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cdi_gen.dra.plugin.slices import API_VERSION
from cdi_gen.names import dns_label

__all__ = ["device_class", "device_class_name", "device_classes"]


def device_class_name(class_name: str, driver: str) -> str:
    """``<class>.<driver>``; a class that is not a DNS label (capitals, ``_``, ``.``) is
    mapped to one as pool device names are, so the name is always a DNS subdomain."""
    return f"{dns_label(class_name)}.{driver}"


def device_class(class_name: str, driver: str, vendor: str) -> dict[str, Any]:
    """The DeviceClass of one class. The CEL selector quotes names whose grammars (CDI class,
    DNS subdomain) have no quote or backslash, so no escaping is needed."""
    expression = (
        f'device.driver == "{driver}" && device.attributes["{driver}"].class == "{class_name}"'
    )
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": device_class_name(class_name, driver)},
        "spec": {
            "selectors": [{"cel": {"expression": expression}}],
            "extendedResourceName": f"{vendor}/{class_name}",
        },
    }


def device_classes(class_names: Iterable[str], driver: str, vendor: str) -> list[dict[str, Any]]:
    """The DeviceClasses of ``class_names``, in that order."""
    return [device_class(name, driver, vendor) for name in class_names]
