"""Matching udev records against class rules, the health check of a matched record, and
the hint for a link pattern that matched nothing.

Matching follows udev: ``subsystem`` is exact, the other keys are shell globs where ``|``
separates alternatives; ``driver`` matches the device or any parent (DRIVERS); all
``parentAttributes`` of a rule must hold on one device of the chain, the device itself
included (ATTRS). A class's ``health`` check uses the same attribute semantics. One key
goes beyond udev's DEVNAME: ``devnode`` also tries the device's udev links (DEVLINKS, see
:mod:`cdi_gen.discovery.links`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache

from cdi_gen.config.models import ClassConfig
from cdi_gen.config.rules import HealthConfig, MatchRule
from cdi_gen.discovery.links import LINK_FOLDERS, any_link_matches, device_links, link_match
from cdi_gen.errors import quote
from cdi_gen.model import (
    NET_SUBSYSTEM,
    DeviceRecord,
)


@lru_cache(maxsize=4096)
def _glob(pattern: str) -> re.Pattern[str]:
    # udev globs: fnmatch plus "|" alternatives.
    return re.compile("|".join(fnmatch.translate(p) for p in pattern.split("|")))


def glob_match(pattern: str, value: str | None) -> bool:
    """udev glob semantics; a missing value never matches."""
    return value is not None and _glob(pattern).match(value) is not None


def _attrs_match(wanted: Mapping[str, str], have: Mapping[str, str]) -> bool:
    # udev compares sysfs values with trailing whitespace removed.
    return all(glob_match(g, sysfs_value(have.get(k))) for k, g in wanted.items())


def sysfs_value(value: str | None) -> str | None:
    return value.rstrip() if value is not None else None


def matches(rule: MatchRule, record: DeviceRecord) -> bool:
    """Whether ``record`` satisfies every condition of ``rule`` (cheapest checks first)."""
    return (
        (rule.subsystem is None or record.subsystem == rule.subsystem)
        and (rule.kernel is None or glob_match(rule.kernel, record.sys_name))
        and (rule.devnode is None or devnode_match(rule.devnode, record))
        and (rule.driver is None or any(glob_match(rule.driver, d) for d in record.drivers))
        and all(glob_match(g, record.properties.get(k)) for k, g in rule.properties.items())
        and (not rule.attributes or _attrs_match(rule.attributes, record.attributes))
        and (not rule.parent_attributes or _chain_match(rule.parent_attributes, record))
    )


def devnode_match(pattern: str, record: DeviceRecord) -> bool:
    """Whether ``pattern`` matches the device node (udev's DEVNAME glob) or one of its links.

    The one ``devnode`` key rather than a separate key for links (udev's SYMLINK): the path a
    user copies from /dev/serial/by-id or /dev/disk/by-id names the node as surely as DEVNAME
    does, it is what they write first, and a second key would leave that first try matching
    nothing. Links are matched one path component at a time, so a pattern reaches a device
    through a link only by spelling out the link's folders (``/dev/s*`` never reaches
    /dev/serial/by-id/...): what a node pattern matched before, it matches still.
    """
    return glob_match(pattern, record.devnode) or any_link_matches(pattern, record)


def _chain_match(wanted: Mapping[str, str], record: DeviceRecord) -> bool:
    # ATTRS: every attribute on one device of the chain, the device itself included.
    chain = [record.attributes, *(p.attributes for p in record.parents)]
    return any(_attrs_match(wanted, attrs) for attrs in chain)


def is_healthy(health: HealthConfig | None, record: DeviceRecord) -> bool:
    """Whether ``record`` is a healthy member of its device: its node exists (a network
    interface has none: present is enough) and it passes
    the class's health check (:class:`~cdi_gen.config.rules.HealthConfig`), if any."""
    if record.devnode is not None and not record.node_exists:
        return False
    if health is None:
        return True
    if health.attributes and not _attrs_match(health.attributes, record.attributes):
        return False
    return not health.parent_attributes or _chain_match(health.parent_attributes, record)


def match_record(cls: ClassConfig, record: DeviceRecord) -> int | None:
    """Index of the first rule of ``cls`` that ``record`` satisfies, or None.

    Only devices with a device node can be handed to a container, so only they match; and
    network interfaces (no node: the runtime moves them by name, ``netDevices``), but only
    rules that name ``subsystem: net`` take them, so that a rule written for nodes never
    starts moving a node's network interface out of the host.
    """
    if not record.devnode and record.subsystem != NET_SUBSYSTEM:
        return None
    for i, rule in enumerate(cls.match):
        if (record.devnode or rule.subsystem == NET_SUBSYSTEM) and matches(rule, record):
            return i
    return None


def could_match(rule: MatchRule, subsystem: str, sys_name: str) -> bool:
    return (rule.subsystem is None or rule.subsystem == subsystem) and (
        rule.kernel is None or glob_match(rule.kernel, sys_name)
    )


def link_hints(cls: ClassConfig, records: Iterable[DeviceRecord]) -> list[str]:
    """One line for each rule of ``cls`` whose ``devnode`` pattern names a udev link and
    that matched none of ``records``: why, as far as the records tell.

    A pattern names a link when it lies in a folder of links (:data:`LINK_FOLDERS`) or when,
    with ``*`` crossing ``/`` as in DEVNAME, it matches some record's link.
    """
    recs = [r for r in records if r.devnode]
    hints = []
    for rule in cls.match:
        pattern = rule.devnode
        if pattern is None:
            continue
        near = [r for r in recs if could_match(rule, r.subsystem, r.sys_name)]
        if any(matches(rule, r) for r in near):
            continue
        links = sorted({link for r in near for link in device_links(r)})
        matched = [link for link in links if link_match(pattern, link)]
        crossed = [link for link in links if glob_match(pattern, link)]
        in_folder = any(p.startswith(LINK_FOLDERS) for p in pattern.split("|"))
        if not (in_folder or crossed):
            continue
        if matched:
            why = f"the device of link {quote(matched[0])} fails the rule's other conditions"
        elif crossed:
            why = (
                f"it matches link {quote(crossed[0])} only if '*' crosses '/': in a link "
                "path each '*' stays within one folder, so write one per level"
            )
        elif not links:
            why = (
                "no device read here has udev links (DEVLINKS come from udevd's database: "
                "is /run/udev mounted? the kernel source has none)"
            )
        else:
            folder = pattern.split("|")[0].rsplit("/", 1)[0] + "/"
            seen = [link for link in links if link.startswith(folder)] or links
            why = "no link of the devices read matches it; links seen: " + ", ".join(
                quote(link) for link in seen[:3]
            )
            if len(seen) > 3:
                why += f" and {len(seen) - 3} more"
        hints.append(
            f"class {cls.name!r}: devnode {quote(pattern)} (rule {rule.describe()}) names "
            f"a udev link, and {why}"
        )
    return hints
