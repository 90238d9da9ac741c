"""A device's udev links (``DEVLINKS``): read from its record, matched against a path glob,
and the one link a template's ``{devlink}`` stands for.

Links are what people copy from ``ls -l /dev/serial/by-id`` into a config, so a ``devnode``
pattern is tried on them too (:func:`cdi_gen.discovery.match.matches`). They are matched as
a shell matches a path, one ``/``-separated component at a time (``*`` never crosses a
``/``): a pattern written for device nodes (``/dev/s*``, ``/dev/*``) keeps matching only the
nodes it always matched, and only a pattern that spells out a link's folders reaches it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from functools import lru_cache

from cdi_gen.model import DeviceRecord

__all__ = ["LINK_FOLDERS", "chosen_link", "device_links", "link_match"]

#: Folders under /dev whose entries udev's stock rules make as links, never as device nodes.
#: A pattern under one of them can only mean a link.
LINK_FOLDERS = (
    "/dev/serial/",
    "/dev/disk/by-",
    "/dev/input/by-",
    "/dev/v4l/by-",
    "/dev/snd/by-",
    "/dev/dri/by-",
    "/dev/mapper/",
)


@lru_cache(maxsize=4096)
def _links(raw: str) -> tuple[str, ...]:
    # udev only ever makes links under /dev; anything else in a record (which a recording can
    # say) is no link of ours, and a ".." or empty component could name another file.
    return tuple(
        link
        for link in raw.split()
        if link.startswith("/dev/")
        and all(part not in ("", ".", "..") for part in link[5:].split("/"))
    )


def device_links(record: DeviceRecord) -> tuple[str, ...]:
    """The record's udev links, absolute paths under /dev, in DEVLINKS order.

    Only udevd's database has them: a record of the kernel source (raw uevents) has none.
    """
    raw = record.properties.get("DEVLINKS")
    return _links(raw) if raw else ()


@lru_cache(maxsize=4096)
def _path_glob(pattern: str) -> tuple[tuple[re.Pattern[str], ...], ...]:
    # Per "|" alternative (as udev), one fnmatch per path component.
    return tuple(
        tuple(re.compile(fnmatch.translate(part)) for part in alternative.split("/"))
        for alternative in pattern.split("|")
    )


def link_match(pattern: str, link: str) -> bool:
    """Whether ``link`` matches ``pattern`` component by component (``*`` stops at ``/``)."""
    parts = link.split("/")
    return any(
        len(globs) == len(parts) and all(g.match(p) for g, p in zip(globs, parts, strict=True))
        for globs in _path_glob(pattern)
    )


def _preferred(links: Iterable[str]) -> str | None:
    # DEVLINKS' order is udevd's and may differ between two events of one device, so the
    # choice is by name: a by-id link names the hardware (vendor, model, serial), a by-path
    # link the port; either outlives a replug that renumbers the kernel name.
    def rank(link: str) -> tuple[int, str]:
        folder = link.rsplit("/", 2)[-2] if link.count("/") > 2 else ""
        return ({"by-id": 0, "by-path": 1}.get(folder, 2), link)

    return min(links, key=rank, default=None)


def chosen_link(record: DeviceRecord, pattern: str | None) -> str | None:
    """The link ``{devlink}`` stands for: the one the rule's ``devnode`` ``pattern`` matched,
    else (the rule matched the node itself, or has no pattern) the device's by-id link, else
    its by-path link, else its first link by name; None when it has none."""
    links = device_links(record)
    if pattern is not None:
        matched = [link for link in links if link_match(pattern, link)]
        if matched:
            return _preferred(matched)
    return _preferred(links)
