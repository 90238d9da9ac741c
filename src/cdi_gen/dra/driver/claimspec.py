"""A DRA claim's own CDI spec: its class's devices with the claim's configuration applied (pure).

A claim whose configuration (:mod:`cdi_gen.dra.driver.claimconfig`) selects some of its devices
gets, per class, a transient spec ``<vendor>-<class>@<tag>.json`` holding one device per
configured device: the class device's edits with every device node's ``uid``, ``gid``,
``fileMode`` and ``permissions`` set from the configuration and its environment variables
added (replacing the class's of the same name). The kubelet is answered with those devices'
names, so only that claim's containers get them; the class's spec stays as it is for every
other claim. The spec's ``cdiVersion`` is the class spec's: nothing the configuration sets
needs a newer one, and a class pinned for its runtime stays readable by it.

A claim never gets more than its class grants. The configuration comes in two layers
(:class:`~cdi_gen.dra.driver.claimconfig.Layered`): the DeviceClass's entries are the admin's and
may set anything; the claim's own are checked, per device node, against what the class's spec
with the DeviceClass's layer gives (:func:`widening`): cgroup ``permissions`` only a subset of
the class's (``rwm`` when it sets none), and owner, group and mode only such that no user or
group in the container gets more of ``rwx`` than it had. An unset ``uid``/``gid`` is the
container's own user and group (the CDI library gives the node the process's IDs), so a class
that sets no owner lets a claim give the node to its pod's user with at most the owner bits;
an unset ``fileMode`` is the host node's mode, read when the claim sets owner or mode.

The devices are named ``claim-<tag>-<n>``, the claim's tag and the device's place among the
claim's devices (a letter first: a name starting with a digit needs cdiVersion 0.5.0): unique
on the node (two specs of one kind must never define one name, or the
runtime drops both), within the CDI length limit whatever the device's own name, and stable
for a claim prepared again.

A request none of whose devices is configured still gets its device metadata file
(KEP-5304): its first device carries one more CDI device, ``claim-<tag>-<n>-metadata``, from
the claim's metadata spec ``<vendor>-<class>@<tag>.metadata.json`` (:func:`metadata_spec`),
which holds only the file's mount.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.dra.driver.claimconfig import DeviceConfig, Layered
from cdi_gen.errors import Problem, SpecError, quote

__all__ = [
    "MAX_PLAIN_TAG",
    "HostMode",
    "Widening",
    "claim_device_name",
    "claim_spec",
    "claim_tag",
    "configured_edits",
    "device_index",
    "metadata_device_name",
    "metadata_spec",
    "metadata_tag",
    "widening",
]

#: Longest claim UID used as it is in names; a longer one (the kubelet allows 128) is hashed,
#: so that ``claim-<tag>-<n>`` stays within the 63 characters of a CDI device name.
MAX_PLAIN_TAG = 48


def claim_tag(uid: str) -> str:
    """The claim's part of its spec's and devices' names: its UID (a Kubernetes UUID), or a
    hash of it when it is longer than :data:`MAX_PLAIN_TAG`."""
    if len(uid) <= MAX_PLAIN_TAG:
        return uid
    return "h" + hashlib.sha256(uid.encode()).hexdigest()[:40]


def claim_device_name(uid: str, index: int) -> str:
    """The name of the claim's ``index``-th device in its own spec."""
    return f"claim-{claim_tag(uid)}-{index}"


def metadata_tag(uid: str) -> str:
    """The transient ID of the claim's metadata spec (beside its configured spec's
    :func:`claim_tag`, never equal to one: a tag holds no ``.``)."""
    return f"{claim_tag(uid)}.metadata"


def metadata_device_name(uid: str, index: int) -> str:
    """The name of the device, in the claim's metadata spec, that the claim's ``index``-th
    device carries to mount its request's metadata file."""
    return f"{claim_device_name(uid, index)}-metadata"


def metadata_spec(kind: str, mounts: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """The wire spec document of a claim's devices of ``kind`` that carry only their
    request's metadata mounts (``mounts`` by device name): nothing of the class's edits,
    which the class's own device already brings. Raises
    :class:`~cdi_gen.errors.SpecError` when the result is not a valid spec."""
    entries = [
        build_entry(name, {"mounts": [dict(m) for m in found]}) for name, found in mounts.items()
    ]
    return assemble(kind, entries)


#: The host node's permission bits at ``path``, or None when it cannot be read.
HostMode = Callable[[str], int | None]


class Widening(ValueError):  # noqa: N818 - a refusal, like files.FileRefused
    """A claim's configuration that would give more access than its class; the message
    names the field, the class's value and the claim's."""


def _apply(nodes: list[dict[str, Any]], config: DeviceConfig | None) -> list[dict[str, Any]]:
    if config is None or config.device_nodes is None:
        return nodes
    fields = config.device_nodes.model_dump(by_alias=True, exclude_none=True)
    return [{**node, **fields} for node in nodes]


def _rwx(bits: int) -> str:
    return "".join(c if bits & b else "-" for c, b in zip("rwx", (4, 2, 1), strict=True))


def _mode_of(node: Mapping[str, Any]) -> str:
    return "fileMode" if "fileMode" in node else "host node's mode"


def _owner(node: Mapping[str, Any], mode: int) -> str:
    def who(key: str, unset: str) -> str:
        value = node.get(key)
        return unset if value is None else f"{key} {value}"

    return (
        f"{who('uid', 'the container user')}, {who('gid', 'its group')}, {_mode_of(node)} {mode:#o}"
    )


def _access(uid: int | None, gid: int | None, mode: int, user: int | None, member: set[int]) -> int:
    """The ``rwx`` bits a process of ``user`` in groups ``member`` gets on a node: an unset
    owner or group is the process's own."""
    if uid is None or uid == user:
        return (mode >> 6) & 7
    if gid is None or gid in member:
        return (mode >> 3) & 7
    return mode & 7


def widening(
    granted: Mapping[str, Any], wanted: Mapping[str, Any], host_mode: Callable[[], int | None]
) -> str:
    """Why the device node ``wanted`` (the wire node with the claim's fields) gives more than
    ``granted`` (the node as its class gives it), or ``""`` when it does not.

    ``host_mode`` gives the host node's permission bits, the mode of a node whose spec sets
    none; it is asked only when that is needed (the claim sets owner or mode and the class
    sets no mode): reading it is a stat of the host's node. The claim's mode may only clear
    bits of the class's. A new owner or group is then checked against every kind of process
    the container may run: the owner of either node, a member of either group, anyone else;
    an unset ``uid`` (``gid``) is the process's own (the CDI library fills it in), so the
    process is always owner (in group).
    """
    have, want = granted.get("permissions") or "rwm", wanted.get("permissions") or "rwm"
    if not set(want) <= set(have):
        return f"permissions {quote(want)} widens the class's {quote(have)}"
    if all(granted.get(k) == wanted.get(k) for k in ("uid", "gid", "fileMode")):
        return ""
    return _wider_owner(granted, wanted, host_mode)


def _wider_owner(
    granted: Mapping[str, Any], wanted: Mapping[str, Any], host_mode: Callable[[], int | None]
) -> str:
    m0 = granted["fileMode"] if "fileMode" in granted else host_mode()
    m1 = wanted.get("fileMode", m0)
    if m0 is None or m1 is None:
        return "fileMode: the host node's mode cannot be read, so what the class grants is unknown"
    if m1 & ~m0:
        return (
            f"fileMode {m1:#o} sets bits {m1 & ~m0:#o} that the class's {_mode_of(granted)} "
            f"{m0:#o} does not"
        )
    u0, u1, g0, g1 = granted.get("uid"), wanted.get("uid"), granted.get("gid"), wanted.get("gid")
    users: list[int | None] = [u for u in dict.fromkeys((u0, u1)) if u is not None]
    users.append(None)  # someone who owns neither
    groups = [g for g in dict.fromkeys((g0, g1)) if g is not None]

    for user in users:
        for flags in itertools.product((False, True), repeat=len(groups)):
            member = {g for g, on in zip(groups, flags, strict=True) if on}
            before = _access(u0, g0, m0, user, member)
            after = _access(u1, g1, m1, user, member)
            if after & ~before:
                who = "anyone else" if user is None else f"uid {user}"
                if member:
                    who += f" in gid {', '.join(map(str, sorted(member)))}"
                return (
                    f"{_owner(wanted, m1)} would give {who} {_rwx(after)} where the class "
                    f"({_owner(granted, m0)}) gives {_rwx(before)}"
                )
    return ""


def configured_edits(
    edits: Mapping[str, Any], config: Layered, host_mode: HostMode | None = None
) -> dict[str, Any]:
    """A copy of the wire ``containerEdits`` with ``config`` applied: the class's layer, then
    the claim's, each layer's device node fields on every device node, its environment
    variables replacing those of the same name. Raises :class:`Widening` naming the node when
    the claim's layer would widen what the class's spec with the class's layer grants;
    ``host_mode`` reads a node's mode where its spec sets none."""
    out = copy.deepcopy(dict(edits))
    nodes = _apply(list(out.get("deviceNodes") or []), config.from_class)
    wanted = _apply(nodes, config.from_claim)
    if config.from_claim is not None and config.from_claim.device_nodes is not None:
        read = host_mode or (lambda _: None)
        for granted, node in zip(nodes, wanted, strict=True):
            path = str(granted.get("path"))
            host = str(granted.get("hostPath") or path)
            why = widening(granted, node, lambda: read(host))  # noqa: B023 - called at once
            if why:
                raise Widening(f"device node {quote(path)}: {why}")
    if "deviceNodes" in out:
        out["deviceNodes"] = wanted
    for layer in (config.from_class, config.from_claim):
        if layer is not None and layer.env:
            kept = [e for e in out.get("env") or [] if e.partition("=")[0] not in layer.env]
            out["env"] = kept + [f"{name}={value}" for name, value in layer.env.items()]
    return out


def device_index(class_spec: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The class spec's wire devices by name (a caller keeping the spec keeps this too)."""
    return {
        d["name"]: d
        for d in class_spec.get("devices") or []
        if isinstance(d, Mapping) and isinstance(d.get("name"), str)
    }


def claim_spec(
    class_spec: Mapping[str, Any],
    devices: Sequence[tuple[str, str, Layered]],
    mounts: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    *,
    index: Mapping[str, Mapping[str, Any]] | None = None,
    host_mode: HostMode | None = None,
) -> dict[str, Any]:
    """The wire spec document of one claim's configured devices of one class.

    ``class_spec`` is the class's spec document as written; ``devices`` holds, per configured
    device, the class device's name, its name in the claim's spec and its configuration;
    ``mounts`` wire mounts to add, by the device's name in the claim's spec (the device
    metadata files); ``index`` the class spec's :func:`device_index`, when kept;
    ``host_mode`` as for :func:`configured_edits`.
    Raises :class:`~cdi_gen.errors.SpecError` naming the device when the class spec does not
    hold it (it left the spec since the pool was read) or the result is not a valid spec, and
    :class:`Widening` naming the device when the claim asks for more than its class grants.
    """
    kind = class_spec.get("kind")
    by_name = device_index(class_spec) if index is None else index
    entries = []
    for device, name, config in devices:
        found = by_name.get(device)
        if found is None:
            why = "not in the class's spec (removed since the claim was allocated?)"
            raise SpecError([Problem(f"devices[{quote(device)}]", why)], str(kind))
        if name in by_name:
            why = f"the claim's device name {quote(name)} is taken by the class's spec"
            raise SpecError([Problem(f"devices[{quote(device)}]", why)], str(kind))
        try:
            edits = configured_edits(found.get("containerEdits") or {}, config, host_mode)
        except Widening as exc:
            raise Widening(f"device {quote(device)}: {exc}") from None
        extra = (mounts or {}).get(name)
        if extra:
            edits["mounts"] = [*(edits.get("mounts") or []), *map(dict, extra)]
        entries.append(build_entry(name, edits))
    doc = assemble(str(kind), entries, target_version=class_spec.get("cdiVersion"))
    if class_spec.get("containerEdits"):
        # Injected with any device of the class: a device of the claim's spec too.
        doc["containerEdits"] = copy.deepcopy(class_spec["containerEdits"])
    return doc
