"""Device metadata for the pod (KEP-5304): the file a claim's containers read (pure).

The format is fixed by Kubernetes in ``k8s.io/dynamic-resource-allocation/api/metadata``
(``metadata.resource.k8s.io`` v1beta1 since 1.37, v1alpha1 in 1.36, the same fields): per
claim and request, a ``DeviceMetadata`` object naming the claim and, for the request, each
allocated device's driver, pool, name and attributes. The file is a JSON stream holding the
object once per API version, newest first, so a consumer of either version finds its own.
Inside the container it sits at a path the pod's author can spell from the pod spec:
``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json``,
or under ``resourceclaimtemplates/<pod claim name>/`` for a claim made from a template (the
claim's ``resource.kubernetes.io/pod-claim-name`` annotation), mounted read-only through the
claim's own CDI spec.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from cdi_gen.model import AttributeValue, attribute_wire

__all__ = [
    "CONTAINER_DIR",
    "VERSIONS",
    "base_request",
    "container_path",
    "metadata_mount",
    "metadata_stream",
]

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
#: Written newest first; both carry the same fields.
VERSIONS = ("metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1")


def base_request(request: str) -> str:
    """The request of a subrequest result (``main/sub`` -> ``main``): files are per request."""
    return request.partition("/")[0]


def container_path(driver: str, claim: str, request: str, pod_claim_name: str | None) -> str:
    """Where the container reads the metadata of ``request`` of ``claim`` from ``driver``."""
    if pod_claim_name:
        where = posixpath.join("resourceclaimtemplates", pod_claim_name)
    else:
        where = posixpath.join("resourceclaims", claim)
    return posixpath.join(CONTAINER_DIR, where, base_request(request), f"{driver}-metadata.json")


def metadata_mount(host_path: str, target: str) -> dict[str, Any]:
    """The CDI mount of one metadata file: read-only, a bind of the host's file."""
    return {"hostPath": host_path, "containerPath": target, "options": ["ro", "bind"]}


def metadata_stream(
    *,
    driver: str,
    namespace: str,
    claim: str,
    uid: str,
    pod_claim_name: str | None,
    request: str,
    devices: Sequence[tuple[str, str, Mapping[str, AttributeValue]]],
) -> bytes:
    """The file's bytes: the ``DeviceMetadata`` of ``request`` (as the allocation names it,
    subrequest included) with ``devices`` (pool, device name, attributes as the slices publish
    them: unqualified, the driver's domain implied), once per version of :data:`VERSIONS`."""
    body: dict[str, Any] = {
        "metadata": {"name": claim, "namespace": namespace, "uid": uid, "generation": 1},
    }
    if pod_claim_name:
        body["podClaimName"] = pod_claim_name
    body["requests"] = [
        {
            "name": request,
            "devices": [
                {
                    "driver": driver,
                    "pool": pool,
                    "name": name,
                    **(
                        {
                            "attributes": {
                                k: attribute_wire(v) for k, v in sorted(attributes.items())
                            }
                        }
                        if attributes
                        else {}
                    ),
                }
                for pool, name, attributes in devices
            ],
        }
    ]
    return b"".join(
        orjson.dumps({"kind": "DeviceMetadata", "apiVersion": version, **body}) + b"\n"
        for version in VERSIONS
    )
