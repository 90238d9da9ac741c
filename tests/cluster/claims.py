"""DRA on the cluster: DeviceClasses, ResourceClaims and their templates, the node's
ResourceSlices, and consumer pods that get their devices through claims.

The consumers are those of ``pods.py`` (they print the block devices they see and the class's
env variable), asking for a device through ``spec.resourceClaims`` instead of an extended
resource, or through an extended resource that a DeviceClass maps to DRA (KEP-5004). What the
kubelet reports of a device's health lands in ``containerStatuses[].allocatedResourcesStatus``
(gate ResourceHealthStatus), read here as a plain mapping.

Every object made through :class:`Claims` is deleted at the test's end (pods first, by the
``pods`` fixture; then claims, templates and DeviceClasses), so that the next test starts
from a cluster without DRA objects of ours.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .api import Api, Obj
from .cluster import NODE_NAME
from .pods import NAMESPACE, Pods, consumer

RESOURCE_V1 = "/apis/resource.k8s.io/v1"
DEVICE_CLASSES = f"{RESOURCE_V1}/deviceclasses"
SLICES = f"{RESOURCE_V1}/resourceslices"
CLAIMS = f"{RESOURCE_V1}/namespaces/{NAMESPACE}/resourceclaims"
TEMPLATES = f"{RESOURCE_V1}/namespaces/{NAMESPACE}/resourceclaimtemplates"
#: The one request of every claim made here; pods refer to the claim by this name too.
REQUEST = "dev"


def claim_spec(device_class: str, count: int = 1, selectors: Sequence[str] = ()) -> Obj:
    """``spec`` of a ResourceClaim (and of a template's ``spec.spec``): ``count`` devices of
    ``device_class`` for which every CEL expression of ``selectors`` holds."""
    exactly: Obj = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"devices": {"requests": [{"name": REQUEST, "exactly": exactly}]}}


def claim_consumer(
    name: str,
    *,
    template: str | None = None,
    claim: str | None = None,
    env: str = "FPGA_DEVICE",
) -> Obj:
    """A consumer pod whose container uses one claim: made from ``template`` per pod, or the
    existing ResourceClaim ``claim``."""
    if (template is None) == (claim is None):
        raise ValueError("a claim consumer needs exactly one of template and claim")
    pod = consumer(name, {}, env)
    source = (
        {"resourceClaimTemplateName": template}
        if template is not None
        else {"resourceClaimName": claim}
    )
    pod["spec"]["resourceClaims"] = [{"name": REQUEST, **source}]
    (container,) = pod["spec"]["containers"]
    container["resources"] = {"claims": [{"name": REQUEST}]}
    return pod


def allocated_devices(claim: Obj | None) -> list[Obj]:
    """``status.allocation.devices.results`` of a claim (empty when not allocated)."""
    allocation = (claim or {}).get("status", {}).get("allocation") or {}
    results: list[Obj] = allocation.get("devices", {}).get("results", [])
    return results


def resources_status(pod: Obj | None, container: str = "app") -> dict[str, dict[str, str]]:
    """The container's ``allocatedResourcesStatus``: resource name (``claim:<claim>/<request>``
    for DRA) -> resourceID (``<driver>/<pool>/<device>``) -> health."""
    for status in (pod or {}).get("status", {}).get("containerStatuses", []):
        if status.get("name") != container:
            continue
        return {
            entry["name"]: {
                r["resourceID"]: r.get("health", "") for r in entry.get("resources", [])
            }
            for entry in status.get("allocatedResourcesStatus", [])
        }
    return {}


def slice_devices(slices: Iterable[Obj]) -> dict[str, Obj]:
    """The devices of the newest generation of a pool's slices, by name (the scheduler
    ignores slices of an older generation, and so does this)."""
    slices = list(slices)
    if not slices:
        return {}
    newest = max(s["spec"]["pool"]["generation"] for s in slices)
    out: dict[str, Obj] = {}
    for s in slices:
        if s["spec"]["pool"]["generation"] == newest:
            for device in s["spec"].get("devices", []):
                out[device["name"]] = device
    return out


def device_attribute(device: Obj, driver: str, name: str) -> Any:
    """A device's attribute value (whichever of int/bool/string/version it is), looked up
    unqualified in the driver's domain as a CEL selector sees it; None when absent."""
    attributes = device.get("attributes", {})
    value = attributes.get(name, attributes.get(f"{driver}/{name}"))
    if value is None:
        return None
    ((_, found),) = value.items()
    return found


def generated_device_classes(config: Path, *args: str) -> list[Obj]:
    """The DeviceClasses ``cdi-gen deviceclasses`` prints for a config (YAML documents, or
    one List), as objects."""
    proc = subprocess.run(
        [sys.executable, "-m", "cdi_gen", "deviceclasses", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"cdi-gen deviceclasses --config {config} exited {proc.returncode}:\n"
            f"{proc.stdout}{proc.stderr}"
        )
    docs: list[Obj] = []
    for doc in yaml.safe_load_all(proc.stdout):
        if not doc:
            continue
        docs.extend(doc.get("items", []) if doc.get("kind") == "List" else [doc])
    if not docs or any(d.get("kind") != "DeviceClass" for d in docs):
        raise AssertionError(f"cdi-gen deviceclasses printed no DeviceClasses:\n{proc.stdout}")
    return docs


def for_extended_resource(classes: Iterable[Obj], resource: str) -> Obj:
    """The DeviceClass that serves ``resource`` (its ``spec.extendedResourceName``)."""
    classes = list(classes)
    found = [c for c in classes if c.get("spec", {}).get("extendedResourceName") == resource]
    if len(found) != 1:
        names = {c["metadata"]["name"]: c.get("spec", {}).get("extendedResourceName")
                 for c in classes}  # fmt: skip
        raise AssertionError(f"not one DeviceClass for {resource}: {names}")
    return found[0]


@dataclass
class Claims:
    """The DRA objects of one test on the cluster; ``delete_all`` removes them."""

    api: Api
    pods: Pods
    #: API paths of everything created, in creation order.
    created: list[str] = field(default_factory=list)

    def _create(self, collection: str, body: Obj) -> Obj:
        obj = self.api.create(collection, body)
        self.created.append(f"{collection}/{obj['metadata']['name']}")
        return obj

    # ----- cluster-scoped ------------------------------------------------------------------

    def device_class(self, body: Obj) -> Obj:
        """Create a DeviceClass (e.g. one of :func:`generated_device_classes`)."""
        return self._create(DEVICE_CLASSES, copy.deepcopy(body))

    def ensure_device_class(self, body: Obj) -> Obj:
        """The DeviceClass ``body`` names, created unless this test made it already."""
        path = f"{DEVICE_CLASSES}/{body['metadata']['name']}"
        if path in self.created:
            existing = self.api.get(path)
            return existing
        return self.device_class(body)

    def slices(self, driver: str, node: str = NODE_NAME) -> list[Obj]:
        """The ResourceSlices of ``driver`` for ``node`` (as the kubelet selects them)."""
        selector = urllib.parse.quote(f"spec.nodeName={node},spec.driver={driver}")
        items: list[Obj] = self.api.get(f"{SLICES}?fieldSelector={selector}")["items"]
        return items

    def devices(self, driver: str, node: str = NODE_NAME) -> dict[str, Obj]:
        """The devices ``driver`` publishes for ``node`` now, by name (newest generation)."""
        return slice_devices(self.slices(driver, node))

    def wait_devices(
        self,
        driver: str,
        predicate: Callable[[dict[str, Obj]], bool],
        what: str,
        timeout: float = 30,
        node: str = NODE_NAME,
    ) -> dict[str, Obj]:
        """Poll the node's published devices until ``predicate`` holds; fail saying ``what``
        and the last devices seen."""
        deadline = time.monotonic() + timeout
        while True:
            devices = self.devices(driver, node)
            if predicate(devices):
                return devices
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{what}: not within {timeout:.0f} s; published devices: "
                    f"{yaml.safe_dump(devices, sort_keys=True)[:3000]}"
                )
            time.sleep(0.1)

    def delete_slices(self, driver: str, node: str = NODE_NAME) -> None:
        """Delete what ``driver`` left published for ``node`` (after its agent stopped)."""
        for item in self.slices(driver, node):
            self.api.delete(f"{SLICES}/{item['metadata']['name']}")

    # ----- namespaced ----------------------------------------------------------------------

    def template(
        self, name: str, device_class: str, count: int = 1, selectors: Sequence[str] = ()
    ) -> Obj:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": claim_spec(device_class, count, selectors)},
        }
        return self._create(TEMPLATES, body)

    def claim(
        self,
        name: str,
        device_class: str,
        count: int = 1,
        *,
        config: list[Obj] | None = None,
        admin_access: bool = False,
        capacity: dict[str, str] | None = None,
    ) -> Obj:
        """A ResourceClaim; ``config`` its ``spec.devices.config`` entries, ``admin_access``
        its request's ``adminAccess`` (the namespace must be labelled for it), ``capacity``
        the amounts its request asks of a shareable device (``capacity.requests``)."""
        spec = claim_spec(device_class, count)
        if config is not None:
            spec["devices"]["config"] = config
        if admin_access:
            spec["devices"]["requests"][0]["exactly"]["adminAccess"] = True
        if capacity is not None:
            spec["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": capacity}
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": spec,
        }
        return self._create(CLAIMS, body)

    def get_claim(self, name: str) -> Obj | None:
        return self.api.get_or_none(f"{CLAIMS}/{name}")

    def pod_claim(self, pod: str) -> Obj | None:
        """The ResourceClaim the pod's one claim resolved to (``status.resourceClaimStatuses``
        names the claim made from a template), or None while there is none."""
        obj = self.pods.get(pod) or {}
        for entry in obj.get("status", {}).get("resourceClaimStatuses", []):
            if entry.get("name") == REQUEST and entry.get("resourceClaimName"):
                return self.get_claim(entry["resourceClaimName"])
        return None

    def extended_resource_claim(self, pod: str) -> Obj | None:
        """The claim the scheduler made for a pod's DRA-backed extended resources
        (``status.extendedResourceClaimStatus``), or None."""
        obj = self.pods.get(pod) or {}
        status = obj.get("status", {}).get("extendedResourceClaimStatus") or {}
        name = status.get("resourceClaimName")
        return self.get_claim(name) if name else None

    def pod_with_template(self, name: str, template: str, env: str = "FPGA_DEVICE") -> None:
        self.pods.add(claim_consumer(name, template=template, env=env))

    def pod_with_claim(self, name: str, claim: str, env: str = "FPGA_DEVICE") -> None:
        self.pods.add(claim_consumer(name, claim=claim, env=env))

    def delete_all(self, timeout: float = 60) -> None:
        """Delete the claims, templates and classes made here (the pods are the ``pods``
        fixture's), newest first, and wait until they are gone: a claim stays while its
        finalizer says a node still has it prepared."""
        for path in reversed(self.created):
            self.api.delete(path)
        for path in reversed(self.created):
            self.api.wait_for(path, lambda o: o is None, timeout, f"{path} deleted")
        self.created.clear()
