"""An API server stand-in that serves ResourceClaims over real HTTP, as told, for the agent's
claim reads: any body (hostile ones included), a stalled answer, and a record of every path
asked for.

It runs a stdlib HTTP server on 127.0.0.1 in a thread of its own (the agent's loop must stay
free: the reader under test blocks a worker thread, and the client runs on the loop) and
writes a kubeconfig pointing at it. ``bodies`` maps a claim's ``(namespace, name)`` to the
bytes answered with status 200; anything else gets a 404 Status. A claim in ``stalled``
is answered only once ``release`` is set.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

CLAIMS_PATH = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}"
_NOT_FOUND = orjson.dumps(
    {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
)


def claim_body(
    namespace: str,
    name: str,
    uid: str,
    *results: dict[str, Any],
    config: list[dict[str, Any]] | None = None,
) -> bytes:
    """An allocated ResourceClaim with ``results`` (and the allocation's ``config``
    entries) as the API server sends it."""
    devices: dict[str, Any] = {"results": list(results)}
    if config is not None:
        devices["config"] = config
    return orjson.dumps(
        {
            "kind": "ResourceClaim",
            "apiVersion": "resource.k8s.io/v1",
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": devices}},
        }
    )


class ClaimServer:
    """The stand-in; use ``with ClaimServer.running(folder) as server``."""

    def __init__(self, folder: Path) -> None:
        self.bodies: dict[tuple[str, str], bytes] = {}
        self.stalled: set[tuple[str, str]] = set()
        self.release = threading.Event()
        #: Every path asked for, in order.
        self.requests: list[str] = []
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._http.daemon_threads = True
        self.kubeconfig = folder / "kubeconfig"
        host, port = self._http.server_address[:2]
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters: [{{name: fake, cluster: {{server: 'http://{host!s}:{port}'}}}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: agent}}]\n"
            "users: [{name: agent, user: {token: not-a-secret}}]\n"
        )

    @classmethod
    @contextmanager
    def running(cls, folder: Path) -> Iterator[ClaimServer]:
        server = cls(folder)
        thread = threading.Thread(target=server._http.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        try:
            yield server
        finally:
            server.release.set()
            server._http.shutdown()
            server._http.server_close()
            thread.join()

    def _answer(self, path: str) -> tuple[int, bytes]:
        self.requests.append(path)
        for (namespace, name), body in self.bodies.items():
            if path == CLAIMS_PATH.format(namespace, name):
                if (namespace, name) in self.stalled:
                    self.release.wait()
                return 200, body
        return 404, _NOT_FOUND

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = server._answer(self.path.partition("?")[0])
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test reads ``requests``

        return Handler
