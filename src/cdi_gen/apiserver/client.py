"""The API server calls the agent makes: claims (read, and their device status written),
the Node's UID, this node's ResourceSlices
(list, write, watch), Events (created, their series patched) and the agent's own DaemonSet
(asked about at exit) — a thin async layer
over an HTTP client that lightkube configures.

Everything goes in and out as plain dicts (the slices :mod:`~cdi_gen.dra.plugin.slices`
builds) or as the domain's values (:class:`~cdi_gen.model.ClaimView`). Every failure is one
line naming the object and why (:mod:`~cdi_gen.apiserver.errors`). The calls are plain REST on
lightkube's HTTP client, so that every answer passes through the one bounded, checked path of
:mod:`~cdi_gen.apiserver.answers`; :meth:`ApiClient.open` reads the configuration
(:mod:`~cdi_gen.apiserver.kubeconfig`) off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from urllib.parse import quote as url_quote

import httpx2
from lightkube import ConfigError
from lightkube.config import client_adapter

from cdi_gen.apiserver.answers import (
    LIST_PAGE,
    Obj,
    bound_answer,
    decode,
    failure,
    slice_shape,
    watch_event,
)
from cdi_gen.apiserver.errors import ApiServerError, KubeConfigError, first_line
from cdi_gen.apiserver.kubeconfig import load_kubeconfig
from cdi_gen.apiserver.resourceclaim import claim_view
from cdi_gen.errors import ClaimError, quote
from cdi_gen.model import ClaimView
from cdi_gen.names import is_dns_label, is_dns_subdomain

__all__ = ["WATCH_SECONDS", "ApiClient"]

#: Seconds the API server keeps a watch open before ending it (we then watch again); the read
#: timeout of a watch is a little longer, so a server that went silent is noticed.
WATCH_SECONDS = 300
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


def _without_http2() -> None:
    """Keep h2 (and hpack, hyperframe) out of this process: the client speaks HTTP/1.1 only
    (lightkube's ``http2=False``), yet httpcore2 imports h2 for its HTTP/2 connection class
    when the transport is made, 1.3 MiB of modules and tables for a class never used.

    ``None`` in ``sys.modules`` makes ``import h2`` fail, which httpcore2 takes as h2 not
    installed; an h2 already imported (by a test's own client) is left alone.
    """
    sys.modules.setdefault("h2", None)  # type: ignore[arg-type]


class ApiClient:
    """The API server calls of the DRA driver. Construct it with :meth:`open` on the loop
    that will use it (the constructor reads files)."""

    def __init__(self, kubeconfig: Path | None = None, *, timeout: float = 10.0) -> None:
        config = load_kubeconfig(kubeconfig).get()
        assert config is not None  # load_kubeconfig checked it
        _without_http2()
        try:
            self._http = client_adapter.AsyncClient(
                config, client_adapter.ConnectionParams(timeout=httpx2.Timeout(timeout))
            )
        except (ConfigError, OSError, ValueError) as exc:
            raise KubeConfigError(f"API server client: {first_line(exc)}") from None
        # Uncompressed, so the bound counts what is decoded (see bound_answer).
        self._http.headers["Accept-Encoding"] = "identity"
        self._http.event_hooks = {"response": [bound_answer]}
        self._watch_timeout = httpx2.Timeout(timeout, read=WATCH_SECONDS + 30)
        self.server: str = str(config.cluster.server)
        #: The namespace of the configuration: the service account's in a pod, else the
        #: kubeconfig context's, else ``default``.
        self.namespace: str = config.namespace

    # The timeout is the client's for every call, not a bound on opening it.
    @classmethod
    async def open(
        cls,
        kubeconfig: Path | None = None,
        *,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> ApiClient:
        """A client, its configuration read in a worker thread: a slow or large file does
        not hold up the loop (and /healthz with it)."""
        return await asyncio.to_thread(cls, kubeconfig, timeout=timeout)

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        what: str,
        *,
        params: dict[str, str] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One call; its answer's JSON object, or :class:`ApiServerError` in one line."""
        try:
            response = await self._http.request(
                method,
                path,
                params=params,
                content=None if body is None else json.dumps(body).encode(),
                headers=None if body is None else {"Content-Type": content_type},
            )
        except (httpx2.HTTPError, OSError) as exc:
            raise ApiServerError(f"{what}: {first_line(exc)}") from None
        if response.is_error:
            raise ApiServerError(f"{what}: {failure(response)}", response.status_code)
        return decode(response.content, what)

    async def get_claim(self, namespace: str, name: str) -> ClaimView:
        """The claim as NodePrepareResources needs it; :class:`ClaimError` naming it when it
        is missing or the API server fails, and before any request when ``namespace`` is not
        a DNS label or ``name`` not a DNS subdomain (both become the URL's path, where
        ``..`` would reach other objects with the agent's credentials: URL quoting keeps a
        bare ``..``)."""
        if not is_dns_label(namespace) or not is_dns_subdomain(name):
            raise ClaimError(
                f"ResourceClaim {quote(f'{namespace}/{name}')}: not read: the namespace must "
                "be a DNS label and the name a DNS subdomain (a-z 0-9 - and, in a name, .)"
            )
        what = f"ResourceClaim {namespace}/{name}"
        path = (
            f"/apis/resource.k8s.io/v1/namespaces/{url_quote(namespace, safe='')}"
            f"/resourceclaims/{url_quote(name, safe='')}"
        )
        try:
            obj = await self._call("GET", path, what)
        except ApiServerError as exc:
            if exc.status == 404:
                raise ClaimError(f"{what}: not found") from None
            raise ClaimError(str(exc)) from None
        kind = obj.get("kind")
        if kind is not None and kind != "ResourceClaim":
            raise ClaimError(f"{what}: the answer is not a ResourceClaim: kind {quote(kind)}")
        return claim_view(obj)

    async def apply_claim_status(
        self, namespace: str, name: str, uid: str, devices: list[Obj], manager: str
    ) -> bool | None:
        """Make ``devices`` the ``status.devices`` entries field manager ``manager`` owns in
        claim ``namespace/name`` (server-side apply of the status subresource; none: ours
        released, so removed); whether the answer, the claim itself, keeps them (False: the
        API server drops ``status.devices``), or None when the claim is gone or is another
        one now (its UID not ``uid``). :class:`ApiServerError` when the API server fails or
        answers anything but that claim (kind, namespace, name and UID)."""
        what = f"ResourceClaim {namespace}/{name}: status"
        if not is_dns_label(namespace) or not is_dns_subdomain(name):
            raise ApiServerError(f"{quote(f'{namespace}/{name}')}: not a claim's name")
        path = (
            f"/apis/resource.k8s.io/v1/namespaces/{url_quote(namespace, safe='')}"
            f"/resourceclaims/{url_quote(name, safe='')}/status"
        )
        body: Obj = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            # The UID is a precondition: a claim deleted and made anew under the name is
            # not ours to write.
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "status": {"devices": devices},
        }
        params = {"fieldManager": manager, "force": "true"}
        try:
            obj = await self._call(
                "PATCH",
                path,
                what,
                params=params,
                body=body,
                content_type="application/apply-patch+yaml",  # JSON is YAML
            )
        except ApiServerError as exc:
            if exc.status in (404, 409, 422):
                return None
            raise
        # Only the claim itself can say the API server drops status.devices: any other 2xx
        # body (a proxy's {}, a Status, another object) says nothing of the feature, and
        # would switch the status off for every claim of the node. It fails this write.
        _check_is_claim(obj, namespace, name, uid, what)
        status = obj.get("status")
        found = status.get("devices") if isinstance(status, dict) else None
        have = (
            {_device_key(d) for d in found if isinstance(d, dict)}
            if isinstance(found, list)
            else set()
        )
        return all(_device_key(d) in have for d in devices)

    async def create_event(self, namespace: str, event: Obj) -> Obj:
        """POST ``event`` (``events.k8s.io/v1``) in ``namespace``; the stored Event."""
        what = f"Event {namespace}/{event.get('metadata', {}).get('name', '?')}: create"
        return await self._call("POST", _events_path(namespace), what, body=event)

    async def patch_event(self, namespace: str, name: str, patch: Obj) -> Obj:
        """Merge ``patch`` into Event ``namespace/name`` (its ``series``);
        :class:`ApiServerError` with status 404 when it expired meanwhile."""
        what = f"Event {namespace}/{name}: patch"
        path = f"{_events_path(namespace)}/{url_quote(name, safe='')}"
        return await self._call(
            "PATCH", path, what, body=patch, content_type="application/merge-patch+json"
        )

    async def node_uid(self, node: str) -> str:
        """The UID of Node ``node`` (the owner of its slices)."""
        what = f"Node {node}"
        obj = await self._call("GET", f"/api/v1/nodes/{url_quote(node, safe='')}", what)
        meta = obj.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if not isinstance(uid, str) or not uid:
            raise ApiServerError(f"{what}: the answer has no metadata.uid: {quote(obj)}", 200)
        return uid

    async def daemonset(self, namespace: str, name: str) -> Obj:
        """DaemonSet ``namespace/name`` as it is; :class:`ApiServerError` with the status
        when the API server refuses (404: it is gone)."""
        what = f"DaemonSet {namespace}/{name}"
        path = (
            f"/apis/apps/v1/namespaces/{url_quote(namespace, safe='')}"
            f"/daemonsets/{url_quote(name, safe='')}"
        )
        return await self._call("GET", path, what)

    async def list_slices(self, driver: str, node: str) -> list[Obj]:
        """Every ResourceSlice of ``driver`` on ``node``, read in pages of :data:`LIST_PAGE`."""
        what = f"ResourceSlices of {driver} on {node}: list"
        params = {**_selector(driver, node), "limit": str(LIST_PAGE)}
        items: list[Obj] = []
        while True:
            page = await self._call("GET", SLICES_PATH, what, params=params)
            found = page.get("items")
            if found is None:
                found = []
            if not isinstance(found, list):
                raise ApiServerError(f"{what}: items is not a list: {quote(found)}")
            items += [slice_shape(item, what) for item in found]
            meta = page.get("metadata")
            more = meta.get("continue") if isinstance(meta, dict) else None
            if not more:
                return items
            if not isinstance(more, str):
                raise ApiServerError(f"{what}: metadata.continue {quote(more)} is not a string")
            params["continue"] = more

    async def create_slice(self, obj: Obj, *, dry_run: bool = False) -> Obj:
        """POST ``obj``; with ``dry_run`` the API server answers what it would store, and
        stores nothing."""
        what = f"{_name(obj)}: create" + (" (dry run)" if dry_run else "")
        params = {"fieldManager": "cdi-gen"}
        if dry_run:
            params["dryRun"] = "All"
        return slice_shape(
            await self._call("POST", SLICES_PATH, what, params=params, body=obj), what
        )

    async def replace_slice(self, obj: Obj) -> Obj:
        """PUT ``obj``; with ``metadata.resourceVersion`` set it fails with 409 when the slice
        changed meanwhile."""
        what = f"{_name(obj)}: replace"
        path = f"{SLICES_PATH}/{url_quote(obj['metadata']['name'], safe='')}"
        params = {"fieldManager": "cdi-gen"}
        return slice_shape(await self._call("PUT", path, what, params=params, body=obj), what)

    async def delete_slice(self, name: str) -> None:
        """Delete a slice; one that is already gone is fine."""
        what = f"ResourceSlice {name}: delete"
        try:
            await self._call("DELETE", f"{SLICES_PATH}/{url_quote(name, safe='')}", what)
        except ApiServerError as exc:
            if exc.status != 404:
                raise

    async def watch_slices(
        self,
        driver: str,
        node: str,
        resource_version: str | None = None,
        *,
        on_open: Callable[[], None] | None = None,
        on_bookmark: Callable[[str], None] | None = None,
    ) -> AsyncGenerator[tuple[str, Obj], None]:
        """(event type, slice) for every change of ``driver``'s slices on ``node`` after
        ``resource_version`` (None: from now) until the API server ends the watch (the
        iteration ends) or it fails (:class:`ApiServerError`, also for a line that is not a
        well-formed event; status 410 when ``resource_version`` is too old to watch from).
        ``on_open`` is called once the API server has accepted the watch: from then on no
        change is missed. Bookmarks are asked for: ``on_bookmark`` gets each one's
        resourceVersion, a point to watch on from even when none of our slices changed."""
        what = f"ResourceSlices of {driver} on {node}: watch"
        params = {
            **_selector(driver, node),
            "watch": "true",
            "timeoutSeconds": str(WATCH_SECONDS),
            "allowWatchBookmarks": "true",
        }
        if resource_version is not None:
            params["resourceVersion"] = resource_version
        try:
            async with self._http.stream(
                "GET", SLICES_PATH, params=params, timeout=self._watch_timeout
            ) as response:
                if response.is_error:
                    await response.aread()
                    raise ApiServerError(f"{what}: {failure(response)}", response.status_code)
                if on_open is not None:
                    on_open()
                async for line in response.aiter_lines():
                    if line.strip():
                        kind, obj = watch_event(line, what)
                        if kind != "BOOKMARK":
                            yield kind, obj
                        elif on_bookmark is not None:
                            on_bookmark(obj["metadata"]["resourceVersion"])
                        # Not held while the watch waits, for minutes: a slice of 128
                        # devices decodes to about 140 KiB.
                        del obj
        except (httpx2.HTTPError, OSError) as exc:
            raise ApiServerError(f"{what}: {first_line(exc)}") from None


def _events_path(namespace: str) -> str:
    if not is_dns_label(namespace):
        raise ApiServerError(f"namespace {quote(namespace)}: not a namespace's name")
    return f"/apis/events.k8s.io/v1/namespaces/{url_quote(namespace, safe='')}/events"


def _selector(driver: str, node: str) -> dict[str, str]:
    return {"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"}


def _check_is_claim(obj: Obj, namespace: str, name: str, uid: str, what: str) -> None:
    """Raise :class:`ApiServerError` unless ``obj`` is claim ``namespace/name`` with ``uid``."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    found = (obj.get("kind"), meta.get("namespace"), meta.get("name"), meta.get("uid"))
    if found != ("ResourceClaim", namespace, name, uid):
        raise ApiServerError(
            f"{what}: the answer is not the claim (want kind ResourceClaim, {namespace}/{name}, "
            f"uid {uid}): kind, namespace, name, uid {quote(found)}",
            200,
        )


def _device_key(entry: Obj) -> tuple[object, ...]:
    """The key of a ``status.devices`` entry (a list map by these four)."""
    return tuple(entry.get(k) for k in ("driver", "pool", "device", "shareID"))


def _name(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        return f"ResourceSlice {meta['generateName']}*"
    return f"ResourceSlice {meta.get('name', '?')}"
