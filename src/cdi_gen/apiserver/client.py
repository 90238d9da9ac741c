"""The API server as the DRA driver needs it: claims, the Node's UID, and this node's
ResourceSlices — a thin async layer over lightkube's ``AsyncClient``.

Everything goes in and out as plain dicts (the slices :mod:`~cdi_gen.apiserver.slices`
builds) or as the domain's values (:class:`~cdi_gen.model.ClaimView`); lightkube's typed
models stay inside this module. Every failure is one line naming the object and why:
:class:`ApiServerError` for a call, :class:`KubeConfigError` (exit 2) for a configuration
that cannot be loaded, naming what was tried.

lightkube rather than the official client: it is asyncio-native (the agent runs on one
loop; the official client is synchronous first, its asyncio variant a separate package),
typed, and costs a fraction of the memory (figures in the commit that brought it).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import yaml
from lightkube import ApiError, AsyncClient, ConfigError, KubeConfig
from lightkube.config.kubeconfig import DEFAULT_KUBECONFIG, SERVICE_ACCOUNT
from lightkube.operators import BinaryOperator, SequenceOperator
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import OnErrorAction, OnErrorResult

from cdi_gen.errors import CdiGenError, ClaimError
from cdi_gen.errors import ConfigError as CdiConfigError
from cdi_gen.model import AllocatedDevice, ClaimView

__all__ = ["ApiClient", "ApiServerError", "KubeConfigError", "load_config"]

Obj = dict[str, Any]
#: What a call can fail with: an answer that is an error, or no answer.
_CALL_ERRORS = (ApiError, httpx2.HTTPError, OSError)


class KubeConfigError(CdiConfigError):
    """No usable API server configuration; the message says what was tried."""


class ApiServerError(CdiGenError):
    """A call to the API server failed; ``status`` is the HTTP status when it answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _why(exc: BaseException) -> str:
    if isinstance(exc, ApiError):
        status = exc.status
        return f"HTTP {status.code} {status.reason or ''}: {status.message or ''}".strip()
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def _status(exc: BaseException) -> int | None:
    return exc.status.code if isinstance(exc, ApiError) else None


def load_config(kubeconfig: Path | None) -> KubeConfig:
    """An explicit kubeconfig; else the in-cluster service account; else ``$KUBECONFIG`` or
    ``~/.kube/config``. Raises :class:`KubeConfigError` naming what was tried."""
    if kubeconfig is not None:
        return _from_file(kubeconfig, f"--kubeconfig {str(kubeconfig)!r}")
    account = Path(SERVICE_ACCOUNT)
    in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ and "KUBERNETES_SERVICE_PORT" in (
        os.environ
    )
    if in_cluster and (account / "token").is_file():
        try:
            return KubeConfig.from_service_account(account)
        except (ConfigError, OSError, KeyError) as exc:
            raise KubeConfigError(f"in-cluster config from {account}: {_why(exc)}") from None
    env = os.environ.get("KUBERNETES_SERVICE_HOST")
    tried = (
        f"not in a cluster ({account}/token missing)"
        if env
        else "not in a cluster (KUBERNETES_SERVICE_HOST unset)"
    )
    if os.environ.get("KUBECONFIG"):
        path = Path(os.environ["KUBECONFIG"])
        return _from_file(path, f"{tried}; $KUBECONFIG {str(path)!r}")
    path = Path(DEFAULT_KUBECONFIG).expanduser()
    return _from_file(path, f"{tried}; $KUBECONFIG unset; {str(path)!r}")


def _from_file(path: Path, what: str) -> KubeConfig:
    if not path.is_file():
        raise KubeConfigError(f"no API server configuration: {what}: no such file")
    try:
        config = KubeConfig.from_file(path)
        config.get()  # the current context exists and names a cluster
    except yaml.YAMLError as exc:
        # Never the parser's text: it quotes the file, which may be any file we can read.
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1} column {mark.column + 1})" if mark else ""
        raise KubeConfigError(f"{what}: not a usable kubeconfig: not YAML{where}") from None
    except (ConfigError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KubeConfigError(f"{what}: not a usable kubeconfig: {_why(exc)}") from None
    return config


def _selector(driver: str, node: str) -> dict[str, str | BinaryOperator | SequenceOperator]:
    return {"spec.nodeName": node, "spec.driver": driver}


def _slice(obj: Obj) -> ResourceSlice:
    slice_ = ResourceSlice.from_dict(obj)
    assert isinstance(slice_, ResourceSlice)
    return slice_


def _retry_watch(exc: Exception, count: int) -> OnErrorResult:
    # The caller restarts a failed watch itself (with its own backoff and a relist).
    return OnErrorResult(OnErrorAction.RAISE)


class ApiClient:
    """The API server calls of the DRA driver. Construct on the loop that will use it."""

    def __init__(self, kubeconfig: Path | None = None, *, timeout: float = 10.0) -> None:
        config = load_config(kubeconfig)
        try:
            self._client = AsyncClient(
                config, timeout=httpx2.Timeout(timeout), lazy=False, field_manager="cdi-gen"
            )
        except (ConfigError, OSError, ValueError) as exc:
            raise KubeConfigError(f"API server client: {_why(exc)}") from None
        self.server: str = str(self._client.config.cluster.server)

    async def close(self) -> None:
        await self._client.close()

    async def get_claim(self, namespace: str, name: str) -> ClaimView:
        """The claim as NodePrepareResources needs it; :class:`ClaimError` naming it when it
        is missing or the API server fails."""
        try:
            claim = await self._client.get(ResourceClaim, name, namespace=namespace)
        except _CALL_ERRORS as exc:
            if _status(exc) == 404:
                raise ClaimError(f"ResourceClaim {namespace}/{name}: not found") from None
            raise ClaimError(f"ResourceClaim {namespace}/{name}: {_why(exc)}") from None
        return claim_view(claim.to_dict())

    async def node_uid(self, node: str) -> str:
        """The UID of Node ``node`` (the owner of its slices)."""
        try:
            obj = await self._client.get(Node, node)
        except _CALL_ERRORS as exc:
            raise ApiServerError(f"Node {node}: {_why(exc)}", _status(exc)) from None
        assert obj.metadata is not None and obj.metadata.uid is not None
        return obj.metadata.uid

    async def list_slices(self, driver: str, node: str) -> list[Obj]:
        """Every ResourceSlice of ``driver`` on ``node``."""
        try:
            return [
                s.to_dict()
                async for s in self._client.list(ResourceSlice, fields=_selector(driver, node))
            ]
        except _CALL_ERRORS as exc:
            raise ApiServerError(
                f"ResourceSlices of {driver} on {node}: list: {_why(exc)}", _status(exc)
            ) from None

    async def create_slice(self, obj: Obj) -> Obj:
        try:
            created = await self._client.create(_slice(obj))
        except _CALL_ERRORS as exc:
            raise ApiServerError(f"{_name(obj)}: create: {_why(exc)}", _status(exc)) from None
        result: Obj = created.to_dict()
        return result

    async def replace_slice(self, obj: Obj) -> Obj:
        """PUT ``obj``; with ``metadata.resourceVersion`` set it fails with 409 when the slice
        changed meanwhile."""
        try:
            replaced = await self._client.replace(_slice(obj))
        except _CALL_ERRORS as exc:
            raise ApiServerError(f"{_name(obj)}: replace: {_why(exc)}", _status(exc)) from None
        result: Obj = replaced.to_dict()
        return result

    async def delete_slice(self, name: str) -> None:
        """Delete a slice; one that is already gone is fine."""
        try:
            await self._client.delete(ResourceSlice, name)
        except _CALL_ERRORS as exc:
            if _status(exc) != 404:
                raise ApiServerError(
                    f"ResourceSlice {name}: delete: {_why(exc)}", _status(exc)
                ) from None

    async def watch_slices(
        self, driver: str, node: str, resource_version: str | None = None
    ) -> AsyncIterator[tuple[str, Obj]]:
        """(event type, slice) for every change of ``driver``'s slices on ``node`` until the
        connection fails (:class:`ApiServerError`)."""
        events = self._client.watch(
            ResourceSlice,
            fields=_selector(driver, node),
            resource_version=resource_version,
            on_error=_retry_watch,
        )
        try:
            async for kind, obj in events:
                yield kind, obj.to_dict()
        except _CALL_ERRORS as exc:
            raise ApiServerError(
                f"ResourceSlices of {driver} on {node}: watch: {_why(exc)}", _status(exc)
            ) from None


def _name(obj: Obj) -> str:
    return f"ResourceSlice {obj.get('metadata', {}).get('name', '?')}"


def claim_view(obj: Obj) -> ClaimView:
    """A ResourceClaim (as a dict) reduced to what NodePrepareResources needs."""
    meta = obj.get("metadata") or {}
    allocation = (obj.get("status") or {}).get("allocation")
    results: tuple[AllocatedDevice, ...] | None = None
    if allocation is not None:
        results = tuple(
            AllocatedDevice(
                request=r["request"],
                driver=r["driver"],
                pool=r["pool"],
                device=r["device"],
                share_id=r.get("shareID"),
            )
            for r in ((allocation.get("devices") or {}).get("results") or ())
        )
    return ClaimView(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        results=results,
    )
