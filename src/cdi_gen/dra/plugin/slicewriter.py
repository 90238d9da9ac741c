"""The publisher's writes of single ResourceSlices, and what it knows of each of its slices.

:class:`SliceWriter` is the part of :class:`~cdi_gen.dra.plugin.publisher.SlicePublisher` that
speaks to the API server one slice at a time: it lists this driver's slices on this node (all
adopted; the highest generation found is the caller's), creates or replaces a slice (its
taints' times kept, the resourceVersion last seen named, the gated fields the API server
dropped said once) and deletes one. The publisher decides what to write and when.

What it keeps of each slice (:mod:`~cdi_gen.dra.plugin.slicerecord`: uid, resourceVersion,
taint times, the digests of what was sent and of what came back, and of a write under way) is
also what tells a watch event that echoes our own write from someone else's change
(:meth:`SliceWriter.foreign`), and what lets a change that left a slice as we wrote it be
followed (:meth:`SliceWriter.follow`) so that the next write names the newest resourceVersion.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from cdi_gen.dra.plugin.slicerecord import (
    GATES,
    HeldSlice,
    dropped_fields,
    keep_taint_times,
    slice_digest,
)

if TYPE_CHECKING:
    from cdi_gen.apiserver.client import ApiClient
    from cdi_gen.dra.plugin.slices import Slice

__all__ = ["SliceWriter"]

#: The publisher's logger: these lines are the publisher's, whichever of its parts writes them
#: (the JSON logs' ``logger`` field and a level set for the publisher name it).
log = logging.getLogger("cdi_gen.dra.plugin.publisher")


class SliceWriter:
    """Writes ``driver``'s ResourceSlices of ``node`` one at a time, and keeps what it knows
    of each (see the module docstring)."""

    def __init__(self, client: ApiClient, driver: str, node: str) -> None:
        self._client = client
        self.driver = driver
        self.node = node
        #: Our slices in the API as last seen (name -> what is kept of it), and the digest of
        #: what we last sent.
        self.current: dict[str, HeldSlice] = {}
        self.sent: dict[str, bytes] = {}
        #: Digests of what the API server answered to our last write of each slice, and of
        #: what is being written now: the watch's echo of our own writes is told apart by them.
        self._returned: dict[str, bytes] = {}
        self._writing: dict[str, bytes] = {}
        self._deleting: set[str] = set()
        #: The uid of the Node, our slices' owner (None: not known, or not to be had).
        self.node_uid: str | None = None
        #: Gated fields the API server dropped ("taints", "counters", "capacity"), each
        #: logged once.
        self.dropped: set[str] = set()
        #: Told each newly dropped field, on the loop (the driver changes what it publishes).
        self.on_dropped: Callable[[str], None] | None = None

    async def list(self) -> int:
        """Adopt this driver's slices on this node as the API server lists them; the highest
        pool generation among them (0: none). Learns the Node's uid first if not known yet."""
        from cdi_gen.apiserver.errors import ApiServerError

        if self.node_uid is None:
            try:
                self.node_uid = await self._client.node_uid(self.node)
            except ApiServerError as exc:
                if exc.status is None:
                    raise  # no answer: retry everything later
                log.warning("slices published without their Node as owner: %s", exc)
        items = await self._client.list_slices(self.driver, self.node)
        self.current = {s["metadata"]["name"]: HeldSlice.of(s) for s in items}
        # A slice still as the API server returned it after our last write keeps what we
        # sent as its reference: the server may have dropped gated fields, and comparing
        # with its version would rewrite the slice after every list, forever.
        sent = {}
        for s in items:
            name, digest = s["metadata"]["name"], slice_digest(s)
            kept = name in self.sent and self._returned.get(name) == digest
            sent[name] = self.sent[name] if kept else digest
        self.sent = sent
        self._returned = {n: c for n, c in self._returned.items() if n in self.current}
        return max([0, *(int(s["spec"]["pool"].get("generation") or 0) for s in items)])

    async def delete(self, name: str) -> None:
        """Delete our slice ``name`` (its deletion is not taken for someone else's)."""
        self._deleting.add(name)
        try:
            await self._client.delete_slice(name)
        finally:
            self._deleting.discard(name)
        self.current.pop(name, None)
        self.sent.pop(name, None)
        self._returned.pop(name, None)

    async def write(self, obj: Slice) -> None:
        """Create ``obj``, or replace our slice of its name (at the resourceVersion last
        seen). Raises :class:`~cdi_gen.apiserver.errors.ApiServerError`: 409 when someone
        changed or created it, 404 when it was deleted meanwhile (the caller lists again)."""
        name = obj["metadata"]["name"]
        current = self.current.get(name)
        keep_taint_times(obj, current)
        self._writing[name] = sent = slice_digest(obj)
        try:
            if current is None:
                result = await self._client.create_slice(obj)
            else:
                obj["metadata"]["resourceVersion"] = current.resource_version
                result = await self._client.replace_slice(obj)
        finally:
            del self._writing[name]
        obj["metadata"].pop("resourceVersion", None)
        self.current[name] = HeldSlice.of(result)
        self.sent[name] = sent
        self._returned[name] = slice_digest(result)
        for field in sorted(dropped_fields(obj, result) - self.dropped):
            self.dropped.add(field)
            log.warning(
                "the API server dropped fields of ResourceSlice %s; feature gate off: %s",
                name,
                GATES[field],
            )
            if self.on_dropped is not None:
                self.on_dropped(field)

    def foreign(self, kind: str, obj: Slice) -> str | None:
        """Why a watch event means someone else changed our slices (None: it does not)."""
        name = obj["metadata"]["name"]
        current = self.current.get(name)
        if name in self._deleting:
            return None
        if kind == "DELETED":
            uid = obj["metadata"].get("uid")
            # Not ours, or an earlier slice of that name already replaced: nothing lost.
            if current is None or (uid and uid != current.uid):
                return None
            return "was deleted"
        if (
            current is not None
            and obj["metadata"].get("resourceVersion") == current.resource_version
        ) or slice_digest(obj) in (
            self.sent.get(name),
            self._returned.get(name),
            self._writing.get(name),
        ):
            # The echo of our own write, or someone else's label or annotation: same content.
            return None
        return "was changed by another writer" if current is not None else "appeared"

    def follow(self, kind: str, obj: Slice) -> None:
        """Keep the resourceVersion of a change to our slice that left it as we wrote it
        (another writer's label, the echo of our write): a resumed watch lists nothing, and
        a write naming an older version would fail with a conflict."""
        name = obj["metadata"]["name"]
        if kind == "DELETED" or name not in self.current or name in self._writing:
            return
        if slice_digest(obj) in (self.sent.get(name), self._returned.get(name)):
            self.current[name] = HeldSlice.of(obj)
