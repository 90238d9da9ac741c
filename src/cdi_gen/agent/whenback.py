"""A class's ``whenBack`` applied to a device that came back (:mod:`~cdi_gen.agent.comebacks`)
after its new spec is written: its holders found (:mod:`~cdi_gen.agent.holders`) and each
given the device in place (``follow``, :func:`~cdi_gen.agent.follow.follow`) or stopped
through the CRI so that the kubelet starts it again with the current spec (``restart``, and
``follow`` for a device whose node came back at another path in the container, which no
follow can give in place).

All of it runs in a worker thread, never on the loop, and is bounded
(:data:`BOUND_SECONDS`): a slow kubelet or runtime socket is one line, not a hang. Each
holding container gets one :class:`ContainerOutcome` and one line (done, restarted, skipped,
refused, with why), counted in ``cdi_gen_when_back_total{resource, policy, outcome}``; a
device that came back with the same numbers is one info line and nothing else.

``on_outcomes`` (optional) is the one hook for what else reports the outcomes (a Kubernetes
Event on the pod, a claim's status): called on the loop with the class's resource, the
device's name and every container's outcome, after the lines are logged; its exceptions are
logged and go no further.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from cdi_gen.agent.comebacks import Comeback, MovedNode
from cdi_gen.agent.follow import CameBack, Hierarchies, follow
from cdi_gen.agent.holders import DeviceKeys, FoundHolder, as_followed, find_holders
from cdi_gen.agent.privileges import Policy, Privileges, effective_policy
from cdi_gen.config.edits import NodeOptions
from cdi_gen.config.models import ClassConfig
from cdi_gen.containernode.node import DeviceNode
from cdi_gen.devcgroup.rules import DeviceType
from cdi_gen.discovery.sharing import slot_names
from cdi_gen.errors import quote
from cdi_gen.kubelet.containers import stop_container
from cdi_gen.localclient import Deadline, LocalCallError
from cdi_gen.logs import call_hook, fields
from cdi_gen.metrics import Metrics

__all__ = [
    "BOUND_SECONDS",
    "GRACE_SECONDS",
    "Announcer",
    "BackPolicy",
    "ContainerOutcome",
    "OnOutcomes",
    "announced",
    "class_policy",
    "device_keys",
    "spec_node",
]

log = logging.getLogger("cdi_gen.agent.agent")

#: The lookup of the holders (pod resources and CRI together) may take this long.
LOOKUP_SECONDS = 0.5
#: All of one comeback, lookup, every holder's follow or stop, may take this long.
BOUND_SECONDS = 10.0
#: ``restart``: a holding container is given this long to stop before SIGKILL.
GRACE_SECONDS = 2

Outcome = Literal["done", "restarted", "skipped", "refused"]


@dataclass(frozen=True, slots=True)
class ContainerOutcome:
    """What became of one holding container (``ns/pod/container``)."""

    container: str
    container_id: str
    outcome: Outcome
    reason: str

    def line(self, resource: str, device: str) -> str:
        what = f"class {resource}: device {quote(device)} came back: container {self.container}"
        return f"{what}: {self.outcome}" + (f": {self.reason}" if self.reason else "")


#: The hook for other reports of the outcomes (see the module docstring).
OnOutcomes = Callable[[str, str, Sequence[ContainerOutcome]], None]


class Announcer(Protocol):
    """Who tells the holders' claims and pods what was done (the DRA driver)."""

    def announce(
        self, class_name: str, device_id: str, action: str, lines: Sequence[str], *, failed: bool
    ) -> None: ...


def announced(
    announcer: Announcer, class_name: str, action: str, then: OnOutcomes | None
) -> OnOutcomes:
    """The outcomes hook of a DRA class: ``announcer`` tells the claims and pods holding the
    device what ``action`` did (one line per container; failed when one was refused), then
    ``then`` gets the outcomes."""

    def announce(resource: str, device: str, outcomes: Sequence[ContainerOutcome]) -> None:
        lines = [o.line(resource, device) for o in outcomes]
        failed = any(o.outcome == "refused" for o in outcomes)
        announcer.announce(class_name, device, action, lines, failed=failed)
        if then is not None:
            then(resource, device, outcomes)

    return announce


def spec_node(options: NodeOptions, moved: MovedNode) -> DeviceNode:
    """The node a holder is given: its path in the container, type and new numbers, and the
    mode, owner and group the spec gives it (unset: the host node's mode, owner 0)."""
    node = moved.node
    mode = options.file_mode
    if mode is None:
        try:
            mode = os.stat(node.host_path).st_mode & 0o777
        except OSError:
            mode = 0o600
    return DeviceNode(
        node.container_path, node.type, *moved.new, mode, options.uid or 0, options.gid or 0
    )


class BackPolicy:
    """One class's ``whenBack`` as this agent applies it (``policy``, already lowered to
    what its privileges allow)."""

    def __init__(
        self,
        resource: str,
        policy: Policy,
        node_options: NodeOptions,
        keys: Callable[[str], DeviceKeys],
        *,
        pod_resources: Path,
        cri: Path | None,
        metrics: Metrics,
        on_outcomes: OnOutcomes | None = None,
        bound: float = BOUND_SECONDS,
        grace: int = GRACE_SECONDS,
        hierarchies: Callable[[], Hierarchies] = Hierarchies.now,
    ) -> None:
        self.resource, self.policy = resource, policy
        self.node_options, self.keys = node_options, keys
        self.pod_resources, self.cri = pod_resources, cri
        self.metrics, self.on_outcomes = metrics, on_outcomes
        self.bound, self.grace = bound, grace
        self.hierarchies = hierarchies

    async def handle(self, comeback: Comeback) -> list[ContainerOutcome]:
        """Apply the policy to ``comeback``, in a worker thread, bounded; never raises."""
        if not comeback.moved:
            log.info(
                "device came back with the same numbers: nothing changes in its containers",
                extra=fields(resource=self.resource, device=comeback.name),
            )
            return []
        if self.policy == "keep" or self.cri is None:
            log.info(
                "device came back with new numbers: whenBack keep: its containers keep the "
                "old node until they restart",
                extra=fields(resource=self.resource, device=comeback.name),
            )
            return []
        started = time.monotonic()
        try:
            outcomes = await asyncio.wait_for(
                asyncio.to_thread(self._apply, comeback, self.cri), self.bound
            )
        except TimeoutError:
            log.error(
                "class %s: device %s came back: whenBack %s took over %g s; its containers "
                "may not have the device",
                self.resource, quote(comeback.name), self.policy, self.bound,
            )  # fmt: skip
            self.metrics.when_back.labels(self.resource, self.policy, "timeout").inc()
            return []
        except Exception as exc:
            log.exception("class %s: device %s came back: %s", self.resource, comeback.name, exc)
            self.metrics.when_back.labels(self.resource, self.policy, "error").inc()
            return []
        for outcome in outcomes:
            level = logging.INFO if outcome.outcome in ("done", "restarted") else logging.WARNING
            log.log(level, "%s", outcome.line(self.resource, comeback.name))
            self.metrics.when_back.labels(self.resource, self.policy, outcome.outcome).inc()
        log.debug(
            "whenBack applied",
            extra=fields(
                resource=self.resource,
                device=comeback.name,
                containers=len(outcomes),
                seconds=round(time.monotonic() - started, 3),
            ),
        )
        if self.on_outcomes is not None:
            call_hook(
                self.on_outcomes,
                self.resource,
                comeback.name,
                outcomes,
                what="whenBack outcomes hook",
                logger=log,
            )
        return outcomes

    def _apply(self, comeback: Comeback, cri: Path) -> list[ContainerOutcome]:
        """In the worker thread: the holders, then each followed or stopped."""
        deadline = Deadline(LOOKUP_SECONDS)
        try:
            holders = find_holders(self.keys(comeback.name), self.pod_resources, cri, deadline)
        except LocalCallError as exc:
            log.warning(
                "class %s: device %s came back: its holders could not be found: %s",
                self.resource, quote(comeback.name), exc,
            )  # fmt: skip
            self.metrics.when_back.labels(self.resource, self.policy, "lookup-failed").inc()
            return []
        for note in holders.notes:
            log.warning(
                "class %s: device %s came back: %s", self.resource, quote(comeback.name), note
            )
        renamed = next((m for m in comeback.moved if m.old_path is not None), None)
        if self.policy == "restart" or renamed is not None:
            # The runtime's container ID names what is stopped: its process is not touched,
            # so what the follow step checks of it does not matter here. A node at another
            # path cannot be followed in place: the container's software names the old path.
            note = "" if renamed is None or self.policy == "restart" else (
                f"whenBack follow runs as restart: {renamed.old_path} came back as "
                f"{renamed.node.container_path}, which follow cannot give in place; "
            )  # fmt: skip
            return [self._stop(f, cri, note) for f in holders.found]
        outcomes = [self._problem(f) for f in holders.found if f.holder is None]
        ready = [f for f in holders.found if f.holder is not None]
        return outcomes + self._follow(comeback, ready)

    @staticmethod
    def _problem(found: FoundHolder) -> ContainerOutcome:
        status, why = found.problem or ("refused", "")
        outcome: Outcome = "skipped" if status == "skipped" else "refused"
        return ContainerOutcome(str(found.running.ref), found.running.container_id, outcome, why)

    def _stop(self, found: FoundHolder, cri: Path, note: str = "") -> ContainerOutcome:
        running = found.running
        try:
            stop_container(cri, running.container_id, self.grace)
        except LocalCallError as exc:
            why = f"{note}{exc}"
            return ContainerOutcome(str(running.ref), running.container_id, "refused", why)
        why = (
            f"{note}stopped through the CRI (grace {self.grace} s): the kubelet starts it "
            "again with the current spec"
        )
        return ContainerOutcome(str(running.ref), running.container_id, "restarted", why)

    def _follow(self, comeback: Comeback, ready: Sequence[FoundHolder]) -> list[ContainerOutcome]:
        where = self.hierarchies()
        worst: dict[str, ContainerOutcome] = {}
        for moved in comeback.moved:
            came = CameBack(comeback.name, spec_node(self.node_options, moved), moved.old)
            type_: DeviceType = "b" if moved.node.type == "b" else "c"
            holders = [as_followed(f, moved.node.container_path, type_, moved.old) for f in ready]
            pairs = [(f, h) for f, h in zip(ready, holders, strict=True) if h is not None]
            results = follow(came, [h for _, h in pairs], where)
            for (found, _), result in zip(pairs, results, strict=True):
                key = found.running.container_id
                outcome = ContainerOutcome(
                    result.holder, key, result.status, _node_reason(moved, result.reason)
                )
                if key not in worst or worst[key].outcome == "done":
                    worst[key] = outcome
        return list(worst.values())


def _node_reason(moved: MovedNode, reason: str) -> str:
    if not reason:
        return f"{moved.node.container_path} is {moved.new[0]}:{moved.new[1]}"
    return f"{moved.node.container_path}: {reason}"


def device_keys(
    config: ClassConfig, vendor: str, driver: tuple[str, str, Sequence[str]] | None
) -> Callable[[str], DeviceKeys]:
    """What the kubelet knows each device of class ``config`` by: its device IDs (a shared
    device's slots) under the class's resource, or for a DRA class (``driver``: the driver's
    name, its pool, every class name of the node) its names in the pool and its CDI names."""
    replicas = config.sharing.replicas

    def ids(name: str) -> tuple[str, ...]:
        return (name,) if replicas <= 1 else (name, *slot_names(name, replicas))

    if driver is None:
        resource = f"{vendor}/{config.name}"
        return lambda name: DeviceKeys(resource=resource, device_ids=ids(name))
    from cdi_gen.dra.driver.poolentries import device_name

    driver_name, pool, classes = driver
    return lambda name: DeviceKeys(
        driver=driver_name,
        pool=pool,
        pool_devices=tuple(device_name(config.name, i, classes) for i in ids(name)),
        cdi_names=tuple(f"{vendor}/{config.name}={i}" for i in ids(name)),
    )


def class_policy(
    config: ClassConfig,
    vendor: str,
    privileges: Privileges | None,
    pod_resources: Path,
    *,
    driver: tuple[str, str, Sequence[str]] | None,
    metrics: Metrics,
    on_outcomes: OnOutcomes | None = None,
) -> BackPolicy:
    """Class ``config``'s :class:`BackPolicy`, its ``whenBack`` lowered to what
    ``privileges`` allow (None: no kubelet) with one line (see
    :func:`~cdi_gen.agent.privileges.effective_policy`)."""
    resource = f"{vendor}/{config.name}"
    if config.api == "dra" and config.node.pin_numbers:
        # The class spec is written anew; a claim's own spec (a claim with a DeviceConfig)
        # copies the class's nodes once, at prepare, and is not.
        log.warning(
            "class %s: node.pinNumbers: the own spec of a claim with a DeviceConfig keeps the "
            "numbers it was prepared with; a container restarted after a comeback gets them",
            resource,
        )
    return BackPolicy(
        resource,
        effective_policy(resource, config.when_back, privileges),
        config.node,
        device_keys(config, vendor, driver),
        pod_resources=pod_resources,
        cri=None if privileges is None else privileges.cri_socket,
        metrics=metrics,
        on_outcomes=on_outcomes,
    )
