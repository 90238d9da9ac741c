"""What the fleet benchmark measures from outside: watches stamped on arrival, API server metrics,
a process's CPU and memory from /proc.

:class:`Stamps` follows one collection (pods, or ResourceClaims) through one watch read by a
thread, stamping with ``time.monotonic()`` when each object was first seen and when it first
met a condition (a pod scheduled, a claim allocated): the latencies have no polling step.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import _cluster  # noqa: F401  (puts tests/ on sys.path)
from cluster.api import Api, ApiError, Obj

_TICK = os.sysconf("SC_CLK_TCK")
_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} ([0-9.e+-]+)$", re.MULTILINE)


class Stamps:
    """First-seen and first-done times of the objects of one collection, by name."""

    def __init__(self, api: Api, path: str, done: Callable[[Obj], bool], selector: str) -> None:
        self._api = api
        self._path = path
        self._done = done
        self._selector = selector
        self.seen: dict[str, float] = {}
        self.finished: dict[str, float] = {}
        self.error: str | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._version = ""
        self._thread = threading.Thread(target=self._run, name=f"watch {path}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # A watch the API server ends is resumed from the last resourceVersion seen.
        while not self._stopped:
            params = {"labelSelector": self._selector, "allowWatchBookmarks": "true"}
            if self._version:
                params["resourceVersion"] = self._version
            try:
                for event in self._api.watch(self._path, 3600, **params):
                    self._event(event, time.monotonic())
            except (OSError, ValueError, ApiError) as exc:
                if not self._stopped:
                    self.error = f"watch of {self._path} failed: {exc}"
                return

    def _event(self, event: Obj, stamp: float) -> None:
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self._version = meta["resourceVersion"]
        if event.get("type") not in ("ADDED", "MODIFIED"):
            return
        name = meta.get("name", "")
        with self._lock:
            self.seen.setdefault(name, stamp)
            if name not in self.finished and self._done(obj):
                self.finished[name] = stamp

    def stop(self) -> None:
        # The thread ends with the cluster's API server closing the connection.
        self._stopped = True

    def latencies(self, names: set[str] | None = None) -> list[float]:
        """Seconds from first seen to done, of the done objects (of ``names`` only)."""
        with self._lock:
            return [
                self.finished[n] - self.seen[n]
                for n in self.finished
                if n in self.seen and (names is None or n in names)
            ]

    def count_done(self, names: set[str]) -> int:
        with self._lock:
            return sum(1 for n in names if n in self.finished)


def scheduled(pod: Obj) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def allocated(claim: Obj) -> bool:
    return bool((claim.get("status") or {}).get("allocation"))


def metric_sums(text: str, names: tuple[str, ...], label: str) -> dict[str, float]:
    """Per metric name (and its ``verb`` or ``result`` when it has one), the sum of its
    samples whose labels contain ``label`` (e.g. ``resource="resourceslices"``)."""
    out: dict[str, float] = {}
    for name, labels, value in _SAMPLE.findall(text):
        if name not in names or label not in labels:
            continue
        verb = re.search(r'(?:verb|result)="(\w+)"', labels)
        key = f"{name}:{verb.group(1)}" if verb else name
        out[key] = out.get(key, 0.0) + float(value)
    return out


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
