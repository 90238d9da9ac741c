"""What a prepared claim got, written into its ResourceClaim's ``status.devices`` (KEP-4817).

After a prepare, each of our devices of the claim gets an entry (driver, pool, device and
shareID; a ``Ready=True`` condition; ``data`` naming the CDI device IDs, the host device nodes
and the device's udev identity; ``networkData`` for a network interface: its name in the pod
and its hardware address), so ``kubectl get resourceclaim -o yaml`` shows what a pod got
without a login on the node; at unprepare our entries are cleared. Written by server-side
apply of the status subresource under a field manager named after the driver: each driver
owns its entries, and applying none releases ours.

The status is informational: it never blocks nor fails NodePrepareResources or
NodeUnprepareResources. The gRPC threads only hand the write to the agent's loop through
:class:`~cdi_gen.kubelet.boundary.LoopBridge` and answer the kubelet; on the loop each write is
a :class:`~cdi_gen.retry.Retry` of at most :data:`ATTEMPTS` attempts, given up when the claim
is gone, and superseded by a newer write of the same claim (an unprepare during a prepare's
retries). A prepared claim's entries are written anew, on the loop, when a device of it
leaves the node or comes back (:mod:`~cdi_gen.dra.plugin.notices` adds its ``Present``
condition); ``Ready`` keeps the time it was first written. An API server that drops
``status.devices`` (the ``DRAResourceClaimDeviceStatus`` gate off: beta and on by default
since 1.33, GA in 1.37) is noticed at the first answer that is the claim written (kind,
namespace, name and UID; any other answer fails that write, which is retried), said once in
the log, and no more status is written.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import orjson

from cdi_gen.dra.plugin.claims import PreparedDevice, claim_label
from cdi_gen.kubelet.boundary import LoopBridge, LoopGoneError
from cdi_gen.logs import fields
from cdi_gen.model import PoolDevice
from cdi_gen.retry import Retry, bounded, describe

__all__ = [
    "ATTEMPTS",
    "MAX_DATA",
    "ClaimStatus",
    "StatusClient",
    "device_entries",
    "status_entry",
]

log = logging.getLogger(__name__)

#: Attempts of one write before it is given up (the status is informational).
ATTEMPTS = 6
#: The API's bound on an entry's ``data``.
MAX_DATA = 10 * 1024


class StatusClient(Protocol):
    """The API call the writer makes (``ApiClient.apply_claim_status``)."""

    async def apply_claim_status(
        self, namespace: str, name: str, uid: str, devices: list[dict[str, Any]], manager: str
    ) -> bool | None: ...


def status_entry(
    driver: str,
    device: PreparedDevice,
    found: PoolDevice | None,
    nodes: Sequence[str],
    network: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``status.devices`` entry of one prepared device: ``found`` its pool entry (None:
    gone since), ``nodes`` the host device nodes its class's spec gives it, ``network`` its
    interface's ``networkData`` (KEP-4817), if it moves one."""
    data: dict[str, Any] = {"cdiDeviceIDs": list(device.cdi_device_ids)}
    if nodes:
        data["deviceNodes"] = list(nodes)
    if found is not None:
        udev: dict[str, Any] = {"sysfsPath": found.physical}
        serial = found.attributes.get("serial")
        if isinstance(serial, str):
            udev["serial"] = serial
        data["udev"] = udev
    if len(orjson.dumps(data)) > MAX_DATA:  # thousands of nodes: the names are what matter
        data = {"cdiDeviceIDs": list(device.cdi_device_ids)}
    entry: dict[str, Any] = {"driver": driver, "pool": device.pool, "device": device.device}
    if device.share_id is not None:  # an empty one is no share: refused at prepare
        entry["shareID"] = device.share_id
    entry["conditions"] = [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Prepared",
            "message": f"prepared by {driver} on its node",
            "lastTransitionTime": "",  # set when written
        }
    ]
    entry["data"] = data
    if network:
        entry["networkData"] = dict(network)
    return entry


class ClaimStatus:
    """The status writes of DRA driver ``driver`` through ``client``, run on ``loop``."""

    def __init__(
        self,
        client: StatusClient,
        driver: str,
        loop: asyncio.AbstractEventLoop,
        *,
        retry_max: float,
        now: Callable[[], datetime.datetime] | None = None,
    ) -> None:
        self.client = client
        self.driver = driver
        self.bridge = LoopBridge(loop)
        self.retry_max = retry_max
        self._now = now
        #: The last write asked for, per claim UID (loop only): an older one stops.
        self._latest: dict[str, int] = {}
        self._asked = 0
        #: False once the API server was seen dropping status.devices.
        self.enabled = True
        #: Writes still running (tests wait for them).
        self.running: set[asyncio.Task[None]] = set()
        #: When each claim's entries were first written (its ``Ready`` condition's time),
        #: by UID, until it is unprepared (loop only): a rewrite keeps it.
        self.since: dict[str, str] = {}

    async def close(self) -> None:
        """Cancel the writes still running (the agent stops; on the loop)."""
        running = list(self.running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    def prepared(self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]]) -> None:
        """Write ``entries`` as the claim's status (from any thread; never raises)."""
        self._start(namespace, name, uid, entries)

    def unprepared(self, namespace: str, name: str, uid: str) -> None:
        """Clear our entries of the claim (from any thread; never raises)."""
        self._start(namespace, name, uid, [])

    def rewrite(self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]]) -> None:
        """Write ``entries`` anew as a prepared claim's status (a device's condition changed;
        on the loop; never raises): it supersedes a write of the claim still retrying. A
        condition whose ``lastTransitionTime`` is empty gets the time of the write."""
        if not self.enabled:
            return
        try:
            task = asyncio.get_running_loop().create_task(
                self._write(namespace, name, uid, entries)
            )
            self.running.add(task)  # before it starts: a close now cancels it too
        except Exception:
            log.exception("the status of %s not written", claim_label(namespace, name, uid))

    def _start(self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        try:
            self.bridge.start(self._write(namespace, name, uid, entries))
        except LoopGoneError:
            pass  # stopping: the API server drops the entries of deallocated devices
        except Exception:  # the status must never fail the kubelet's call
            log.exception("the status of %s not written", claim_label(namespace, name, uid))

    async def _write(
        self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]]
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.running.add(task)
        self._asked += 1
        mine = self._latest[uid] = self._asked
        try:
            await self._attempts(namespace, name, uid, entries, mine)
        finally:
            if self._latest.get(uid) == mine:
                del self._latest[uid]
            if task is not None:
                self.running.discard(task)

    async def _attempts(
        self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]], mine: int
    ) -> None:
        label = claim_label(namespace, name, uid)
        retry = Retry(
            bounded(self.retry_max),
            logger=log,
            level=logging.WARNING,
            extra=fields(driver=self.driver),
        )
        stamp = _timestamp(self._now)
        for entry in entries:
            for condition in entry["conditions"]:
                if not condition.get("lastTransitionTime"):
                    condition["lastTransitionTime"] = stamp
        if entries:
            self.since.setdefault(uid, stamp)
        else:
            self.since.pop(uid, None)
        for _ in range(ATTEMPTS):
            if self._latest.get(uid) != mine or not self.enabled:
                return
            try:
                kept = await self.client.apply_claim_status(
                    namespace, name, uid, entries, self.driver
                )
            except Exception as exc:
                retry.failed(
                    describe(exc),
                    "%(claim)s: its status not written (attempt %(attempt)d, next in "
                    "%(delay)gs): %(why)s",
                    claim=label,
                )
                await asyncio.sleep(retry.delay)
                continue
            if kept is None:  # the claim is gone (or is another one now): nothing to say
                return
            if entries and not kept:
                self.enabled = False
                log.warning(
                    "the API server keeps no ResourceClaim status.devices (feature gate "
                    "DRAResourceClaimDeviceStatus off?); claims' device status not written",
                    extra=fields(driver=self.driver),
                )
            return
        log.warning(
            "%s: its status not written after %d attempts; given up",
            label,
            ATTEMPTS,
            extra=fields(driver=self.driver),
        )


def _timestamp(now: Callable[[], datetime.datetime] | None) -> str:
    when = now() if now is not None else datetime.datetime.now(datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def device_entries(
    driver: str,
    devices: Sequence[PreparedDevice],
    pool: Mapping[str, PoolDevice],
    nodes: Mapping[str, Sequence[str]],
    networks: Mapping[str, Mapping[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """The entries of a prepared claim's ``devices`` (``nodes``: host nodes by pool device;
    ``networks``: the network data of those that move an interface)."""
    nets = networks or {}
    return [
        status_entry(driver, d, pool.get(d.device), nodes.get(d.device, ()), nets.get(d.device))
        for d in devices
    ]
