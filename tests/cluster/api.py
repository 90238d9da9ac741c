"""A small client of the Kubernetes API over HTTPS with a client certificate.

The tests need a handful of calls (get, create, delete, list, watch, a pod's log); the standard
library does them in a page, without a generated client whose version would have to follow the
cluster's. ``kubectl`` (built with the cluster) is used where the command itself is the point,
such as ``kubectl apply -k``.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Obj = dict[str, Any]


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


class Api:
    def __init__(self, host: str, port: int, ca: Path, cert: Path, key: Path) -> None:
        self.host = host
        self.port = port
        self._ssl = ssl.create_default_context(cafile=str(ca))
        self._ssl.load_cert_chain(str(cert), str(key))

    def _connection(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self._ssl, timeout=timeout)

    def request_raw(
        self, method: str, path: str, body: Obj | None = None, timeout: float = 30
    ) -> tuple[int, bytes]:
        conn = self._connection(timeout)
        try:
            headers = {"Accept": "application/json"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def request(self, method: str, path: str, body: Obj | None = None) -> Obj:
        status, data = self.request_raw(method, path, body)
        if status >= 300:
            raise ApiError(method, path, status, data.decode(errors="replace"))
        result: Obj = json.loads(data) if data else {}
        return result

    def get(self, path: str) -> Obj:
        return self.request("GET", path)

    def get_or_none(self, path: str) -> Obj | None:
        status, data = self.request_raw("GET", path)
        if status == 404:
            return None
        if status >= 300:
            raise ApiError("GET", path, status, data.decode(errors="replace"))
        result: Obj = json.loads(data)
        return result

    def create(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, body)

    def delete(self, path: str, grace_seconds: int | None = None) -> None:
        query = "" if grace_seconds is None else f"?gracePeriodSeconds={grace_seconds}"
        status, data = self.request_raw("DELETE", path + query)
        if status >= 300 and status != 404:
            raise ApiError("DELETE", path, status, data.decode(errors="replace"))

    def text(self, path: str) -> str:
        status, data = self.request_raw("GET", path)
        if status >= 300:
            raise ApiError("GET", path, status, data.decode(errors="replace"))
        return data.decode(errors="replace")

    def healthy(self) -> bool:
        try:
            status, data = self.request_raw("GET", "/readyz", timeout=2)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200 and data.strip() == b"ok"

    def watch(self, path: str, timeout: float, **params: str) -> Iterator[Obj]:
        """Watch events (``{"type": ..., "object": ...}``) of a collection until ``timeout``.

        Starts with synthetic ADDED events for what exists, so no change is missed between a
        read and the watch.
        """
        query = urllib.parse.urlencode(
            {"watch": "1", "timeoutSeconds": str(max(1, int(timeout) + 1)), **params}
        )
        conn = self._connection(timeout + 5)
        try:
            conn.request("GET", f"{path}?{query}", headers={"Accept": "application/json"})
            response = conn.getresponse()
            if response.status >= 300:
                raise ApiError("WATCH", path, response.status, response.read().decode())
            while True:
                line = response.readline()
                if not line:
                    return
                yield json.loads(line)
        finally:
            conn.close()

    def wait_for(
        self, path: str, predicate: Callable[[Obj | None], bool], timeout: float, what: str
    ) -> Obj | None:
        """Poll ``path`` until ``predicate(object or None)``; fail saying ``what`` and the
        object's last state."""
        deadline = time.monotonic() + timeout
        last: Obj | None = None
        while True:
            last = self.get_or_none(path)
            if predicate(last):
                return last
            if time.monotonic() > deadline:
                state = json.dumps(last.get("status") if last else None)[:1500]
                raise TimeoutError(f"{what}: not within {timeout:.0f} s; last status {state}")
            time.sleep(0.1)
