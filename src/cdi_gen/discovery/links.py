"""A device's udev links (``DEVLINKS``): read from its record, matched against a path glob,
and the one link a template's ``{devlink}`` stands for.

Links are what people copy from ``ls -l /dev/serial/by-id`` into a config, so a ``devnode``
pattern is tried on them too (:func:`cdi_gen.discovery.match.devnode_match`). They are
matched as a shell matches a path, one ``/``-separated component at a time (``*`` never
crosses a ``/``): a pattern written for device nodes reaches a device through a link only in
the folder it names (``/dev/s*`` never reaches /dev/serial/by-id/..., though ``/dev/c*``
does reach a /dev/cdrom link), and a link deeper down only when it spells out its folders.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from functools import lru_cache

from cdi_gen.model import DeviceRecord

__all__ = ["LINK_FOLDERS", "any_link_matches", "chosen_link", "device_links", "link_match"]

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


def _is_link(path: str) -> bool:
    # udev only ever makes links under /dev; anything else in a record (which a recording can
    # say) is no link of ours, and a ".." or empty component could name another file.
    return path.startswith("/dev/") and not _BAD_PART.intersection(path[5:].split("/"))


_BAD_PART = frozenset({"", ".", ".."})


def device_links(record: DeviceRecord) -> tuple[str, ...]:
    """The record's udev links, absolute paths under /dev, in DEVLINKS order.

    Only udevd's database has them: a record of the kernel source (raw uevents) has none.
    """
    raw = record.properties.get("DEVLINKS")
    return tuple(link for link in raw.split() if _is_link(link)) if raw else ()


def any_link_matches(pattern: str, record: DeviceRecord) -> bool:
    """Whether one of the record's links matches ``pattern`` (see :func:`link_match`)."""
    raw = record.properties.get("DEVLINKS")
    if not raw:
        return False
    # Matching runs for every record a rule sees: the cheap glob checks come before the
    # link's own check.
    alternatives = _path_glob(pattern)
    return any(_matches(alternatives, link) and _is_link(link) for link in raw.split())


#: One ``|`` alternative of a pattern: its literal start, its number of "/", and one
#: compiled fnmatch per path component.
_Alternative = tuple[str, int, tuple[re.Pattern[str], ...]]
#: The text before the first glob character (fnmatch has no escape character).
_LITERAL_START = re.compile(r"[^*?\[]*")


@lru_cache(maxsize=4096)
def _path_glob(pattern: str) -> tuple[_Alternative, ...]:
    # Per "|" alternative, as udev; the literal start and the count of "/" turn most links
    # away before any regex runs.
    out: list[_Alternative] = []
    for alternative in pattern.split("|"):
        start = _LITERAL_START.match(alternative)
        parts = alternative.split("/")
        out.append(
            (
                start.group() if start is not None else "",
                len(parts) - 1,
                tuple(re.compile(fnmatch.translate(part)) for part in parts),
            )
        )
    return tuple(out)


def link_match(pattern: str, link: str) -> bool:
    """Whether ``link`` matches ``pattern`` component by component (``*`` stops at ``/``)."""
    return _matches(_path_glob(pattern), link)


def _matches(alternatives: tuple[_Alternative, ...], link: str) -> bool:
    return any(
        link.startswith(start)
        and link.count("/") == slashes
        and all(g.match(p) for g, p in zip(globs, link.split("/"), strict=True))
        for start, slashes, globs in alternatives
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
