"""The API server's answers, read as input like any other: bounded, decoded, checked.

Each answer is read up to a bound (:data:`MAX_ANSWER_BYTES` an object or a watch line,
:data:`LIST_PAGE` objects a list page) and refused beyond it, decoded as JSON and checked for
the shape the driver relies on, so a proxy's HTML page, a truncated line or an object of
gigabytes is one refusal that says so (an :class:`~cdi_gen.apiserver.errors.ApiServerError`
to the caller), never a traceback or an agent grown by the size of the answer.
:func:`bound_answer` is the HTTP client's response hook; the rest reads what it let through.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2

from cdi_gen.apiserver.errors import ApiServerError
from cdi_gen.errors import quote

__all__ = [
    "LIST_PAGE",
    "MAX_ANSWER_BYTES",
    "Obj",
    "bound_answer",
    "decode",
    "failure",
    "slice_shape",
    "watch_event",
]

Obj = dict[str, Any]

#: Largest answer read for one object, and longest watch line (one event). The API server
#: refuses a request body over 3 MiB, so no object it stores is larger; the rest is room for
#: what it adds (status, managed fields).
MAX_ANSWER_BYTES = 4 << 20
#: Slices asked for per list call: a page stays within ``LIST_PAGE`` objects' bound.
LIST_PAGE = 4


class AnswerRefused(httpx2.HTTPError):
    """An answer the client does not read: over its bound, or encoded as we did not ask."""


def _human(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size} bytes"


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


async def bound_answer(response: httpx2.Response) -> None:
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


def decode(data: bytes | str, what: str) -> Obj:
    """An answer's JSON object, or :class:`ApiServerError` quoting the start of it."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested beyond the parser's stack
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        raise ApiServerError(f"{what}: the answer is not JSON: {quote(text)}") from None
    if not isinstance(obj, dict):
        raise ApiServerError(f"{what}: the answer is not a JSON object: {quote(obj)}")
    return obj


def failure(response: httpx2.Response) -> str:
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


def slice_shape(obj: object, what: str) -> Obj:
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


def watch_event(line: str, what: str) -> tuple[str, Obj]:
    """One watch line as (type, slice), or ("BOOKMARK", its object) for a bookmark: a
    ``metadata.resourceVersion`` string to watch on from."""
    event = decode(line, what)
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
    return kind, slice_shape(obj, what)
