"""What the claims holding a device are told when it leaves the node and comes back: a
condition in each claim's ``status.devices`` entry and an Event on each pod using the claim.

:class:`DeviceNotices` is given every change of the pool (:meth:`DeviceNotices.published`): a
device present (in the pool and not gone) that is no longer is a device that *left*; one that
left and is present again *came back*. For each, the prepared claims holding it (asked of the
driver part when the notice is written, so a claim unprepared meanwhile is not told) get:

- in ``status.devices``, beside ``Ready``, a ``Present`` condition of the device: ``False``
  (``DeviceGone``) while it is away, ``True`` (``DeviceBack``) once back, its message saying
  what the agent then did (see :meth:`DeviceNotices.announce`); written through
  :class:`~cdi_gen.dra.plugin.claimstatus.ClaimStatus`, so never delaying or failing anything;
- an Event (``DeviceGone``, Warning; ``DeviceBack``, Normal) on each pod the claim is
  reserved for (``status.reservedFor``, read when needed and kept :data:`PODS_SECONDS`), or
  on the claim when no pod is named.

:meth:`DeviceNotices.announce` is the hook for what the agent did about a device that came
back (``whenBack: follow`` or ``restart``), one line per container: an Event on the same pods
(Normal when all went well, Warning otherwise), and the lines in the ``Present`` condition.

A device that flaps cannot flood the API server: notices wait per device, coalesced (a device
that left and came back while its notice waited is told once, as it is now), and each
device's notice takes a token of one bucket before it is written; Events are rate-limited
again, and counted in series, by the :class:`~cdi_gen.apiserver.events.EventRecorder`.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from cdi_gen.apiserver.events import EventType, Regarding
from cdi_gen.dra.plugin.claims import ClaimRef, HeldClaim, claim_label
from cdi_gen.dra.plugin.claimstatus import ClaimStatus, device_entries
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.logs import fields
from cdi_gen.model import ClaimView, PoolDevice
from cdi_gen.paced import PacedQueue, TokenBucket

__all__ = [
    "MAX_ANNOUNCED",
    "PODS_SECONDS",
    "ClaimGetter",
    "DeviceNotices",
    "Holders",
    "Recorder",
]

log = logging.getLogger(__name__)

#: How long the pods a claim is reserved for are taken as read (a flapping device's notices
#: do not read its claims each time).
PODS_SECONDS = 30.0
#: Notices written at once, then one per second: a node's devices leaving together are told
#: at once, a flapping one once a second at most.
NOTICE_BURST = 20
NOTICE_RATE = 1.0
#: The condition message's bound (the API's is 32768 bytes).
MAX_MESSAGE = 4096
#: Lines of what the agent did kept per device (the newest).
MAX_ANNOUNCED = 32


#: The driver part's answer: the prepared claims holding pool device ``name``.
Holders = Callable[[str], list[HeldClaim]]


class ClaimGetter(Protocol):
    """Reads a claim for the pods it is reserved for (``ApiClient.get_claim``)."""

    async def get_claim(self, namespace: str, name: str) -> ClaimView: ...


class Recorder(Protocol):
    """Where Events go (:class:`~cdi_gen.apiserver.events.EventRecorder`)."""

    def record(
        self, regarding: Regarding, type: EventType, reason: str, action: str, note: str
    ) -> None: ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class _Notice:
    """What waits to be told of one device."""

    #: The state to tell, if it changed since the last notice: left, or back.
    state: Literal["left", "back"] | None = None
    #: What became of its slice entry when it left: tainted (which effect), or withdrawn.
    how: str = ""
    #: What the agent did, said since: (type, reason, action, note).
    announced: list[tuple[EventType, str, str, str]] = field(default_factory=list)


class DeviceNotices:
    """The notices of DRA driver ``driver`` on ``node``: claims held (``holders``), their
    status written through ``status``, their pods read through ``claims``, Events through
    ``events``."""

    def __init__(
        self,
        driver: str,
        node: str,
        pool: DevicePool,
        holders: Holders,
        *,
        status: ClaimStatus | None,
        claims: ClaimGetter,
        events: Recorder,
        bucket: TokenBucket | None = None,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime.datetime] | None = None,
    ) -> None:
        self.driver = driver
        self.node = node
        self.pool = pool
        self.holders = holders
        self.status = status
        self.claims = claims
        self.events = events
        self.bucket = bucket or TokenBucket(NOTICE_BURST, NOTICE_RATE, clock)
        self._clock = clock
        self._now = now or (lambda: datetime.datetime.now(datetime.UTC))
        #: Devices seen leaving, and not back since: only they can come back.
        self.away: set[str] = set()
        #: Each device's ``Present`` condition, once it left (loop only).
        self.conditions: dict[str, dict[str, str]] = {}
        self._pending: PacedQueue[str, _Notice] = PacedQueue(self._tell_one, self.bucket)
        self._pods: dict[str, tuple[float, tuple[tuple[str, str], ...]]] = {}
        self._loop = asyncio.get_running_loop()
        #: Notices written (tests wait for it).
        self.told = 0

    # -- what happened (the loop) ---------------------------------------------------------

    def published(self, before: Iterable[PoolDevice], after: Iterable[PoolDevice]) -> None:
        """A class's pool entries went from ``before`` to ``after``: notices for the devices
        that left or came back (never raises)."""
        try:
            was = {d.name for d in before if not d.gone}
            now = {d.name: d for d in after if not d.gone}
            gone = {d.name: d for d in after if d.gone}
            for name in sorted(was - now.keys()):
                self.away.add(name)
                notice = self._queue(name)
                notice.state = "left"
                notice.how = self._how(gone.get(name))
            for name in sorted((now.keys() & self.away) - was):
                self.away.discard(name)
                self._queue(name).state = "back"
        except Exception:  # the notices must never fail a publication
            log.exception("device notices of driver %s not queued", self.driver)

    def _how(self, device: PoolDevice | None) -> str:
        if device is None:
            return "withdrawn from the ResourceSlices"
        if device.taint_when_gone:
            return f"tainted {self.driver}/gone:NoExecute: the pods using it are evicted"
        return f"tainted {self.driver}/gone:NoSchedule: new claims stay off it"

    def announce_device(
        self, class_name: str, device_id: str, action: str, lines: Sequence[str], *, failed: bool
    ) -> None:
        """The agent's hook (:meth:`cdi_gen.dra.node.DraDriver.announce`): what it did about
        a held device of class ``class_name`` that came back, its CDI device name
        ``device_id`` (or the device whose slots those are): ``action`` ``"follow"`` or
        ``"restart"``, one line per container (what was done, or why it could not be), and
        ``failed`` when any container was not served. Told as :meth:`announce` says, for
        each pool entry of the device. From any thread; never waits, never raises."""
        try:
            call = functools.partial(self._announce_device, class_name, device_id, action)
            self._loop.call_soon_threadsafe(functools.partial(call, tuple(lines), failed))
        except RuntimeError:
            pass  # the loop is closed: the agent stops
        except Exception:
            log.exception("an announcement of driver %s not queued", self.driver)

    def _announce_device(
        self, class_name: str, device_id: str, action: str, lines: Sequence[str], failed: bool
    ) -> None:
        for device in self.pool.by_class.get(class_name, ()):
            shared = device.slots > 1 or device.shares > 1
            own = device.cdi_name.partition("=")[2]
            if own == device_id or (shared and own.rpartition("-")[0] == device_id):
                self.announce(device.name, action, lines, failed=failed)

    def announce(self, device: str, action: str, lines: Sequence[str], *, failed: bool) -> None:
        """What the agent did (``action``: ``follow`` or ``restart``) about pool device
        ``device`` that came back, one line per container (or why it could not): an Event
        on the pods of the claims holding it, the lines in its ``Present`` condition (on
        the loop; never raises)."""
        try:
            verb = action.capitalize()
            past = {"follow": "Followed", "restart": "Restarted"}.get(action, f"{verb}ed")
            reason = f"Device{verb}Failed" if failed else f"Device{past}"
            note = f"device {device}: {action}: " + ("; ".join(lines) or "nothing to do")
            kind: EventType = "Warning" if failed else "Normal"
            notice = self._queue(device)
            notice.announced.append((kind, reason, verb, note))
            del notice.announced[:-MAX_ANNOUNCED]
        except Exception:
            log.exception("an announcement of driver %s not queued", self.driver)

    def _queue(self, device: str) -> _Notice:
        notice = self._pending.waiting(device) or _Notice()
        self._pending.put(device, notice)  # told again: behind the others
        return notice

    async def close(self) -> None:
        """Stop telling; what waits is dropped, and the Events' writer closed."""
        await self._pending.close()
        await self.events.close()

    # -- telling --------------------------------------------------------------------------

    async def _tell_one(self, device: str, notice: _Notice) -> None:
        try:
            await self._tell(device, notice)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("device %s: its claims not told", device)
        self.told += 1

    async def _tell(self, device: str, notice: _Notice) -> None:
        stamp = self._now().strftime("%Y-%m-%dT%H:%M:%SZ")
        events: list[tuple[EventType, str, str, str]] = []
        if notice.state == "left":
            self.conditions[device] = {
                "type": "Present",
                "status": "False",
                "reason": "DeviceGone",
                "message": f"the device left node {self.node}; {notice.how}",
                "lastTransitionTime": stamp,
            }
            events.append(
                (
                    "Warning",
                    "DeviceGone",
                    "Taint" if notice.how.startswith("tainted") else "Withdraw",
                    f"device {device} of driver {self.driver} left node {self.node}; {notice.how}",
                )
            )
        elif notice.state == "back":
            self.conditions[device] = {
                "type": "Present",
                "status": "True",
                "reason": "DeviceBack",
                "message": f"the device came back to node {self.node}",
                "lastTransitionTime": stamp,
            }
            events.append(
                (
                    "Normal",
                    "DeviceBack",
                    "Untaint",
                    f"device {device} of driver {self.driver} came back to node {self.node}; "
                    "its taint removed",
                )
            )
        if notice.announced:
            condition = self.conditions.get(device)
            if condition is not None and condition["status"] == "True":
                done = "; ".join(note for *_, note in notice.announced)
                message = f"the device came back to node {self.node}; {done}"
                condition["message"] = message[:MAX_MESSAGE]
            events += notice.announced
        held = self.holders(device)
        # Every status first, with no wait since the holders were asked: an unprepare's
        # clearing write is then either already done (the claim not held) or comes later.
        for claim in held:
            self._write_status(claim)
        for claim in held:
            for regarding in await self._regarding(claim.ref):
                for kind, reason, action, note in events:
                    self.events.record(regarding, kind, reason, action, note)

    def _write_status(self, claim: HeldClaim) -> None:
        if self.status is None:
            return
        ref = claim.ref
        entries = device_entries(
            self.driver, claim.devices, self.pool.devices, claim.device_nodes, claim.network_data
        )
        since = self.status.since.get(ref.uid)
        for entry in entries:
            for condition in entry["conditions"]:
                if since is not None:  # Ready did not change: its time stays
                    condition["lastTransitionTime"] = since
            present = self.conditions.get(entry["device"])
            if present is not None:
                entry["conditions"].append(dict(present))
        self.status.rewrite(ref.namespace, ref.name, ref.uid, entries)

    async def _regarding(self, ref: ClaimRef) -> list[Regarding]:
        """The pods claim ``ref`` is reserved for, or the claim itself."""
        cached = self._pods.get(ref.uid)
        if cached is not None and self._clock() - cached[0] < PODS_SECONDS:
            pods = cached[1]
        else:
            try:
                claim = await self.claims.get_claim(ref.namespace, ref.name)
                pods = claim.pods if claim.uid == ref.uid else ()
            except Exception as exc:
                log.info(
                    "%s: its pods not read (%s); its Events go on the claim",
                    claim_label(ref.namespace, ref.name, ref.uid),
                    exc,
                    extra=fields(driver=self.driver),
                )
                pods = ()
            self._pods[ref.uid] = (self._clock(), pods)
            if len(self._pods) > 4096:  # claims long unprepared
                self._pods.pop(next(iter(self._pods)))
        if not pods:
            return [
                Regarding("ResourceClaim", ref.namespace, ref.name, ref.uid, "resource.k8s.io/v1")
            ]
        return [Regarding("Pod", ref.namespace, name, uid) for name, uid in pods]
