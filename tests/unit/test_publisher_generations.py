"""When the publisher bumps the pool generation, against the fake API server.

A change that stays within one existing slice is one write of that slice at the same
generation; a change that could be seen half done (a device moving between slices, a slice
removed or added) takes a new generation on every slice.
"""

from __future__ import annotations

from cdi_gen.apiserver.client import ApiClient
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.dra.plugin.slices import slice_name
from tests.fakes.apiserver import FakeApiServer
from tests.unit.test_publisher_hostile import (
    DRIVER,
    NODE,
    device,
    devices_on,
    generations,
    pool_of,
    publishing,
)

#: Two slices: 128 plain devices in the first, two in the second.
NAMES = [f"d{i:03}" for i in range(130)]


def puts(api: FakeApiServer, since: int) -> list[str]:
    return [path for method, path, _ in api.requests[since:] if method == "PUT"]


def writes(api: FakeApiServer, since: int) -> list[tuple[str, str]]:
    return [
        (method, path)
        for method, path, _ in api.requests[since:]
        if method in ("POST", "PUT", "DELETE")
    ]


async def test_an_attribute_change_is_one_put_of_its_slice_at_the_same_generation(
    api: FakeApiServer, client: ApiClient
) -> None:
    pool = pool_of(*NAMES)
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        (before,) = generations(api)
        since = len(api.requests)
        # The last device gets an attribute: a change within the second slice.
        model = {"d129": {"model": "x"}}
        pool.publish("c", [device(n, attributes=model.get(n, {})) for n in NAMES])
        assert await publisher.published(pool.version, 10)
        assert writes(api, since) == [("PUT", puts(api, since)[0])]
        assert puts(api, since)[0].endswith("/" + slice_name(NODE, DRIVER, 1))
        assert generations(api) == {before}
        second = api.slices[slice_name(NODE, DRIVER, 1)]["spec"]["devices"]
        assert [d["attributes"] for d in second if d["name"] == "d129"] == [
            {"model": {"string": "x"}}
        ]


async def test_a_device_moving_between_slices_bumps_the_generation_of_every_slice(
    api: FakeApiServer, client: ApiClient
) -> None:
    pool = pool_of(*NAMES)
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        (before,) = generations(api)
        since = len(api.requests)
        # d000 leaves the first slice: d128 moves up into it from the second.
        pool.publish("c", [device(n) for n in NAMES[1:]])
        assert await publisher.published(pool.version, 10)
        assert len(puts(api, since)) == 2
        assert generations(api) == {before + 1}
        assert devices_on(api) == NAMES[1:]


async def test_a_slice_removed_bumps_the_generation_of_the_slices_left(
    api: FakeApiServer, client: ApiClient
) -> None:
    pool = pool_of(*NAMES)
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        (before,) = generations(api)
        since = len(api.requests)
        pool.publish("c", [device(n) for n in NAMES[:128]])
        assert await publisher.published(pool.version, 10)
        assert [m for m, _ in writes(api, since)] == ["PUT", "DELETE"]
        assert set(api.slices) == {slice_name(NODE, DRIVER, 0)}
        assert generations(api) == {before + 1}
        assert api.slices[slice_name(NODE, DRIVER, 0)]["spec"]["pool"]["resourceSliceCount"] == 1


async def test_a_hotplug_beside_an_unhealthy_device_is_one_put_at_the_same_generation(
    api: FakeApiServer, client: ApiClient
) -> None:
    """The fleet's shape: an unhealthy device's taint puts it in a slice of its own, and
    devices come and go in the first slice; its health changing again stays in its slice."""
    plain = ["a", "b"]
    pool = DevicePool()
    pool.publish("c", [*map(device, plain), device("u", healthy=False)])
    async with publishing(client, pool) as (publisher, _):
        assert await publisher.published(pool.version, 10)
        (before,) = generations(api)
        for now, sick in [(["a", "b", "c"], {}), (["a", "c"], {}), (["a", "c"], {"gone": True})]:
            since = len(api.requests)
            unhealthy = device("u", healthy=False, taint_when_gone=True, **sick)
            pool.publish("c", [*map(device, now), unhealthy])
            assert await publisher.published(pool.version, 10)
            assert [m for m, _ in writes(api, since)] == ["PUT"]
            assert generations(api) == {before}
            assert devices_on(api) == sorted([*now, "u"])
        # The device recovers: it moves into the first slice, so a new generation.
        pool.publish("c", [device(n) for n in ["a", "c", "u"]])
        assert await publisher.published(pool.version, 10)
        assert generations(api) == {before + 1}
        assert set(api.slices) == {slice_name(NODE, DRIVER, 0)}


async def test_a_wait_for_a_version_cancelled_as_it_is_published_ends_cancelled() -> None:
    # A class runner waits here for its withdrawal; the agent's stop cancels it, often just
    # as the publisher's last write marks the version published. The cancellation must not
    # be lost: a runner that took it for a return waited for its next change forever and
    # the agent never stopped (asyncio.wait_for on Python 3.11 swallowed it).
    import asyncio

    from cdi_gen.dra.plugin.publisher import SlicePublisher

    publisher = SlicePublisher(None, "example.com", "node-1", DevicePool())  # type: ignore[arg-type]
    waiter = asyncio.create_task(publisher.published(1, 30.0))
    await asyncio.sleep(0)
    waiter.cancel()
    publisher._mark_published(1)
    done, _ = await asyncio.wait({waiter}, timeout=1.0)
    assert done == {waiter} and waiter.cancelled()
