"""The publisher's watch against the fake API server: a watch the API server ends is resumed
from the last resourceVersion seen (a bookmark's), with no list; a version too old to watch
from (410 Gone) is listed again. What the watch logs is the publisher's, by its logger's name.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from cdi_gen.apiserver.client import ApiClient
from cdi_gen.apiserver.errors import ApiServerError
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.dra.plugin.publisher import SlicePublisher
from cdi_gen.dra.plugin.slices import slice_name
from tests.fakes.apiserver import SLICES, FakeApiServer
from tests.unit.test_publisher_hostile import (
    DRIVER,
    LOG,
    NODE,
    device,
    devices_on,
    pool_of,
    publishing,
)


def lists(api: FakeApiServer) -> int:
    return sum(
        method == "GET" and path == SLICES and "watch" not in query
        for method, path, query in api.requests
    )


async def settled(api: FakeApiServer, publisher: SlicePublisher, pool: DevicePool) -> int:
    """The lists so far once the first watch's list is done (it is asked for when the
    watch opens): a watch ended and a pool version published after it are the barrier."""
    await api.until(lambda: api.watches_opened == 1)
    api.end_watches()
    await api.until(lambda: api.watches_opened == 2)
    pool.publish("c", [device("a"), device("b"), device("c")])
    assert await publisher.published(pool.version, 10)
    return lists(api)


def watches(api: FakeApiServer) -> list[dict[str, Any]]:
    return [query for method, path, query in api.requests if path == SLICES and "watch" in query]


async def test_a_watch_the_server_ends_goes_on_from_its_bookmark_without_a_list(
    api: FakeApiServer, client: ApiClient
) -> None:
    pool = pool_of("a", "b")
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        listed = await settled(api, publisher, pool)
        assert watches(api)[0]["allowWatchBookmarks"] == ["true"]
        for opened in (3, 4):
            api.end_watches()
            await api.until(lambda opened=opened: api.watches_opened == opened)
            # From the bookmark sent as the watch ended: the newest version.
            assert watches(api)[-1]["resourceVersion"] == [str(api.version)]
        assert lists(api) == listed


async def test_a_change_between_two_watches_is_replayed_to_the_resumed_one(
    api: FakeApiServer, client: ApiClient
) -> None:
    pool = pool_of("a", "b")
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        await api.until(lambda: api.watches_opened == 1)
        api.end_watches()
        # After the end of the watch, before the next one: only a replay tells.
        api.remove(slice_name(NODE, DRIVER, 0))
        await api.until(lambda: api.watches_opened == 2 and devices_on(api) == ["a", "b"])
        assert "resourceVersion" in watches(api)[1]


async def test_a_version_too_old_to_watch_from_is_listed_again(
    api: FakeApiServer, client: ApiClient
) -> None:
    pool = pool_of("a", "b")
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        listed = await settled(api, publisher, pool)
        api.expire_versions()
        api.end_watches()
        # The resumed watch gets 410 Gone: a list, and a watch from now.
        await api.until(lambda: api.watches_opened == 4 and lists(api) > listed)
        assert "resourceVersion" in watches(api)[2]
        assert "resourceVersion" not in watches(api)[3]
        assert devices_on(api) == ["a", "b", "c"]


async def test_the_watchs_lines_are_logged_under_the_publishers_name(
    api: FakeApiServer, client: ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The watch is a part of the publisher (its own module): operators, the JSON logs'
    ``logger`` field and a level set for the publisher still find its lines there."""
    caplog.set_level(logging.INFO, LOG)
    pool = pool_of("a", "b")
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        await settled(api, publisher, pool)
        api.remove(slice_name(NODE, DRIVER, 0))
        await api.until(lambda: devices_on(api) == ["a", "b", "c"])
        api.expire_versions()
        api.end_watches()
        await api.until(lambda: api.watches_opened == 4)
    lines = {r.getMessage(): r.name for r in caplog.records}
    deleted = [m for m in lines if "was deleted; publishing the pool again" in m]
    too_old = [m for m in lines if "version too old, listing again" in m]
    assert deleted, lines
    assert too_old, lines
    assert {lines[m] for m in deleted + too_old} == {LOG}


async def test_a_bookmark_without_a_resource_version_is_a_bad_line(
    api: FakeApiServer, client: ApiClient
) -> None:
    events = client.watch_slices(DRIVER, NODE)
    first = asyncio.ensure_future(anext(events))
    await api.until(lambda: api.watches_opened == 1)
    api.send_raw(b'{"type": "BOOKMARK", "object": {"metadata": {}}}')
    with pytest.raises(ApiServerError, match="a bookmark without a resourceVersion"):
        await first
    await events.aclose()
