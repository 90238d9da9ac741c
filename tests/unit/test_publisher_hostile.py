"""The slice publisher and the API client against a hostile or broken API server.

A real HTTP server on 127.0.0.1 (:mod:`tests.fakes.apiserver`) speaks the API server's wire
format; lightkube talks to it as to the real one. The tests play another writer (deleting,
changing, re-generationing our slices), a proxy answering garbage, and a server answering
more than any object can hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cdi_gen.apiserver.client import (
    ApiClient,
)
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.dra.plugin.publisher import SlicePublisher
from cdi_gen.dra.plugin.slices import slice_name
from cdi_gen.model import PoolDevice
from tests.fakes.apiserver import INT64_MAX, SLICES, Answer, FakeApiServer
from tests.unit.conftest import API_NODE

DRIVER = "drv.example.com"
NODE = API_NODE
LOG = "cdi_gen.dra.plugin.publisher"


def device(name: str, **kw: Any) -> PoolDevice:
    return PoolDevice(
        name=name, cdi_name=f"v.com/c={name}", class_name="c", physical=f"/{name}", **kw
    )


@contextlib.asynccontextmanager
async def publishing(
    client: ApiClient, pool: DevicePool
) -> AsyncIterator[tuple[SlicePublisher, asyncio.Task[None]]]:
    publisher = SlicePublisher(client, DRIVER, NODE, pool, retry_initial=0.01, retry_max=0.05)
    task = asyncio.create_task(publisher.run())
    try:
        yield publisher, task
    finally:
        pool.close()
        task.cancel()
        await asyncio.wait([task])


def pool_of(*names: str) -> DevicePool:
    pool = DevicePool()
    pool.publish("c", [device(n) for n in names])
    return pool


def devices_on(api: FakeApiServer) -> list[str]:
    return sorted(d["name"] for s in api.slices.values() for d in s["spec"].get("devices") or ())


def generations(api: FakeApiServer) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in api.slices.values()}


def writes(api: FakeApiServer) -> int:
    return sum(method in ("POST", "PUT") for method, path, _ in api.requests)


# -- 1: anything wrong on the watch restarts the watch; cancellation always wins ---------

GARBAGE = [
    pytest.param(b"<html>502 Bad Gateway</html>", id="not-json"),
    pytest.param(b"[1, 2, 3]", id="not-an-event"),
    pytest.param(b'{"type": "MODIFIED", "object": {"metadata": 5}}', id="wrong-shape"),
    pytest.param(b'{"type": "ADDED", "object": {"kind": "Pod"}}', id="no-metadata"),
    pytest.param(b"\xff\xfe\x00garbage", id="not-utf8"),
]


@pytest.mark.parametrize("line", GARBAGE)
async def test_a_garbage_watch_line_restarts_the_watch_and_deletions_are_still_repaired(
    api: FakeApiServer, client: ApiClient, line: bytes
) -> None:
    pool = pool_of("a", "b")
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        await api.until(lambda: api.watches_opened == 1)
        api.send_raw(line)
        await api.until(lambda: api.watches_opened >= 2)
        # The kubelet wipes the node's slices at its start: they come back.
        api.remove(slice_name(NODE, DRIVER, 0))
        await api.until(lambda: devices_on(api) == ["a", "b"])


@pytest.mark.parametrize("line", GARBAGE)
async def test_sigterm_after_a_garbage_watch_line_is_a_cancellation(
    api: FakeApiServer, client: ApiClient, line: bytes
) -> None:
    pool = pool_of("a")
    async with publishing(client, pool) as (publisher, task):
        assert await publisher.published(pool.version, 10)
        await api.until(lambda: api.watches_opened == 1)
        api.send_raw(line)
        await api.until(lambda: api.watches_closed >= 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_deletion_while_the_watch_is_down_is_repaired_when_it_opens_again(
    api: FakeApiServer, client: ApiClient
) -> None:
    pool = pool_of("a")
    publisher = SlicePublisher(client, DRIVER, NODE, pool, retry_initial=0.5, retry_max=1)
    task = asyncio.create_task(publisher.run())
    try:
        assert await publisher.published(pool.version, 10)
        await api.until(lambda: api.watches_opened == 1)

        def kubelet_starts() -> None:
            # Right after the publisher's list, while its watch is still down.
            if api.watches_opened == 1 and api.slices:
                api.remove(slice_name(NODE, DRIVER, 0))

        api.after_list = kubelet_starts
        api.send_raw(b"<html>502 Bad Gateway</html>")
        await api.until(lambda: api.watches_opened == 2 and devices_on(api) == ["a"])
    finally:
        pool.close()
        task.cancel()
        await asyncio.wait([task])


async def test_a_watch_failure_is_one_line_per_retry_step_without_traceback(
    api: FakeApiServer, client: ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    pool = pool_of("a")
    caplog.set_level(logging.DEBUG, LOG)
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        for n in range(1, 4):
            await api.until(lambda n=n: api.watches_opened == n)  # type: ignore[misc]
            api.send_raw(b"<html>502 Bad Gateway</html>")
        await api.until(lambda: api.watches_opened == 4)
    failed = [r for r in caplog.records if "watch" in r.getMessage() and r.levelno >= logging.INFO]
    assert failed, "a failing watch is not logged"
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in failed)
    assert len(failed) <= 3
    assert "502 Bad Gateway" in failed[0].getMessage()


# -- 2: our slices changed by another writer converge back ------------------------------


def _foreign_edit(api: FakeApiServer, edit: str) -> None:
    obj = json.loads(json.dumps(api.slices[slice_name(NODE, DRIVER, 0)]))
    spec = obj["spec"]
    if edit == "devices-removed":
        spec["devices"] = spec["devices"][:1]
    elif edit == "device-renamed":
        spec["devices"][0]["name"] = "z"
    elif edit == "attribute-added":
        spec["devices"][0]["attributes"] = {"x": {"string": "y"}}
    elif edit == "attribute-beyond-int64":
        # Compared by digest: a number no 64-bit JSON encoder takes must not stop that.
        spec["devices"][0]["attributes"] = {"x": {"int": 2**70}}
    elif edit == "owner-dropped":
        obj["metadata"].pop("ownerReferences")
    elif edit == "generation-lowered":
        spec["pool"]["generation"] = 0
    elif edit == "generation-negative":
        spec["pool"]["generation"] = -5
    api.write(obj)


@pytest.mark.parametrize(
    "edit",
    [
        "devices-removed",
        "device-renamed",
        "attribute-added",
        "attribute-beyond-int64",
        "owner-dropped",
        "generation-lowered",
        "generation-negative",
    ],
)
async def test_our_slice_changed_by_another_writer_is_restored(
    api: FakeApiServer, client: ApiClient, edit: str
) -> None:
    pool = pool_of("a", "b")
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        ours = json.loads(json.dumps(api.slices[slice_name(NODE, DRIVER, 0)]))
        await api.until(lambda: api.watches_opened == 1)
        _foreign_edit(api, edit)
        restored = api.slices[slice_name(NODE, DRIVER, 0)]

        def back() -> bool:
            now = api.slices.get(slice_name(NODE, DRIVER, 0), {})
            return (
                now is not restored
                and now.get("metadata", {}).get("ownerReferences")
                == ours["metadata"]["ownerReferences"]
                and now["spec"]["devices"] == (ours["spec"]["devices"])
            )

        await api.until(back)
        # One slice rewritten: the pool's generation stays (the highest, so the scheduler
        # takes it), never lowered by the other writer's edit.
        assert generations(api) == {ours["spec"]["pool"]["generation"]}


async def test_our_own_writes_are_not_taken_for_foreign_ones(
    api: FakeApiServer, client: ApiClient
) -> None:
    pool = pool_of("a", "b")
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        await api.until(lambda: api.watches_opened == 1)
        for n in range(3):
            pool.publish("c", [device("a"), device("b"), device(f"x{n}")])
            assert await publisher.published(pool.version, 10)
        # A barrier: every event up to here was read once the watch is started again.
        api.end_watches()
        await api.until(lambda: api.watches_opened == 2)
        pool.publish("c", [device("a")])
        assert await publisher.published(pool.version, 10)
        # One write per pool version, none for the echo of our own writes; each change stays
        # within the one slice, so the generation too.
        assert writes(api) == 5
        assert generations(api) == {1}


async def test_an_unchanged_rewrite_by_another_writer_is_left_alone(
    api: FakeApiServer, client: ApiClient
) -> None:
    pool = pool_of("a")
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        await api.until(lambda: api.watches_opened == 1)
        obj = json.loads(json.dumps(api.slices[slice_name(NODE, DRIVER, 0)]))
        obj["metadata"]["labels"] = {"someone": "else"}
        api.write(obj)
        api.end_watches()
        await api.until(lambda: api.watches_opened == 2)
        pool.publish("c", [device("a"), device("b")])
        assert await publisher.published(pool.version, 10)
        assert writes(api) == 2


# -- 3: generations stay within int64 --------------------------------------------------


@pytest.mark.parametrize("count", [1, 130], ids=["one-slice", "two-slices"])
@pytest.mark.parametrize("generation", [INT64_MAX, INT64_MAX - 1])
async def test_a_generation_at_the_int64_end_starts_a_new_generation_line(
    api: FakeApiServer, client: ApiClient, count: int, generation: int
) -> None:
    names = [f"d{i}" for i in range(count)]
    pool = pool_of(*names)
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        # Another writer puts one slice (of one or two) at the end of the int64 range: the
        # one the new device goes to, so that our write of it meets the change.
        last = slice_name(NODE, DRIVER, len(api.slices) - 1)
        obj = json.loads(json.dumps(api.slices[last]))
        obj["spec"]["pool"]["generation"] = generation
        api.write(obj)
        pool.publish("c", [device(n) for n in [*names, "new"]])
        assert await publisher.published(pool.version, 10), "pool never published"
        assert devices_on(api) == sorted([*names, "new"])
        (now,) = generations(api)
        assert 1 <= now <= INT64_MAX
        assert 1 <= publisher.generation <= INT64_MAX


async def test_a_foreign_int64_generation_on_one_slice_of_a_pool_is_repaired(
    api: FakeApiServer, client: ApiClient
) -> None:
    names = [f"d{i}" for i in range(130)]
    pool = pool_of(*names)
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        await api.until(lambda: api.watches_opened == 1)
        obj = json.loads(json.dumps(api.slices[slice_name(NODE, DRIVER, 0)]))
        obj["spec"]["pool"]["generation"] = INT64_MAX
        api.write(obj)
        # Every slice of the pool at one generation again, the newest line: the scheduler
        # would otherwise see an incomplete pool at the highest generation.
        await api.until(lambda: generations(api) == {1} and devices_on(api) == sorted(names))


# -- 17: an invalid slice list is one line per retry step, never a traceback ------------


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"<html>502 Bad Gateway</html>", id="not-json"),
        pytest.param(b'{"items": 5}', id="items-not-a-list"),
        pytest.param(b'{"items": [{"metadata": {}}]}', id="item-without-name"),
        pytest.param(b'{"items": [{"metadata": {"name": "s"}, "spec": 3}]}', id="spec-not-object"),
        pytest.param(
            b'{"items": [{"metadata": {"name": "s"}, "spec": {"pool": {"generation": "x"}}}]}',
            id="generation-not-int",
        ),
    ],
)
async def test_an_invalid_slice_list_is_one_line_per_retry_step(
    api: FakeApiServer,
    client: ApiClient,
    caplog: pytest.LogCaptureFixture,
    body: bytes,
) -> None:
    api.answers[("GET", SLICES)] = Answer(200, body)
    caplog.set_level(logging.INFO, LOG)
    pool = pool_of("a")

    def lists() -> int:
        return sum(m == "GET" and p == SLICES and "watch" not in q for m, p, q in api.requests)

    async with publishing(client, pool) as (publisher, task):
        await api.until(lambda: lists() >= 3 or task.done())
        assert not task.done(), task.exception()
        del api.answers[("GET", SLICES)]
        assert await publisher.published(pool.version, 10)
    failed = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert failed
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in failed)
    assert "ResourceSlices of drv.example.com on n1: list" in failed[0].getMessage()


async def test_a_repeated_publishing_failure_is_logged_once_per_doubling(
    api: FakeApiServer, client: ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The same refusal on every attempt is logged on attempts 1, 2, 4, 8 (Backoff's rule),
    not once per retry; every attempt is still made, and the recovery is said once."""
    refused = {"kind": "Status", "status": "Failure", "message": "etcd busy", "code": 500}
    api.answers[("POST", SLICES)] = Answer(500, json.dumps(refused).encode(), times=9)
    pool = pool_of("a")
    caplog.set_level(logging.INFO, LOG)
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 20)
    failed = [
        r.getMessage() for r in caplog.records if "publishing ResourceSlices" in r.getMessage()
    ]
    assert sum(method == "POST" for method, _, _ in api.requests) == 10
    assert len(failed) == 4, failed
    assert all("etcd busy" in line for line in failed), failed
    again = [r for r in caplog.records if "published again" in r.getMessage()]
    assert len(again) == 1
