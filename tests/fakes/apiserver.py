"""A fake Kubernetes API server: real HTTP/1.1 on 127.0.0.1, the wire format of the real one;
plain, or HTTPS under a CA of its own (``FakeApiServer(tls=folder)``) as a real one serves it.

It serves what the agent calls — the Node, ResourceClaims (read; their status.devices applied,
:mod:`tests.fakes.devicestatus`), DaemonSets (the agent's own, asked
about at exit), Events (events.k8s.io/v1: created, checked as the real one validates them,
and merge-patched), and ResourceSlices (list with ``limit``/``continue``, watch as chunked JSON
lines from now or from a resourceVersion, with bookmarks when asked, create, replace with
resourceVersion conflicts, delete) — and refuses what the real API server refuses where the
tests need it (a ``pool.generation`` outside int64 is a 400, as the real JSON decoder
answers).

The test plays "another writer" with :meth:`FakeApiServer.write` and :meth:`FakeApiServer.remove`
(watchers see the events), and a hostile or broken server with :meth:`FakeApiServer.send_raw`
(any bytes as one watch line), :attr:`FakeApiServer.answers` (any status and body for a
path) and :meth:`FakeApiServer.expire_versions` (a watch from an older resourceVersion gets
410 Gone, as after etcd's compaction). Tests wait on :meth:`FakeApiServer.until`, never on time.

Use it as ``async with FakeApiServer() as api:``; ``api.kubeconfig(folder)`` writes a
kubeconfig that points at it (and, with TLS, trusts its CA: what a pod's service account
gives the agent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from tests.fakes.devicestatus import Owners, apply_status

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/"
NODES = "/api/v1/nodes/"
DAEMONSETS = "/apis/apps/v1/namespaces/"
EVENTS = "/apis/events.k8s.io/v1/namespaces/"
INT64_MAX = (1 << 63) - 1

Obj = dict[str, Any]


@dataclass
class Answer:
    """A canned answer: ``body`` with ``status`` and extra ``headers``; sent chunked (no
    Content-Length) when ``chunked``; used ``times`` times (None: every time)."""

    status: int
    body: bytes
    chunked: bool = False
    times: int | None = None
    headers: dict[str, str] | None = None


def _status(code: int, reason: str, message: str) -> tuple[int, Obj]:
    return code, {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


def _selector(query: dict[str, list[str]]) -> dict[str, str]:
    """A request's ``fieldSelector`` as {field: value}."""
    items = query.get("fieldSelector", [""])[0].split(",")
    return dict(item.split("=", 1) for item in items if item)


def _selected(obj: Obj, wanted: dict[str, str]) -> bool:
    spec = obj.get("spec") or {}
    return all(str(spec.get(k.removeprefix("spec."))) == v for k, v in wanted.items())


class FakeApiServer:
    """One fake API server; state is plain dicts the test may read."""

    def __init__(self, tls: Path | None = None) -> None:
        #: A folder for the CA and the serving certificate; None serves plain HTTP.
        self.tls = tls
        self.slices: dict[str, Obj] = {}
        self.claims: dict[tuple[str, str], Obj] = {}
        #: Per claim and field manager, the keys of the status.devices entries it owns
        #: (server-side apply of the status subresource).
        self.status_owners: dict[tuple[str, str], Owners] = {}
        #: An API server with DRAResourceClaimDeviceStatus off: status.devices is dropped.
        self.drop_device_status = False
        self.nodes: dict[str, str] = {}
        #: DaemonSets by (namespace, name), answered as they are.
        self.daemonsets: dict[tuple[str, str], Obj] = {}
        #: Events (events.k8s.io/v1) by (namespace, name), as created and patched.
        self.events: dict[tuple[str, str], Obj] = {}
        #: Canned answers by (method, path): they win over the real handling (not watches).
        self.answers: dict[tuple[str, str], Answer] = {}
        #: Called right after a slice list is answered (a change "between" list and watch).
        self.after_list: Callable[[], None] | None = None
        #: While set and not yet set free, every write (POST, PUT, DELETE) waits for it: an API
        #: server that hangs.
        self.hold_writes: asyncio.Event | None = None
        #: The same for every read (GET that is not a watch).
        self.hold_reads: asyncio.Event | None = None
        #: Every request as (method, path, query).
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        self.watches_opened = 0
        self.watches_closed = 0
        #: Whether slices keep ``allowMultipleAllocations`` and request policies; an API
        #: server without ``DRAConsumableCapacity`` drops them without an error.
        self.consumable_capacity = True
        #: Whether slices keep ``sharedCounters`` and ``consumesCounters``; an API server
        #: without ``DRAPartitionableDevices`` (1.35's default) drops them without an error.
        self.partitionable_devices = True
        #: A watch from a resourceVersion below this gets 410 Gone.
        self.oldest_version = 0
        self._version = 0
        #: Every slice event as (resourceVersion, slice, line): a watch from a version
        #: replays them.
        self._history: list[tuple[int, Obj, bytes]] = []
        #: Open watches, each with whether it asked for bookmarks and its field selector.
        self._watchers: dict[asyncio.Queue[bytes | None], tuple[bool, dict[str, str]]] = {}
        self._changed = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._handlers: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self.port = 0

    async def __aenter__(self) -> FakeApiServer:
        context = None
        if self.tls is not None:
            from tests.pki import Authority

            authority = Authority(self.tls)
            serving = authority.issue(
                "apiserver", "fake-apiserver", ips=("127.0.0.1",), server=True
            )
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(serving.cert, serving.key)
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for queue in self._watchers:
            queue.put_nowait(None)
        assert self._server is not None
        self._server.close()
        # Closing the connections ends their handlers (a cancelled handler is logged by
        # asyncio's stream machinery as an error).
        for writer in self._handlers.values():
            writer.transport.abort()
        await asyncio.gather(*self._handlers, *self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"{'http' if self.tls is None else 'https'}://127.0.0.1:{self.port}"

    def kubeconfig(self, folder: Path) -> Path:
        """A kubeconfig for this server (a token user: lightkube wants one)."""
        path = folder / "kubeconfig"
        cluster: Obj = {"server": self.url}
        if self.tls is not None:
            cluster["certificate-authority"] = str(self.tls / "ca.crt")
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": cluster}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "c", "context": {"cluster": "fake", "user": "u"}}],
                    "current-context": "c",
                }
            )
        )
        return path

    # -- the test's side ---------------------------------------------------------------

    async def until(self, check: Callable[[], bool], within: float = 10.0) -> None:
        """Wait until ``check()`` holds; it is evaluated after every request and change."""

        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(check)

        await asyncio.wait_for(wait(), within)

    def _notify(self) -> Awaitable[None]:
        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        return notify()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def version(self) -> int:
        """The newest resourceVersion handed out."""
        return self._version

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def expire_versions(self) -> None:
        """Every resourceVersion handed out so far becomes too old to watch from."""
        self.oldest_version = self._version + 1

    def send_raw(self, line: bytes) -> None:
        """``line`` (plus a newline) to every open watch, as it is."""
        for queue in self._watchers:
            queue.put_nowait(line + b"\n")

    def write(self, obj: Obj) -> Obj:
        """Create or replace a slice as another writer would; watchers see the event."""
        obj = json.loads(json.dumps(obj))
        name = obj["metadata"]["name"]
        old = self.slices.get(name)
        meta = obj["metadata"]
        meta["uid"] = old["metadata"]["uid"] if old else str(uuid.uuid4())
        meta["resourceVersion"] = self._next_version()
        self.slices[name] = obj
        self._event("MODIFIED" if old else "ADDED", obj)
        return obj

    def remove(self, name: str) -> None:
        """Delete a slice as another writer would (the kubelet at its start)."""
        obj = self.slices.pop(name)
        # As the real one, the deletion has a resourceVersion of its own.
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": self._next_version()}}
        self._event("DELETED", obj)

    def _event(self, kind: str, obj: Obj) -> None:
        line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
        self._history.append((int(obj["metadata"]["resourceVersion"]), obj, line))
        # As the real one, a watch sees only the slices its field selector selects.
        for queue, (_, wanted) in self._watchers.items():
            if _selected(obj, wanted):
                queue.put_nowait(line)
        self._spawn(self._notify())

    # -- HTTP ------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._handlers[me] = writer
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, target, _ = line.decode().split(" ", 2)
                headers: dict[str, str] = {}
                while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    key, _, value = header.decode().partition(":")
                    headers[key.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                parts = urlsplit(target)
                path, query = unquote(parts.path), parse_qs(parts.query)
                self.requests.append((method, path, query))
                await self._notify()
                if query.get("watch", [""])[0] in ("true", "1"):
                    await self._watch(reader, writer, query)
                    return
                await self._answer(writer, method, path, query, body)
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            del self._handlers[me]
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(
        self,
        writer: asyncio.StreamWriter,
        method: str,
        path: str,
        query: dict[str, list[str]],
        body: bytes,
    ) -> None:
        if method != "GET" and self.hold_writes is not None:
            await self.hold_writes.wait()
        if method == "GET" and self.hold_reads is not None:
            await self.hold_reads.wait()
        canned = self.answers.get((method, path))
        if canned is not None:
            if canned.times is not None:
                canned.times -= 1
                if canned.times <= 0:
                    del self.answers[(method, path)]
            await self._send(
                writer, canned.status, canned.body, chunked=canned.chunked, headers=canned.headers
            )
            return
        code, obj = self._handle(method, path, query, json.loads(body) if body else None)
        await self._send(writer, code, json.dumps(obj).encode())
        if method == "GET" and path == SLICES and self.after_list is not None:
            self.after_list()
        await self._notify()

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        code: int,
        body: bytes,
        *,
        chunked: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        head = f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        if chunked:
            writer.write(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())
            for start in range(0, len(body), 1 << 16):
                piece = body[start : start + (1 << 16)]
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()

    def _handle(
        self, method: str, path: str, query: dict[str, list[str]], body: Obj | None
    ) -> tuple[int, Obj]:
        if method == "GET" and path.startswith(NODES):
            return self._node(path[len(NODES) :])
        if method == "GET" and path.startswith(DAEMONSETS) and "/daemonsets/" in path:
            return self._daemonset(path)
        if path.startswith(EVENTS) and "/events" in path:
            return self._event_call(method, path, body or {})
        if method in ("GET", "PATCH") and path.startswith(CLAIMS):
            return self._claim(method, path, query, body)
        if path == SLICES or path.startswith(SLICES + "/"):
            return self._slices(method, path[len(SLICES) + 1 :], query, body)
        return _status(404, "NotFound", f"{method} {path}")

    def _claim(
        self, method: str, path: str, query: dict[str, list[str]], body: Obj | None
    ) -> tuple[int, Obj]:
        namespace, _, name = (
            path[len(CLAIMS) :].removesuffix("/status").partition("/resourceclaims/")
        )
        claim = self.claims.get((namespace, name))
        if method == "PATCH" and path.endswith("/status") and claim is not None:
            owners = self.status_owners.setdefault((namespace, name), {})
            return apply_status(claim, owners, query, body or {}, self.drop_device_status)
        if method != "GET" or claim is None:
            return _status(404, "NotFound", f'resourceclaims "{name}" not found')
        return 200, claim

    def _event_call(self, method: str, path: str, body: Obj) -> tuple[int, Obj]:
        """Create an Event, or merge a patch into one, checked as the real API server checks
        what the agent sends (events.k8s.io/v1 validation)."""
        namespace, _, name = path[len(EVENTS) :].partition("/events")
        name = name.removeprefix("/")
        if method == "POST" and not name:
            meta = body.get("metadata") or {}
            regarding = body.get("regarding") or {}
            problems = [
                f"{key}: Required value"
                for key in (
                    "eventTime",
                    "reportingController",
                    "reportingInstance",
                    "action",
                    "reason",
                    "type",
                )
                if not body.get(key)
            ]
            if meta.get("namespace") != namespace or regarding.get("namespace") != namespace:
                problems.append("metadata.namespace: does not match regarding.namespace")
            if len(str(body.get("note", "")).encode()) > 1024:
                problems.append("note: Too long: may not be longer than 1024")
            series = body.get("series")
            if series is not None and series.get("count", 0) < 2:
                problems.append("series.count: Invalid value: should be at least 2")
            if problems:
                return _status(422, "Invalid", "; ".join(problems))
            key = (namespace, meta["name"])
            if key in self.events:
                return _status(409, "AlreadyExists", f'events "{meta["name"]}" already exists')
            self.events[key] = body
            return 201, body
        if method == "PATCH" and name:
            event = self.events.get((namespace, name))
            if event is None:
                return _status(404, "NotFound", f'events "{name}" not found')
            event.update(body)
            return 200, event
        return _status(405, "MethodNotAllowed", f"{method} on events")

    def _daemonset(self, path: str) -> tuple[int, Obj]:
        namespace, _, name = path[len(DAEMONSETS) :].partition("/daemonsets/")
        daemonset = self.daemonsets.get((namespace, name))
        if daemonset is None:
            return _status(404, "NotFound", f'daemonsets.apps "{name}" not found')
        return 200, daemonset

    def _node(self, name: str) -> tuple[int, Obj]:
        if name not in self.nodes:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        meta = {"name": name, "uid": self.nodes[name], "resourceVersion": "1"}
        return 200, {"kind": "Node", "apiVersion": "v1", "metadata": meta}

    def _slices(
        self, method: str, name: str, query: dict[str, list[str]], body: Obj | None
    ) -> tuple[int, Obj]:
        handlers = {
            ("", "GET"): lambda: self._list(query),
            ("", "POST"): lambda: self._create(self._gated(body or {}), query),
            ("1", "PUT"): lambda: self._replace(name, self._gated(body or {})),
            ("1", "DELETE"): lambda: self._delete(name),
        }
        handler = handlers.get(("1" if name else "", method))
        if handler is None:
            return _status(405, "MethodNotAllowed", f"{method} on resourceslices")
        return handler()

    def _delete(self, name: str) -> tuple[int, Obj]:
        if name not in self.slices:
            return _status(404, "NotFound", f'resourceslices "{name}" not found')
        self.remove(name)
        return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    def _list(self, query: dict[str, list[str]]) -> tuple[int, Obj]:
        wanted = _selector(query)
        items = [s for _, s in sorted(self.slices.items()) if _selected(s, wanted)]
        start = int(query.get("continue", ["0"])[0])
        limit = int(query.get("limit", [str(len(items) or 1)])[0])
        page = items[start : start + limit]
        meta: Obj = {"resourceVersion": str(self._version)}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        kind = {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1"}
        return 200, {**kind, "metadata": meta, "items": page}

    @staticmethod
    def _invalid(body: Obj) -> str | None:
        generation = ((body.get("spec") or {}).get("pool") or {}).get("generation")
        if not isinstance(generation, int) or not 0 <= generation <= INT64_MAX:
            return f"spec.pool.generation: cannot unmarshal {generation!r} into int64"
        return None

    def _gated(self, body: Obj) -> Obj:
        """``body`` as the API server stores it: without the consumable-capacity fields when
        that gate is off, and without counters when partitionable devices are off."""
        spec = body.get("spec") or {}
        if not self.partitionable_devices:
            spec.pop("sharedCounters", None)
            for device in spec.get("devices") or ():
                device.pop("consumesCounters", None)
        if self.consumable_capacity:
            return body
        for device in spec.get("devices") or ():
            device.pop("allowMultipleAllocations", None)
            for capacity in (device.get("capacity") or {}).values():
                capacity.pop("requestPolicy", None)
        return body

    def _create(self, body: Obj, query: dict[str, list[str]]) -> tuple[int, Obj]:
        meta = body["metadata"]
        if "name" not in meta and "generateName" in meta:
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta["name"]
        if name in self.slices:
            return _status(409, "AlreadyExists", f'resourceslices "{name}" already exists')
        if (why := self._invalid(body)) is not None:
            return _status(400, "BadRequest", why)
        meta.pop("resourceVersion", None)
        if query.get("dryRun") == ["All"]:
            return 201, {**body, "metadata": {**meta, "uid": str(uuid.uuid4())}}
        return 201, self.write(body)

    def _replace(self, name: str, body: Obj) -> tuple[int, Obj]:
        current = self.slices.get(name)
        if current is None:
            return _status(404, "NotFound", f'resourceslices "{name}" not found')
        if (why := self._invalid(body)) is not None:
            return _status(400, "BadRequest", why)
        sent = body["metadata"].get("resourceVersion")
        if sent is not None and sent != current["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", f'resourceslices "{name}": object was modified')
        return 200, self.write(body)

    async def _watch(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        query: dict[str, list[str]],
    ) -> None:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        since = query.get("resourceVersion", [""])[0]
        if since and int(since) < self.oldest_version:
            gone = _status(410, "Expired", f"too old resource version: {since}")[1]
            queue.put_nowait(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            queue.put_nowait(None)
        elif since:
            # What happened after that version, first; no await before the watch is
            # registered, so nothing falls between.
            for version, obj, line in self._history:
                if version > int(since) and _selected(obj, _selector(query)):
                    queue.put_nowait(line)
        bookmarks = query.get("allowWatchBookmarks", [""])[0] == "true"
        self._watchers[queue] = (bookmarks, _selector(query))
        self.watches_opened += 1
        await self._notify()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        # The client closing its end (it gave up on this watch) ends the stream.
        gone = asyncio.ensure_future(reader.read())
        try:
            while True:
                item = asyncio.ensure_future(queue.get())
                await asyncio.wait([item, gone], return_when=asyncio.FIRST_COMPLETED)
                if not item.done():
                    item.cancel()
                    return
                line = item.result()
                if line is None:
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                    return
                for start in range(0, len(line), 1 << 16):
                    piece = line[start : start + (1 << 16)]
                    writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
        finally:
            gone.cancel()
            del self._watchers[queue]
            self.watches_closed += 1
            await self._notify()

    def end_watches(self) -> None:
        """End every open watch cleanly, as the API server does after its timeout (with a
        bookmark of the newest resourceVersion just before, to those that asked)."""
        bookmark = {"kind": "ResourceSlice", "metadata": {"resourceVersion": str(self._version)}}
        line = json.dumps({"type": "BOOKMARK", "object": bookmark}).encode() + b"\n"
        for queue, (bookmarks, _) in self._watchers.items():
            if bookmarks:
                queue.put_nowait(line)
            queue.put_nowait(None)
