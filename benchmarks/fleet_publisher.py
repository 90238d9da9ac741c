"""Many nodes' DRA pools published by cdi-gen's own code in one process, for benchmarks/fleet.py.

Per node, what the agent runs for its DRA classes, fed recorded devices instead of udev: a
:class:`~cdi_gen.discovery.inventory.Discovery` of the catalogue's ``gpu`` class, eight GPUs
(the card and render node of an amdgpu card in ``tests/data/udev/hardware.json``, cloned at
eight PCI addresses), their pool entries (:func:`~cdi_gen.dra.driver.poolentries.pool_devices`) in a
:class:`~cdi_gen.dra.plugin.pool.DevicePool`, and a
:class:`~cdi_gen.dra.plugin.publisher.SlicePublisher` with its own
:class:`~cdi_gen.apiserver.client.ApiClient` (its own connections, as each node's agent has).
Every request the clients send is counted by verb, with the bytes of its body.

    python benchmarks/fleet_publisher.py KUBECONFIG DRIVER NODE...

It publishes every pool, prints ``{"ready": seconds}`` once all are in the API, then reads
commands on stdin, answering each with one JSON line:

- ``hotplug CYCLE SECONDS``: for SECONDS, each node adds a ninth GPU and removes it again once
  per CYCLE seconds (the nodes spread evenly over the cycle); answers with the events, the
  requests and bytes sent meanwhile, and each event's hotplug → published latency;
- ``unhealthy``: each node's first GPU turns unhealthy (tainted, so its pool spans two
  slices); answers once all pools are in the API;
- ``quit`` (or end of input): the pools close and the process ends.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from cdi_gen.apiserver.client import ApiClient  # noqa: E402
from cdi_gen.config.loader import parse_config  # noqa: E402
from cdi_gen.config.models import AgentConfig, ClassConfig  # noqa: E402
from cdi_gen.discovery.inventory import Discovery  # noqa: E402
from cdi_gen.dra.driver.poolentries import PoolCache, pool_devices  # noqa: E402
from cdi_gen.dra.plugin.pool import DevicePool  # noqa: E402
from cdi_gen.dra.plugin.publisher import SlicePublisher  # noqa: E402
from cdi_gen.dra.plugin.slices import Slice, build_slices  # noqa: E402
from cdi_gen.model import DeviceRecord  # noqa: E402
from cdi_gen.sources.records import record_from_json  # noqa: E402

RECORDS = REPO / "tests/data/udev/hardware.json"
#: The recorded card whose records are cloned.
PCI = "0000:03:00.0"
GPUS = 8
CLASS = "gpu"
#: Longest a pool version may take to reach the API before the run fails (seconds).
PUBLISH_TIMEOUT = 120.0


def config(driver: str) -> AgentConfig:
    """The catalogue's ``gpu`` class (card and render node of one PCI device as one device)
    served through DRA, with ``driver`` as vendor (the agent's default driver name)."""
    return parse_config(
        {
            "vendor": driver,
            "classes": [
                {
                    "name": CLASS,
                    "match": [
                        {"subsystem": "drm", "kernel": "card[0-9]*",
                         "properties": {"DEVTYPE": "drm_minor"}},
                        {"subsystem": "drm", "kernel": "renderD[0-9]*",
                         "properties": {"DEVTYPE": "drm_minor"}},
                    ],
                    "group": {"by": "parent"},
                    "deviceName": "{group}",
                    "api": "dra",
                }
            ],
        },
        "fleet",
    )  # fmt: skip


def gpu_records(index: int, action: str | None = None) -> list[DeviceRecord]:
    """The recorded card's records (card, render node, connector) as the ``index``-th card:
    its own PCI address, minors and names."""
    pci = f"0000:{0x10 + index:02x}:00.0"
    out = []
    for item in json.loads(RECORDS.read_text()):
        if PCI not in item["sys_path"]:
            continue
        text = json.dumps(item)
        text = text.replace(PCI, pci).replace("renderD128", f"renderD{128 + index}")
        text = text.replace("card1", f"card{1 + index}")
        data = json.loads(text)
        if data.get("minor") is not None:
            data["minor"] += index
            data["properties"]["MINOR"] = str(data["minor"])
            data["sys_number"] = str(data["minor"] if data["minor"] >= 128 else 1 + index)
        if action is not None:
            data["action"] = action
        out.append(record_from_json(data))
    return out


@dataclass
class NodePool:
    """One node's discovery, pool and publisher."""

    node: str
    discovery: Discovery
    cls: ClassConfig
    pool: DevicePool
    cache: PoolCache
    publisher: SlicePublisher
    client: ApiClient

    #: The first GPU reported unhealthy (as a failed health check advertises it): its taint
    #: puts it in a slice of its own, so the pool spans two slices.
    unhealthy: bool = False

    def feed(self, records: list[DeviceRecord], *, full: bool = False) -> int:
        """Records into discovery, the class's devices into the pool; the pool version."""
        changes = self.discovery.replace(records) if full else self.discovery.apply(records)
        if changes:
            self.publish()
        return self.pool.version

    def publish(self) -> int:
        advertised = list(self.discovery.advertised(CLASS))
        if self.unhealthy and advertised:
            advertised[0] = replace(advertised[0], healthy=False)
        by_name = {d.name: d for d in self.discovery.devices(CLASS)}
        devices = pool_devices(
            self.discovery.config.vendor,
            self.cls,
            advertised,
            by_name,
            self.cache,
            classes=self.discovery.config.class_names,
        )
        self.pool.publish(CLASS, devices)
        return self.pool.version


def pool_slices(driver: str, node: str, gpus: int) -> list[Slice]:
    """The slices of a node of ``gpus`` GPUs, as the publisher builds them (generation 1)."""
    pool = NodePool(node, Discovery(config(driver)), config(driver).get_class(CLASS),
                    DevicePool(), {}, None, None)  # type: ignore[arg-type]  # fmt: skip
    pool.feed([r for g in range(gpus) for r in gpu_records(g)], full=True)
    return build_slices(driver, node, tuple(pool.pool.devices.values()), 1, node_uid=None)


class Requests:
    """Every request of the clients, by verb, and the bytes of their bodies."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.body_bytes = 0

    async def hook(self, request: Any) -> None:
        verb = request.method
        if request.method == "GET":
            verb = "WATCH" if request.url.params.get("watch") else "GET"
        self.count[verb] += 1
        self.body_bytes += len(request.content or b"")

    def snapshot(self) -> tuple[Counter[str], int]:
        return Counter(self.count), self.body_bytes


def _answer(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _published(pools: list[NodePool], versions: list[int]) -> None:
    for pool, version in zip(pools, versions, strict=True):
        if not await pool.publisher.published(version, PUBLISH_TIMEOUT):
            raise RuntimeError(f"pool of {pool.node}: version {version} never published")


async def _hotplug(pools: list[NodePool], cycle: float, seconds: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    waits: list[asyncio.Task[None]] = []

    async def measure(pool: NodePool, version: int, since: float) -> None:
        if await pool.publisher.published(version, PUBLISH_TIMEOUT):
            latencies.append(loop.time() - since)

    async def churn(i: int, pool: NodePool, end: float) -> int:
        events = 0
        await asyncio.sleep(cycle * i / len(pools))
        while loop.time() < end:
            for action in ("add", "remove"):
                since = loop.time()
                version = pool.feed(gpu_records(GPUS, action))
                events += 1
                waits.append(asyncio.create_task(measure(pool, version, since)))
                await asyncio.sleep(cycle / 2)
        return events

    usage = resource.getrusage(resource.RUSAGE_SELF)
    started = loop.time()
    end = started + seconds
    events = await asyncio.gather(*(churn(i, p, end) for i, p in enumerate(pools)))
    await asyncio.gather(*waits)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    return {
        "events": sum(events),
        "seconds": loop.time() - started,
        "latencies": latencies,
        "cpu_seconds": cpu,
        "publications": sum(p.publisher.publications for p in pools),
    }


async def main(kubeconfig: Path, driver: str, nodes: list[str]) -> None:
    agent_config = config(driver)
    cls = agent_config.get_class(CLASS)
    requests = Requests()
    pools = []
    for node in nodes:
        client = await ApiClient.open(kubeconfig)
        # Counted where the agent's requests leave it: the client's own HTTP transport.
        hooks = client._http.event_hooks
        hooks["request"] = [*hooks.get("request", []), requests.hook]
        client._http.event_hooks = hooks
        pool = DevicePool()
        publisher = SlicePublisher(client, driver, node, pool)
        pools.append(NodePool(node, Discovery(agent_config), cls, pool, {}, publisher, client))
    started = time.monotonic()
    versions = [p.feed([r for g in range(GPUS) for r in gpu_records(g)], full=True) for p in pools]
    tasks = [asyncio.create_task(p.publisher.run(), name=f"publish {p.node}") for p in pools]
    await _published(pools, versions)
    _answer({"ready": time.monotonic() - started, "requests": dict(requests.count)})
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    try:
        while line := (await reader.readline()).decode().split():
            if line[0] == "hotplug":
                count, sent = requests.snapshot()
                result = await _hotplug(pools, float(line[1]), float(line[2]))
                now, sent_after = requests.snapshot()
                result["requests"] = dict(now - count)
                result["body_bytes"] = sent_after - sent
                _answer(result)
            elif line[0] == "unhealthy":
                for p in pools:
                    p.unhealthy = True
                await _published(pools, [p.publish() for p in pools])
                _answer({"unhealthy": len(pools)})
            elif line[0] == "quit":
                break
    finally:
        for p in pools:
            p.pool.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in pools:
            await p.client.close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:]))
