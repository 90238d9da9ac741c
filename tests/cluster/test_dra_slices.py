"""The API-server half of DRA against the real API server: ResourceSlices published from the
device pool (creation, generations, adoption, republication after deletion, chunking),
and ResourceClaims read for NodePrepareResources.

The publisher runs on the test's loop with lightkube and the cluster's admin kubeconfig; what
it wrote is checked through the tests' own HTTP client, so the two never share a bug.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from cdi_gen.apiserver.client import ApiClient
from cdi_gen.dra.plugin.claimreader import ApiClaimReader
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.dra.plugin.publisher import SlicePublisher
from cdi_gen.errors import ClaimError
from cdi_gen.model import ClaimView, PoolDevice
from tests.waiting import until

from .api import Api
from .cluster import NODE_NAME, Cluster

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
_DRIVERS = itertools.count()


def device(name: str, **kw: Any) -> PoolDevice:
    return PoolDevice(
        name=name,
        cdi_name=f"example.com/fpga={name}",
        class_name="fpga",
        physical=f"/sys/devices/{name}",
        attributes={"class": "fpga", "index": 1},
        **kw,
    )


def slices_of(api: Api, driver: str) -> list[dict[str, Any]]:
    selector = f"spec.nodeName={NODE_NAME},spec.driver={driver}"
    items: list[dict[str, Any]] = api.get(f"{SLICES}?fieldSelector={selector}")["items"]
    return sorted(items, key=lambda s: s["metadata"]["name"])


def device_names(slices: list[dict[str, Any]]) -> list[str]:
    return [d["name"] for s in slices for d in s["spec"].get("devices") or ()]


async def wait_until(what: str, check: Callable[[], bool], within: float = 20) -> None:
    await until(lambda: asyncio.to_thread(check), what, within, every=0.05)


@pytest.fixture
def driver(cluster: Cluster) -> Iterator[str]:
    """A driver name of this test alone; its slices are removed at the end."""
    name = f"t{next(_DRIVERS)}-{uuid.uuid4().hex[:6]}.cdi-gen.test"
    yield name
    assert cluster.api is not None
    for s in slices_of(cluster.api, name):
        cluster.api.delete(f"{SLICES}/{s['metadata']['name']}")


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[ApiClient]:
    c = ApiClient(cluster.admin_kubeconfig)
    try:
        yield c
    finally:
        await c.close()


class Running:
    def __init__(self, publisher: SlicePublisher, pool: DevicePool) -> None:
        self.publisher = publisher
        self.pool = pool

    async def publish(self, devices: list[PoolDevice]) -> None:
        self.pool.publish("fpga", devices)
        assert await self.publisher.published(self.pool.version, 30), "pool not published"


@pytest.fixture
async def publisher(client: ApiClient, driver: str) -> AsyncIterator[Running]:
    pool = DevicePool()
    pub = SlicePublisher(client, driver, NODE_NAME, pool, retry_initial=0.1, retry_max=1)
    task = asyncio.create_task(pub.run())
    try:
        yield Running(pub, pool)
    finally:
        pool.close()
        await asyncio.wait_for(task, 10)


async def test_slices_created_owned_by_the_node_and_regenerated(
    cluster: Cluster, driver: str, publisher: Running
) -> None:
    assert cluster.api is not None
    await publisher.publish([device("fpga-a"), device("fpga-b"), device("fpga-c")])
    slices = slices_of(cluster.api, driver)
    assert len(slices) == 1
    spec = slices[0]["spec"]
    assert device_names(slices) == ["fpga-a", "fpga-b", "fpga-c"]
    assert spec["nodeName"] == NODE_NAME and spec["pool"]["name"] == NODE_NAME
    assert spec["pool"]["resourceSliceCount"] == 1
    first = spec["pool"]["generation"]
    assert spec["devices"][0]["attributes"] == {"class": {"string": "fpga"}, "index": {"int": 1}}
    node = cluster.node()
    assert node is not None
    (owner,) = slices[0]["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Node",
        NODE_NAME,
        node["metadata"]["uid"],
    )

    await publisher.publish([device("fpga-a"), device("fpga-c")])
    slices = slices_of(cluster.api, driver)
    assert device_names(slices) == ["fpga-a", "fpga-c"]
    # A change within the pool's one slice: one write, the generation stays.
    assert slices[0]["spec"]["pool"]["generation"] == first

    # The same devices again: nothing to write, the generation stays.
    writes = publisher.publisher.publications
    await publisher.publish([device("fpga-a"), device("fpga-c")])
    assert publisher.publisher.publications == writes


async def test_deleted_slices_are_published_again(
    cluster: Cluster, driver: str, publisher: Running
) -> None:
    assert cluster.api is not None
    await publisher.publish([device("fpga-a")])
    (before,) = slices_of(cluster.api, driver)
    cluster.api.delete(f"{SLICES}/{before['metadata']['name']}")

    def back() -> bool:
        now = slices_of(cluster.api, driver)  # type: ignore[arg-type]
        return bool(now) and now[0]["metadata"]["uid"] != before["metadata"]["uid"]

    await wait_until("the deleted slice published again", back)
    (after,) = slices_of(cluster.api, driver)
    assert device_names([after]) == ["fpga-a"]
    assert after["spec"]["pool"]["generation"] > before["spec"]["pool"]["generation"]


async def test_more_than_128_devices_take_several_slices(
    cluster: Cluster, driver: str, publisher: Running
) -> None:
    assert cluster.api is not None
    names = [f"fpga-{i:03d}" for i in range(300)]
    await publisher.publish([device(n) for n in names])
    slices = slices_of(cluster.api, driver)
    assert len(slices) == 3
    assert sorted(device_names(slices)) == names
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert len({s["spec"]["pool"]["generation"] for s in slices}) == 1
    # Shrinking deletes the slices no longer needed.
    await publisher.publish([device(n) for n in names[:10]])
    slices = slices_of(cluster.api, driver)
    assert len(slices) == 1 and device_names(slices) == names[:10]
    assert slices[0]["spec"]["pool"]["resourceSliceCount"] == 1


async def test_leftover_slices_adopted_and_foreign_ones_deleted(
    cluster: Cluster, driver: str, client: ApiClient
) -> None:
    assert cluster.api is not None
    from cdi_gen.dra.plugin.slices import build_slices

    stale = build_slices(driver, NODE_NAME, [device("old")], 7, node_uid=None)[0]
    cluster.api.create(SLICES, stale)
    stray = dict(stale, metadata={"name": f"stray-{uuid.uuid4().hex[:8]}"})
    cluster.api.create(SLICES, stray)
    pool = DevicePool()
    pub = SlicePublisher(client, driver, NODE_NAME, pool)
    task = asyncio.create_task(pub.run())
    try:
        pool.publish("fpga", [device("new")])
        assert await pub.published(pool.version, 30)
        slices = slices_of(cluster.api, driver)
        assert [s["metadata"]["name"] for s in slices] == [stale["metadata"]["name"]]
        assert device_names(slices) == ["new"]
        assert slices[0]["spec"]["pool"]["generation"] == 8
    finally:
        pool.close()
        await asyncio.wait_for(task, 10)


async def test_taints_and_counters_survive_the_api_server(
    cluster: Cluster, driver: str, publisher: Running
) -> None:
    """Needs the DRA alpha gates on the API server; fails naming the gate that is off."""
    assert cluster.api is not None
    shared = [
        PoolDevice(
            name=f"kvm-{i}",
            cdi_name=f"example.com/kvm=kvm-{i}",
            class_name="kvm",
            physical="/sys/devices/virtual/misc/kvm",
            slots=2,
        )
        for i in range(2)
    ]
    await publisher.publish(
        [device("sick", healthy=False), device("gone", gone=True, taint_when_gone=True), *shared]
    )
    slices = slices_of(cluster.api, driver)
    got = {d["name"]: d for s in slices for d in s["spec"].get("devices") or ()}
    missing = [
        gate
        for gate, ok in (
            ("DRADeviceTaints", bool(got["sick"].get("taints"))),
            ("DRAPartitionableDevices", bool(got["kvm-0"].get("consumesCounters"))),
        )
        if not ok
    ]
    assert not missing, (
        f"feature gates off on the API server: {', '.join(missing)} "
        f"(the publisher saw {sorted(publisher.publisher.dropped)} dropped)"
    )
    assert got["gone"]["taints"][0]["effect"] == "NoExecute"
    counters = [c for s in slices for c in s["spec"].get("sharedCounters") or ()]
    assert [c["counters"] for c in counters] == [{"slots": {"value": "2"}}]


async def test_claim_read_with_uid_and_missing_claim_named(
    cluster: Cluster, client: ApiClient
) -> None:
    assert cluster.api is not None
    name = f"claim-{uuid.uuid4().hex[:8]}"
    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    created = cluster.api.create(
        path,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [{"name": "one", "exactly": {"deviceClassName": "fpga.x.test"}}]
                }
            },
        },
    )
    try:
        claim = await client.get_claim("default", name)
        assert (claim.namespace, claim.name) == ("default", name)
        assert claim.uid == created["metadata"]["uid"]
        assert claim.results is None  # not allocated
        with pytest.raises(ClaimError, match=rf"ResourceClaim default/{name}-x: not found"):
            await client.get_claim("default", f"{name}-x")

        # From a gRPC-like thread, through the agent's loop.
        reader = ApiClaimReader(client, asyncio.get_running_loop(), timeout=10)
        seen, missing = await asyncio.to_thread(
            reader.read_claims, [("default", name), ("default", f"{name}-x")], 10
        )
        assert isinstance(seen, ClaimView) and seen.uid == created["metadata"]["uid"]
        assert isinstance(missing, ClaimError) and "not found" in str(missing)
    finally:
        cluster.api.delete(f"{path}/{name}")
