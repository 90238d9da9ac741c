"""The publisher's watch of the node's ResourceSlices in the API server.

:class:`SliceWatch` follows this driver's slices on this node for
:class:`~cdi_gen.dra.plugin.publisher.SlicePublisher` and calls it back when they must be
published again: one of ours deleted or changed by someone else, or a slice not ours appearing
in our pool (the kubelet deletes every slice of the node when it starts, and a driver's slices
when its socket goes; another writer may edit them). Which events are the echo of our own
writes is the :class:`~cdi_gen.dra.plugin.slicewriter.SliceWriter`'s to say; a change that left
a slice as we wrote it has its resourceVersion followed there.

A watch the API server ends (every :data:`~cdi_gen.apiserver.client.WATCH_SECONDS`) goes on
from the last resourceVersion seen (bookmarks included), which replays what changed meanwhile:
no list. A watch opened with no version to go on from asks for a list, since what changed while
none was open sent no event. Any failure of the watch (no answer, an error, a line that is not
an event, 410 Gone for a version too old) starts it again after a backoff, and what happened
meanwhile is found by listing again. It never ends but by cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cdi_gen.retry import Retry, describe

if TYPE_CHECKING:
    from cdi_gen.apiserver.client import ApiClient
    from cdi_gen.dra.plugin.slicewriter import SliceWriter

__all__ = ["SliceWatch"]

#: The publisher's logger: these lines are the publisher's, whichever of its parts writes them
#: (the JSON logs' ``logger`` field and a level set for the publisher name it).
log = logging.getLogger("cdi_gen.dra.plugin.publisher")


class SliceWatch:
    """Watches ``driver``'s ResourceSlices of ``node``; ``relist()`` when they must be listed
    and published again (see the module docstring). ``retry(level)`` makes the retry loop of
    its restarts (the publisher's, bounded by its ``retry_max``)."""

    def __init__(
        self,
        client: ApiClient,
        driver: str,
        node: str,
        slices: SliceWriter,
        *,
        relist: Callable[[], None],
        retry: Callable[[int], Retry],
    ) -> None:
        self._client = client
        self.driver = driver
        self.node = node
        self._slices = slices
        self._relist = relist
        self._retry = retry
        #: The resourceVersion the watch has seen up to (an event's or a bookmark's): the
        #: next watch goes on from there. None: unknown, the next watch lists again.
        self._version: str | None = None

    async def run(self) -> None:
        """Watch until cancelled; whatever breaks a watch, another is opened."""
        loop = asyncio.get_running_loop()
        retrying = self._retry(logging.WARNING)
        while True:
            started = loop.time()
            try:
                await self._watch_once(self._version)
                failed: Exception | None = None
            # Whatever broke, the watch must go on: a watcher that dies silently leaves
            # deleted slices unpublished for good.
            except Exception as exc:
                failed = exc
            if failed is not None:
                self._version = None
            if self._version is None:
                self._relist()
            retrying.ran(loop.time() - started)  # long enough to count as healthy
            self._count(retrying, failed)
            await asyncio.sleep(retrying.delay)

    async def _watch_once(self, since: str | None) -> None:
        """One watch from ``since`` (None: from now, after asking for a list) until the API
        server ends it; raises what broke it."""
        events = self._client.watch_slices(
            self.driver,
            self.node,
            since,
            on_open=self._relist if since is None else None,
            on_bookmark=self._seen,
        )
        # Closed at once when cancelled, so the connection does not wait for the GC.
        async with contextlib.aclosing(events):
            async for kind, obj in events:
                why = self._slices.foreign(kind, obj)
                if why is not None:
                    log.info(
                        "ResourceSlice %s %s; publishing the pool again",
                        obj["metadata"]["name"],
                        why,
                    )
                    self._relist()
                else:
                    self._slices.follow(kind, obj)
                self._seen(obj["metadata"].get("resourceVersion"))
                del obj  # not held while the watch waits (see watch_slices)

    def _seen(self, version: Any) -> None:
        if isinstance(version, str) and version:
            self._version = version

    def _count(self, retrying: Retry, failed: Exception | None) -> None:
        """Count a watch's end in ``retrying`` (its next wait) and log what broke it."""
        from cdi_gen.apiserver.errors import ApiServerError

        if failed is None:
            # The API server ended the watch: no failure, but watching again waits too.
            retrying.backoff.failed("")
        elif isinstance(failed, ApiServerError) and failed.status == 410:
            # Expected after a quiet spell longer than the API server keeps history.
            retrying.failed(
                describe(failed),
                "watching ResourceSlices of %(driver)s: version too old, listing again: %(error)s",
                level=logging.INFO,
                driver=self.driver,
                error=failed,
            )
        else:
            retrying.failed(
                describe(failed),
                "watching ResourceSlices of %(driver)s failed, watching again in "
                "%(delay).3gs: %(why)s",
                driver=self.driver,
                # A failure the client did not name (a bug here) keeps its traceback.
                exc_info=None if isinstance(failed, ApiServerError) else failed,
            )
