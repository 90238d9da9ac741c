"""The API server as the agent needs it: claims, the Node's UID, this node's ResourceSlices
and the agent's own DaemonSet (asked about at exit) — a thin async layer over an HTTP client
that lightkube configures.

Everything goes in and out as plain dicts (the slices :mod:`~cdi_gen.dra.plugin.slices`
builds) or as the domain's values (:class:`~cdi_gen.model.ClaimView`). Every failure is one
line naming the object and why: :class:`ApiServerError` for a call, :class:`KubeConfigError`
(exit 2) for a configuration that cannot be loaded, naming what was tried.

The API server's answers are input like any other: each is read up to a bound
(:data:`MAX_ANSWER_BYTES` an object or a watch line, :data:`LIST_PAGE` objects a list page)
and refused beyond it, decoded as JSON and checked for the shape the driver relies on, so a
proxy's HTML page, a truncated line or an object of gigabytes is one refusal that says so,
never a traceback or an agent grown by the size of the answer. The kubeconfig and the files it
names are read with the same bound as other configs (:data:`~cdi_gen.files.CONFIG_MAX_BYTES`),
and :meth:`ApiClient.open` reads them off the event loop.

lightkube supplies the configuration: kubeconfig and in-cluster models, TLS, and every
authentication scheme (tokens, token files re-read on 401, client certificates, exec
plugins). The calls themselves are plain REST on lightkube's HTTP client, so that every
answer passes through the one bounded, checked path above.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote as url_quote

import httpx2
import yaml
from lightkube import ConfigError, KubeConfig
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import DEFAULT_KUBECONFIG, SERVICE_ACCOUNT

from cdi_gen.cdi.codec import BOUND_ERROR, load_yaml
from cdi_gen.errors import CdiGenError, ClaimError, quote
from cdi_gen.errors import ConfigError as CdiConfigError
from cdi_gen.files import CONFIG_MAX_BYTES, FileRefused, read_regular
from cdi_gen.model import AllocatedDevice, ClaimView, ConfigEntry
from cdi_gen.names import is_dns_label, is_dns_subdomain

__all__ = [
    "LIST_PAGE",
    "MAX_ANSWER_BYTES",
    "ApiClient",
    "ApiServerError",
    "KubeConfigError",
    "load_config",
]

Obj = dict[str, Any]

#: Largest answer read for one object, and longest watch line (one event). The API server
#: refuses a request body over 3 MiB, so no object it stores is larger; the rest is room for
#: what it adds (status, managed fields).
MAX_ANSWER_BYTES = 4 << 20
#: Slices asked for per list call: a page stays within ``LIST_PAGE`` objects' bound.
LIST_PAGE = 4
#: Seconds the API server keeps a watch open before ending it (we then watch again); the read
#: timeout of a watch is a little longer, so a server that went silent is noticed.
WATCH_SECONDS = 300
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
#: Set by the API server on a claim made from a ResourceClaimTemplate: the pod's name for it.
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"


class KubeConfigError(CdiConfigError):
    """No usable API server configuration; the message says what was tried."""


class ApiServerError(CdiGenError):
    """A call to the API server failed; ``status`` is the HTTP status when it answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AnswerRefused(httpx2.HTTPError):
    """An answer the client does not read: over its bound, or encoded as we did not ask."""


def _human(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size} bytes"


def _why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


# -- configuration ---------------------------------------------------------------------


def load_config(kubeconfig: Path | None) -> KubeConfig:
    """An explicit kubeconfig; else the in-cluster service account; else ``$KUBECONFIG`` or
    ``~/.kube/config``. Raises :class:`KubeConfigError` naming what was tried. Reads files:
    call it off the event loop."""
    if kubeconfig is not None:
        return _from_file(kubeconfig, f"--kubeconfig {str(kubeconfig)!r}")
    account = Path(SERVICE_ACCOUNT)
    in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ and "KUBERNETES_SERVICE_PORT" in (
        os.environ
    )
    if in_cluster and (account / "token").is_file():
        what = f"in-cluster config from {account}"
        for name in ("token", "namespace", "ca.crt"):
            _check_file(account / name, what)
        try:
            return KubeConfig.from_service_account(account)
        except (ConfigError, OSError, KeyError, ValueError) as exc:
            raise KubeConfigError(f"{what}: {_why(exc)}") from None
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


def _check_file(path: str | Path, what: str) -> bytes:
    """A file the configuration needs, read within the config bound (lightkube and OpenSSL
    read it again by name; this refuses a FIFO, a device or a huge file first)."""
    try:
        return read_regular(path, CONFIG_MAX_BYTES)
    except FileNotFoundError:
        raise KubeConfigError(f"{what}: {str(path)!r}: no such file") from None
    except FileRefused as exc:
        raise KubeConfigError(f"{what}: {str(path)!r}: {exc}") from None


def _from_file(path: Path, what: str) -> KubeConfig:
    if not path.exists():
        raise KubeConfigError(f"no API server configuration: {what}: no such file")
    data = _check_file(path, what)
    try:
        # Bounded (nesting, alias expansion): a config bomb costs no more than its bytes.
        loaded = load_yaml(data)
        if not isinstance(loaded, dict):
            raise ValueError(f"not a mapping but {quote(loaded)}")
        kubeconfig = KubeConfig.from_dict(loaded, fname=path)
        config = kubeconfig.get()
        if config is None:
            raise ValueError("no current context")
    except (ConfigError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KubeConfigError(f"{what}: not a usable kubeconfig: {_why(exc)}") from None
    except yaml.YAMLError as exc:
        # Never the parser's text: it quotes the file, which may be any file we can read.
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1} column {mark.column + 1})" if mark else ""
        if getattr(exc, BOUND_ERROR, False):
            where += f": {getattr(exc, 'problem', '')}"
        raise KubeConfigError(f"{what}: not a usable kubeconfig: not YAML{where}") from None
    user = config.user
    named = [config.cluster.certificate_auth]
    if user is not None:
        named += [user.client_cert, user.client_key, user.token_file]
    for name in named:
        if name:
            _check_file(Path(config.abs_file(name)), what)
    return kubeconfig


# -- answers ---------------------------------------------------------------------------


class _Bounded(httpx2.AsyncByteStream):
    """A response body that fails once it passes ``limit`` bytes in all (``per_line``
    False) or in one line (a watch: it never ends, its events must each fit)."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, *, per_line: bool) -> None:
        self._inner = inner
        self._limit = limit
        self._per_line = per_line

    def _refuse(self) -> AnswerRefused:
        unit = "a line of the answer" if self._per_line else "the answer"
        return AnswerRefused(f"{unit} is over {_human(self._limit)}, refused")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        run = 0
        async for chunk in self._inner:
            if self._per_line and b"\n" in chunk:
                first, *middle, last = chunk.split(b"\n")
                if run + len(first) > self._limit or any(len(m) > self._limit for m in middle):
                    raise self._refuse()
                run = len(last)
            else:
                run += len(chunk)
            if run > self._limit:
                raise self._refuse()
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _is_watch(request: httpx2.Request) -> bool:
    return request.url.params.get("watch") in ("true", "1")


async def _bound_answer(response: httpx2.Response) -> None:
    """Every answer is read within its bound; a compressed one (we ask for none) is refused,
    since its size would only show after decompression."""
    watch = _is_watch(response.request)
    limit = MAX_ANSWER_BYTES
    if not watch and "limit" in response.request.url.params:
        limit = LIST_PAGE * MAX_ANSWER_BYTES
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise AnswerRefused(f"the answer is compressed ({quote(encoding)}) though not asked for")
    length = response.headers.get("content-length", "")
    if not watch and length.isdigit() and int(length) > limit:
        raise AnswerRefused(f"the answer is over {_human(limit)} ({_human(int(length))}), refused")
    stream = response.stream
    assert isinstance(stream, httpx2.AsyncByteStream)
    response.stream = _Bounded(stream, limit, per_line=watch)


def _decode(data: bytes | str, what: str) -> Obj:
    """An answer's JSON object, or :class:`ApiServerError` quoting the start of it."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested beyond the parser's stack
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        raise ApiServerError(f"{what}: the answer is not JSON: {quote(text)}") from None
    if not isinstance(obj, dict):
        raise ApiServerError(f"{what}: the answer is not a JSON object: {quote(obj)}")
    return obj


def _failure(response: httpx2.Response) -> str:
    """An error answer in one line: its Status message when it has one."""
    head = f"HTTP {response.status_code}"
    try:
        status = json.loads(response.content)
    except (ValueError, RecursionError):
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        reason = status.get("reason")
        if not isinstance(reason, str) or not reason:
            reason = ""
        else:
            reason = f" {reason}" if reason.isalnum() else f" {quote(reason)}"
        message: str = status["message"]
        # The API server's own messages read as they are; anything odd is quoted and cut.
        if len(message) > 200 or not message.isprintable():
            message = quote(message, 200)
        return f"{head}{reason}: {message}"
    return f"{head}: {quote(response.content)}"


def _slice_shape(obj: object, what: str) -> Obj:
    """``obj`` if it has what the publisher reads of a ResourceSlice: a name, a spec with a
    pool and an integer generation, devices as objects; :class:`ApiServerError` naming the
    rule."""
    if not isinstance(obj, dict):
        raise ApiServerError(f"{what}: a slice is not an object: {quote(obj)}")
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise ApiServerError(f"{what}: a slice has no metadata.name: {quote(obj)}")
    spec = obj.get("spec")
    pool = spec.get("pool") if isinstance(spec, dict) else None
    if not isinstance(pool, dict):
        raise ApiServerError(f"{what}: slice {quote(name)}: spec.pool is not an object")
    generation = pool.get("generation", 0)
    # Any integer: the publisher's generations move past whatever another writer set.
    if isinstance(generation, bool) or not isinstance(generation, int):
        raise ApiServerError(
            f"{what}: slice {quote(name)}: spec.pool.generation {quote(generation)} is not "
            "an integer"
        )
    devices = spec.get("devices") if isinstance(spec, dict) else None
    if devices is not None and not (
        isinstance(devices, list) and all(isinstance(d, dict) for d in devices)
    ):
        raise ApiServerError(f"{what}: slice {quote(name)}: spec.devices is not a list of objects")
    return obj


def _event(line: str, what: str) -> tuple[str, Obj]:
    """One watch line as (type, slice), or ("BOOKMARK", its object) for a bookmark: a
    ``metadata.resourceVersion`` string to watch on from."""
    event = _decode(line, what)
    kind, obj = event.get("type"), event.get("object")
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise ApiServerError(f"{what}: not a watch event: {quote(line)}")
    if kind == "ERROR":
        code = obj.get("code")
        message = obj.get("message")
        raise ApiServerError(
            f"{what}: error event: {quote(message if isinstance(message, str) else obj)}",
            code if isinstance(code, int) else None,
        )
    if kind == "BOOKMARK":
        meta = obj.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if not isinstance(version, str) or not version:
            raise ApiServerError(f"{what}: a bookmark without a resourceVersion: {quote(line)}")
        return kind, obj
    if kind not in ("ADDED", "MODIFIED", "DELETED"):
        raise ApiServerError(f"{what}: unknown watch event type {quote(kind)}")
    return kind, _slice_shape(obj, what)


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
        config = load_config(kubeconfig).get()
        assert config is not None  # load_config checked it
        _without_http2()
        try:
            self._http = client_adapter.AsyncClient(
                config, client_adapter.ConnectionParams(timeout=httpx2.Timeout(timeout))
            )
        except (ConfigError, OSError, ValueError) as exc:
            raise KubeConfigError(f"API server client: {_why(exc)}") from None
        # Uncompressed, so the bound counts what is decoded (see _bound_answer).
        self._http.headers["Accept-Encoding"] = "identity"
        self._http.event_hooks = {"response": [_bound_answer]}
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
    ) -> Obj:
        """One call; its answer's JSON object, or :class:`ApiServerError` in one line."""
        try:
            response = await self._http.request(
                method,
                path,
                params=params,
                content=None if body is None else json.dumps(body).encode(),
                headers=None if body is None else {"Content-Type": "application/json"},
            )
        except (httpx2.HTTPError, OSError) as exc:
            raise ApiServerError(f"{what}: {_why(exc)}") from None
        if response.is_error:
            raise ApiServerError(f"{what}: {_failure(response)}", response.status_code)
        return _decode(response.content, what)

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
            items += [_slice_shape(item, what) for item in found]
            meta = page.get("metadata")
            more = meta.get("continue") if isinstance(meta, dict) else None
            if not more:
                return items
            if not isinstance(more, str):
                raise ApiServerError(f"{what}: metadata.continue {quote(more)} is not a string")
            params["continue"] = more

    async def create_slice(self, obj: Obj) -> Obj:
        what = f"{_name(obj)}: create"
        params = {"fieldManager": "cdi-gen"}
        return _slice_shape(
            await self._call("POST", SLICES_PATH, what, params=params, body=obj), what
        )

    async def replace_slice(self, obj: Obj) -> Obj:
        """PUT ``obj``; with ``metadata.resourceVersion`` set it fails with 409 when the slice
        changed meanwhile."""
        what = f"{_name(obj)}: replace"
        path = f"{SLICES_PATH}/{url_quote(obj['metadata']['name'], safe='')}"
        params = {"fieldManager": "cdi-gen"}
        return _slice_shape(await self._call("PUT", path, what, params=params, body=obj), what)

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
                    raise ApiServerError(f"{what}: {_failure(response)}", response.status_code)
                if on_open is not None:
                    on_open()
                async for line in response.aiter_lines():
                    if line.strip():
                        kind, obj = _event(line, what)
                        if kind != "BOOKMARK":
                            yield kind, obj
                        elif on_bookmark is not None:
                            on_bookmark(obj["metadata"]["resourceVersion"])
                        # Not held while the watch waits, for minutes: a slice of 128
                        # devices decodes to about 140 KiB.
                        del obj
        except (httpx2.HTTPError, OSError) as exc:
            raise ApiServerError(f"{what}: {_why(exc)}") from None


def _selector(driver: str, node: str) -> dict[str, str]:
    return {"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"}


def _name(obj: Obj) -> str:
    return f"ResourceSlice {obj.get('metadata', {}).get('name', '?')}"


def claim_view(obj: object) -> ClaimView:
    """A ResourceClaim (as a dict) reduced to what NodePrepareResources needs.

    Raises :class:`ClaimError` naming the claim and the field when ``obj`` is not shaped
    as one: a field of the wrong type, a result without ``request``, ``driver``, ``pool``
    or ``device``.
    """
    meta = _field(obj, "metadata", dict, "a ResourceClaim", {})
    namespace, name = meta.get("namespace"), meta.get("name")
    shown = f"{namespace}/{name}"
    # Names the API server gave as Kubernetes names read as they are; anything else is quoted.
    plain = isinstance(namespace, str) and isinstance(name, str)
    plain = plain and is_dns_label(str(namespace)) and is_dns_subdomain(str(name))
    ref = f"ResourceClaim {shown if plain else quote(shown)}"
    namespace = _field(meta, "namespace", str, ref, "")
    name = _field(meta, "name", str, ref, "")
    uid = _field(meta, "uid", str, ref, "")
    status = _field(obj, "status", dict, ref, {})
    allocation = _field(status, "allocation", dict, ref, None)
    results: tuple[AllocatedDevice, ...] | None = None
    config: tuple[ConfigEntry, ...] = ()
    if allocation is not None:
        devices = _field(allocation, "devices", dict, ref, {})
        entries = _field(devices, "results", list, ref, [])
        results = tuple(
            _result(entry, f"{ref}: status.allocation.devices.results[{i}]")
            for i, entry in enumerate(entries)
        )
        configs = _field(devices, "config", list, f"{ref}: status.allocation.devices", [])
        config = tuple(
            entry
            for i, doc in enumerate(configs)
            if (entry := _config(doc, i, f"{ref}: status.allocation.devices.config[{i}]"))
        )
    annotations = _field(meta, "annotations", dict, ref, {})
    pod_claim_name = _field(annotations, POD_CLAIM_NAME, str, f"{ref}: annotations", None)
    if pod_claim_name is not None and not is_dns_label(pod_claim_name):
        # It becomes a folder of the path the pod's containers read device metadata from.
        raise ClaimError(
            f"{ref}: annotation {POD_CLAIM_NAME} {quote(pod_claim_name)} is not a pod's claim "
            "name: want a DNS label"
        )
    return ClaimView(
        namespace=namespace,
        name=name,
        uid=uid,
        results=results,
        config=config,
        pod_claim_name=pod_claim_name,
    )


_KINDS: dict[type[Any], str] = {
    dict: "an object",
    list: "a list",
    str: "a string",
    bool: "a boolean",
}


def _field(doc: object, key: str, kind: type[Any], where: str, default: Any) -> Any:
    """``doc[key]`` if it is a ``kind`` (``default`` when absent or null)."""
    if not isinstance(doc, dict):
        raise ClaimError(f"{where}: want an object, got {quote(doc)}")
    value = doc.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        want = _KINDS.get(kind, kind.__name__)
        raise ClaimError(f"{where}: {key}: want {want}, got {quote(value)}")
    return value


def _result(entry: object, where: str) -> AllocatedDevice:
    fields = {}
    for key in ("request", "driver", "pool", "device"):
        value = _field(entry, key, str, where, None)
        if value is None:
            raise ClaimError(f"{where}: has no {key!r}; every allocation result names one")
        fields[key] = value
    return AllocatedDevice(
        **fields,
        share_id=_field(entry, "shareID", str, where, None),
        admin_access=_field(entry, "adminAccess", bool, where, False),
    )


def _config(doc: object, index: int, where: str) -> ConfigEntry | None:
    """One ``config`` entry of the allocation; None when it is not opaque (a kind of
    configuration newer than this reader: no driver of ours could use it)."""
    source = _field(doc, "source", str, where, "")
    requests = _field(doc, "requests", list, where, [])
    if not all(isinstance(r, str) for r in requests):
        raise ClaimError(f"{where}: requests: want a list of strings, got {quote(requests)}")
    opaque = _field(doc, "opaque", dict, where, None)
    if opaque is None:
        return None
    driver = _field(opaque, "driver", str, f"{where}.opaque", None)
    if driver is None:
        raise ClaimError(f"{where}.opaque: has no 'driver'; every opaque entry names one")
    return ConfigEntry(
        source=source,
        driver=driver,
        requests=tuple(requests),
        parameters=opaque.get("parameters"),
        index=index,
    )
