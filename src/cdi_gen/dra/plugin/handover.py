"""The rolling-update handover between two instances of the DRA driver on one node.

With the pod's UID (a rolling update with ``maxSurge``: kubelet >= 1.33) the new pod's
instance registers beside the old one and the kubelet sends its calls to the newest (see
:mod:`~cdi_gen.dra.plugin.server` for the sockets' names). :class:`Handover` is what each
instance knows of the others, through the plugin folder both share and the plugin watcher
folder: each says the kubelet registered it with a file beside its DRA socket,
``<its registration socket's name>.registered``, removed at its stop, and that it stopped
publishing the ResourceSlices with ``<name>.yielded``.

The old instance hands over: :meth:`Handover.superseded` returns once a newer instance's
registration socket is there and registered, and :meth:`Handover.predecessors_yielded` holds
the newer one's first publication until every older instance still served has yielded, so
that the two never write the node's slices at once. A successor counts only while its
registration socket is served: one killed leaves its files, and
:meth:`Handover.successors_gone` (a connection held to that socket ends with its process) lets
the older instance take the slices back. Without a pod UID there is one instance per node:
nobody to hand over to, and no file is written.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cdi_gen.kubelet.registration import newer_siblings, older_siblings, watch_until
from cdi_gen.kubelet.transport import listening

if TYPE_CHECKING:
    from pathlib import Path

    from cdi_gen.kubelet.transport import UnixServer

__all__ = ["Handover"]

#: The plugin's logger: these lines are the DRA plugin's (the JSON logs' ``logger`` field and
#: a level set for the plugin name it).
log = logging.getLogger("cdi_gen.dra.plugin.server")


class Handover:
    """What the instance ``pod_uid`` of DRA driver ``driver``, whose DRA socket is
    ``socket_path`` and whose registration socket ``registration`` serves, knows of its
    driver's other instances on the node (see the module docstring)."""

    def __init__(
        self, driver: str, pod_uid: str | None, socket_path: Path, registration: UnixServer
    ) -> None:
        self.driver = driver
        self.pod_uid = pod_uid
        self._registration = registration
        self._socket_folder = socket_path.parent
        name = registration.path.name
        #: Where this instance says the kubelet registered it (with a pod UID only).
        self.registered_file = self._socket_folder / f"{name}.registered"
        #: Where this instance says it writes no ResourceSlice any more (it handed over).
        self.yielded_file = self._socket_folder / f"{name}.yielded"

    def forget(self) -> None:
        """At start: what an earlier run of this pod left (a crash) says nothing of this one,
        which is registered and yields anew."""
        if self.pod_uid is not None:
            self.registered_file.unlink(missing_ok=True)
            self.yielded_file.unlink(missing_ok=True)

    def mark_registered(self) -> None:
        """Say the kubelet registered this instance (for an older one waiting to hand over)."""
        if self.pod_uid is not None:
            self.registered_file.write_bytes(b"")

    def mark_yielded(self, yielded: bool = True) -> None:
        """Say, beside our DRA socket, that this instance writes no ResourceSlice any more
        (or, ``yielded`` False, that it writes them again: its successor is gone): the
        newer instance waits for it before it publishes (see :meth:`predecessors`)."""
        if self.pod_uid is None:
            return
        if yielded:
            self.yielded_file.write_bytes(b"")
        else:
            self.yielded_file.unlink(missing_ok=True)

    def successors(self) -> list[Path]:
        """The registration sockets of newer instances of this driver that the kubelet
        registered and that are still served, newest first (none without a pod UID, or while
        our own socket is not served). An instance killed leaves its files as they were: only
        a socket someone listens on says it runs."""
        served = self._registration.socket_id
        if self.pod_uid is None or served is None:
            return []
        folder = self._socket_folder
        return [
            path
            for path in newer_siblings(self._registration.path, self.driver, served[2])
            if (folder / f"{path.name}.registered").exists() and listening(path)
        ]

    def predecessors(self) -> list[Path]:
        """The registration sockets of older instances of this driver still served that have
        not said they handed the ResourceSlices over, oldest first (none without a pod UID).
        While our own socket is not served every served one counts: we cannot tell it is
        older, and publishing beside it would withdraw what it serves."""
        if self.pod_uid is None:
            return []
        served = self._registration.socket_id
        folder = self._socket_folder
        return [
            path
            for path in older_siblings(
                self._registration.path, self.driver, None if served is None else served[2]
            )
            if not (folder / f"{path.name}.yielded").exists()
        ]

    async def predecessors_yielded(self) -> None:
        """Wait until no older instance of this driver may write the ResourceSlices: each
        has said it handed them over, or stopped serving. Two instances publishing at once
        would each take the other's slice for a change to repair, and whoever wrote last
        would win: the older one's devices could stay published for good."""
        pending = self.predecessors()
        if not pending:
            return
        log.info(
            "DRA driver %s publishes its ResourceSlices once the older instance hands them "
            "over: %s",
            self.driver,
            pending[0],
        )
        await watch_until(self._folders(), lambda: True if not self.predecessors() else None)

    async def superseded(self) -> Path:
        """Wait until a newer instance of this driver is registered beside us; its
        registration socket. Without a pod UID there is none: this waits until cancelled."""

        def newest() -> Path | None:
            found = self.successors()
            return found[0] if found else None

        return await watch_until(self._folders(), newest)

    async def successors_gone(self) -> None:
        """Wait until no newer instance of this driver is registered and served beside us
        (each stopped, or died: killed, it leaves its files, and the connection held to its
        registration socket tells at once)."""

        def gone() -> bool | None:
            if self._registration.socket_id is None:
                return None  # ours being served anew: no sibling can be told newer now
            return None if self.successors() else True

        await watch_until(self._folders(), gone, served=self.successors)

    def _folders(self) -> tuple[Path, Path]:
        return (self._registration.path.parent, self._socket_folder)
