"""The admission check of claims: a ``DeviceConfig`` with a typo refused at ``kubectl apply``.

The API server sends a ResourceClaim or ResourceClaimTemplate being created or updated as an
``AdmissionReview`` (``admission.k8s.io/v1``, or ``v1beta1`` of an older API server: the
fields read are the same); :func:`review` answers it in the version it was asked in, and
refuses any other version or kind, as the reference webhooks do. Each
``spec.devices.config`` entry (``spec.spec.devices.config`` of a template) whose
``opaque.driver`` is ours goes through :func:`~cdi_gen.dra.driver.claimconfig.parse_device_config`,
the parser the driver itself runs at NodePrepareResources, so the refusal carries the driver's
own one-line message (``parameters.deviceNodes.fileMod: unknown field``) after the entry's path.
Other drivers' entries are theirs and never read. The driver keeps its own check: a claim
admitted while this check was not running (or by an older release) is still refused there.
Pure: JSON values in, JSON values out.
"""

from __future__ import annotations

from typing import Any, Final

from cdi_gen.dra.driver.claimconfig import DeviceConfigError, parse_device_config
from cdi_gen.errors import quote

__all__ = ["REVIEW_API_VERSIONS", "ReviewError", "config_problem", "review"]

#: The versions answered, each in its own version: v1 is the one the shipped configuration
#: registers; v1beta1 has the same request and response fields.
REVIEW_API_VERSIONS: Final = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
#: The kinds whose configuration is checked, and where their ``devices`` sit.
_DEVICES_AT: Final = {
    "ResourceClaim": ("spec",),
    "ResourceClaimTemplate": ("spec", "spec"),
}


class ReviewError(ValueError):
    """A request that is not an ``AdmissionReview`` we can answer (HTTP 400, not a denial:
    the API server sent something else than it should)."""


def _devices(obj: dict[str, Any], kind: str) -> tuple[str, object]:
    """The ``devices`` of a claim or template, and the path it was read at."""
    node: object = obj
    path: list[str] = []
    for key in (*_DEVICES_AT[kind], "devices"):
        path.append(key)
        node = node.get(key) if isinstance(node, dict) else None
    return ".".join(path), node


def config_problem(obj: object, kind: str, driver: str) -> str | None:
    """The first opaque entry of ``driver`` in the claim or template ``obj`` that is not a
    valid ``DeviceConfig``, as one line (``spec.devices.config[0].opaque of driver D:
    parameters.env: ...``); None when every entry of ours is valid (or there is none)."""
    if kind not in _DEVICES_AT or not isinstance(obj, dict):
        return None
    where, devices = _devices(obj, kind)
    config = devices.get("config") if isinstance(devices, dict) else None
    if not isinstance(config, list):
        return None  # the API server's own validation answers for a malformed claim
    for index, entry in enumerate(config):
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
            continue
        try:
            parse_device_config(opaque.get("parameters"))
        except DeviceConfigError as exc:
            return f"{where}.config[{index}].opaque of driver {driver}: {exc}"
    return None


def review(body: object, driver: str) -> dict[str, Any]:
    """The ``AdmissionReview`` answering ``body`` (the request's decoded JSON) for DRA
    driver ``driver``: allowed, or denied (422 ``Invalid``) with :func:`config_problem`'s
    line. Raises :class:`ReviewError` when ``body`` is no review of a version we speak, with
    a request and uid."""
    if not isinstance(body, dict):
        raise ReviewError(f"want an AdmissionReview object, not {quote(body)}")
    if body.get("kind") != "AdmissionReview":
        raise ReviewError(f"want kind AdmissionReview, not {quote(body.get('kind'))}")
    api_version = body.get("apiVersion")
    if api_version not in REVIEW_API_VERSIONS:
        # An answer in a version the API server did not ask in is one it cannot read; an
        # unknown version's request may also mean something else than v1's.
        raise ReviewError(
            f"AdmissionReview apiVersion {quote(api_version)} is not one of "
            + ", ".join(REVIEW_API_VERSIONS)
        )
    request = body.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise ReviewError("the AdmissionReview has no request with a uid")
    kind = request.get("kind")
    kind_name = kind.get("kind") if isinstance(kind, dict) else None
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    problem = config_problem(request.get("object"), str(kind_name), driver)
    if problem is not None:
        response["allowed"] = False
        response["status"] = {"code": 422, "reason": "Invalid", "message": problem}
    return {
        # The answer must carry the version it was asked in.
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "response": response,
    }
