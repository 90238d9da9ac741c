"""A stand-in Kubernetes API server for the DRA driver: real HTTP on a real TCP port.

It answers what :class:`~cdi_gen.apiserver.client.ApiClient` asks through lightkube: a Node
(its UID), and ResourceSlices listed, watched (a chunked stream of events), created,
replaced (409 on a stale ``resourceVersion``) and deleted, filtered by the field selector
``spec.nodeName``/``spec.driver``. Every write is recorded in :attr:`FakeApiServer.writes`
in order, so a test can say what was ever published, not only what is there now; a test
waits for a state with :meth:`FakeApiServer.until` (woken by each write, no polling).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import orjson

Obj = dict[str, Any]
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NODES = "/api/v1/nodes/"


def _selected(obj: Obj, selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, want = term.partition("=")
        value: Any = obj
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value != want:
            return False
    return True


def devices_of(obj: Obj) -> list[Obj]:
    """The devices a ResourceSlice lists."""
    return list((obj.get("spec") or {}).get("devices") or [])


class FakeApiServer:
    """The API server of one test; ``async with`` serves it on 127.0.0.1."""

    def __init__(self, nodes: tuple[str, ...] = ("node-1",)) -> None:
        self.nodes = {name: str(uuid.uuid4()) for name in nodes}
        self.slices: dict[str, Obj] = {}
        #: Every write in order: ("create" | "replace" | "delete", the slice as stored).
        self.writes: list[tuple[str, Obj]] = []
        self._versions = itertools.count(1)
        self._changed = asyncio.Condition()
        self._watchers: set[tuple[str, asyncio.Queue[bytes | None]]] = set()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0

    # -- for tests -------------------------------------------------------------------------

    def seed(self, obj: Obj) -> None:
        """Put a slice in place as an earlier writer left it (not recorded as a write)."""
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        obj["metadata"].setdefault("uid", str(uuid.uuid4()))
        self.slices[obj["metadata"]["name"]] = obj

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig file for this server (plain HTTP, no credentials)."""
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters: [{{name: fake, cluster: {{server: 'http://127.0.0.1:{self.port}'}}}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
            "users: [{name: fake, user: {}}]\n"
        )
        return path

    async def until(self, condition: Callable[[], bool], within: float = 10.0) -> None:
        """Return once ``condition()`` holds, checked after every write."""
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(condition)

    # -- serving ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
        # Connections the client left open end here, not in the loop's teardown.
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                url = urlsplit(target)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                if method == "GET" and query.get("watch") in ("true", "1"):
                    await self._watch(query.get("fieldSelector", ""), writer)
                    return
                status, answer = await self._answer(method, url.path, query, body)
                data = orjson.dumps(answer)
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the server stops
        finally:
            writer.close()
            self._connections.discard(task)

    async def _answer(self, method: str, path: str, query: dict[str, str], body: bytes) -> Any:
        if method == "GET" and path.startswith(NODES):
            return self._node(path[len(NODES) :])
        if path == SLICES:
            return await self._collection(method, query, body)
        if path.startswith(SLICES + "/"):
            return await self._item(method, path[len(SLICES) + 1 :], body)
        return _status(404, f"{method} {path}: not served by the fake API server")

    def _node(self, name: str) -> tuple[str, Obj]:
        if name not in self.nodes:
            return _status(404, f'nodes "{name}" not found')
        meta = {"name": name, "uid": self.nodes[name], "resourceVersion": "1"}
        return "200 OK", {"apiVersion": "v1", "kind": "Node", "metadata": meta}

    async def _collection(self, method: str, query: dict[str, str], body: bytes) -> Any:
        if method == "GET":
            selector = query.get("fieldSelector", "")
            items = [s for s in self.slices.values() if _selected(s, selector)]
            return "200 OK", {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSliceList",
                "metadata": {"resourceVersion": str(next(self._versions))},
                "items": copy.deepcopy(items),
            }
        obj = orjson.loads(body)  # POST
        name = obj["metadata"]["name"]
        if name in self.slices:
            return _status(409, f'resourceslices "{name}" already exists')
        obj["metadata"]["uid"] = str(uuid.uuid4())
        return "201 Created", await self._store("create", obj)

    async def _item(self, method: str, name: str, body: bytes) -> Any:
        current = self.slices.get(name)
        if current is None:
            return _status(404, f'resourceslices "{name}" not found')
        if method == "GET":
            return "200 OK", copy.deepcopy(current)
        if method == "DELETE":
            await self._store("delete", current)
            return "200 OK", {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        obj = orjson.loads(body)  # PUT
        version = obj["metadata"].get("resourceVersion")
        if version and version != current["metadata"]["resourceVersion"]:
            return _status(409, f'resourceslices "{name}": the object has been modified')
        obj["metadata"]["uid"] = current["metadata"]["uid"]
        return "200 OK", await self._store("replace", obj)

    async def _store(self, verb: str, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        name = obj["metadata"]["name"]
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        if verb == "delete":
            self.slices.pop(name, None)
        else:
            self.slices[name] = obj
        self.writes.append((verb, copy.deepcopy(obj)))
        kind = {"create": "ADDED", "replace": "MODIFIED", "delete": "DELETED"}[verb]
        event = orjson.dumps({"type": kind, "object": obj}) + b"\n"
        for selector, queue in self._watchers:
            if _selected(obj, selector):
                queue.put_nowait(event)
        async with self._changed:
            self._changed.notify_all()
        return copy.deepcopy(obj)

    async def _watch(self, selector: str, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        for obj in self.slices.values():
            if _selected(obj, selector):
                queue.put_nowait(orjson.dumps({"type": "ADDED", "object": obj}) + b"\n")
        watcher = (selector, queue)
        self._watchers.add(watcher)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        try:
            while (line := await queue.get()) is not None:
                writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            self._watchers.discard(watcher)


def _status(code: int, message: str) -> tuple[str, Obj]:
    reasons = {404: "NotFound", 409: "Conflict"}
    phrase = {404: "Not Found", 409: "Conflict"}[code]
    return f"{code} {phrase}", {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reasons[code],
        "code": code,
    }
