"""Semantic rules of a CDI spec, as the runtimes' CDI library applies them, plus the stricter
limits that keep a spec valid for every runtime (absolute paths, name lengths, no
one-character vendor/class).

The rules work on wire documents (plain dicts with camelCase keys, as pydantic or a builder
produced them) so the agent can judge one device at a time on its hot path. Every rule broken
is reported as a :class:`~cdi_gen.errors.Problem` with its path in the document
(``devices[1].containerEdits.env[0]``), so a user fixes a file in one pass. Paths are only
formatted when a problem is found.

Beyond the CDI library's rules, values that could make the runtime do something else than
the spec reads are refused: environment entries with control characters (a newline would
smuggle in a second variable such as ``LD_PRELOAD``, a NUL cuts the entry where C code reads
it), and paths with control characters, ``..`` components (a templated
``/var/lib/fw/{serial}`` must not become ``/etc``) or more bytes than the kernel resolves
(a component over NAME_MAX 255, a path over PATH_MAX 4095). Values are quoted truncated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cdi_gen import names
from cdi_gen.cdi.version import document_requirements, minimum_of, parse_version, problems_for
from cdi_gen.errors import InvalidNameError, Problem, quote

if TYPE_CHECKING:
    from cdi_gen.cdi.spec import Spec  # annotations only: the models are built on first use

HOOK_NAMES = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
DEVICE_NODE_TYPES = frozenset({"", "b", "c", "u", "p"})
_PERMISSIONS = frozenset("rwm")
_MAX_ANNOTATIONS_SIZE = 256 * 1024
#: Linux NAME_MAX and PATH_MAX (less the terminating NUL): longer paths cannot be opened.
MAX_PATH_COMPONENT = 255
MAX_PATH_BYTES = 4095
#: Tab is the one control character an environment value may reasonably hold.
_ENV_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_PATH_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
#: One pass over a path finds what needs a closer look: a control character or ``..``.
_PATH_SUSPECT_RE = re.compile(r"[\x00-\x1f\x7f]|(?:^|/)\.\.(?:/|$)")


def _env_problems(env: Sequence[str] | None, where: str) -> list[Problem]:
    if not env:
        return []
    problems = []
    for i, entry in enumerate(env):
        if entry.find("=") <= 0:
            problems.append(
                Problem(
                    f"{where}[{i}]",
                    f"invalid environment variable {quote(entry)}, should be KEY=VALUE",
                )
            )
        # isprintable() is the cheap test (most entries pass it); tab is allowed.
        elif not entry.isprintable() and (bad := _ENV_CONTROL_RE.search(entry)) is not None:
            problems.append(
                Problem(
                    f"{where}[{i}]",
                    f"invalid environment variable {quote(entry)}: control character "
                    f"{bad.group()!r} (a newline would add a variable, a NUL cut this one)",
                )
            )
    return problems


def _plain_path(value: str) -> bool:
    """Cheap test passed by almost every path: short, printable, no ``..`` at all."""
    return len(value) <= MAX_PATH_COMPONENT and ".." not in value and value.isprintable()


def _path_shape_problem(value: str, where: str, what: str) -> Problem | None:
    """Control characters, ``..`` components, or a length the kernel refuses."""
    if _plain_path(value):
        return None
    if len(value) > MAX_PATH_COMPONENT or _PATH_SUSPECT_RE.search(value):
        if (bad := _PATH_CONTROL_RE.search(value)) is not None:
            return Problem(where, f"{what} {quote(value)} has control character {bad.group()!r}")
        if ".." in value.split("/"):
            return Problem(
                where, f"{what} {quote(value)} has a '..' component (it could leave its folder)"
            )
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_PATH_BYTES:
            return Problem(
                where, f"{what} {quote(value)} is longer than {MAX_PATH_BYTES} bytes ({size})"
            )
        for part in value.split("/"):
            if len(part.encode("utf-8", "surrogatepass")) > MAX_PATH_COMPONENT:
                return Problem(
                    where,
                    f"{what} {quote(value)} has a component longer than {MAX_PATH_COMPONENT} bytes",
                )
    return None


def _path_problem(value: str, where: str, what: str) -> Problem | None:
    if value[:1] == "/":
        return _path_shape_problem(value, where, what)
    if not value:
        return Problem(where, f"{what} must not be empty")
    return Problem(where, f"{what} {quote(value)} should be an absolute path")


def _node_problems(node: Mapping[str, Any], at: str) -> list[Problem]:
    problems: list[Problem] = []
    if (p := _path_problem(node.get("path", ""), f"{at}.path", "device node path")) is not None:
        problems.append(p)
    host = node.get("hostPath")
    if host and (p := _path_problem(host, f"{at}.hostPath", "hostPath")) is not None:
        problems.append(p)
    kind = node.get("type")
    if kind and kind not in DEVICE_NODE_TYPES:
        problems.append(
            Problem(f"{at}.type", f"invalid device type {quote(kind)}, should be b, c, u or p")
        )
    perms = node.get("permissions")
    if perms and not _PERMISSIONS.issuperset(perms):
        problems.append(
            Problem(
                f"{at}.permissions",
                f"invalid permissions {quote(perms)}, should be a combination of r, w, m",
            )
        )
    return problems


def _hook_problems(hook: Mapping[str, Any], where: str) -> list[Problem]:
    problems: list[Problem] = []
    name = hook.get("hookName", "")
    if name not in HOOK_NAMES:
        problems.append(
            Problem(
                f"{where}.hookName",
                f"invalid hook name {quote(name)}, should be one of "
                + ", ".join(sorted(HOOK_NAMES)),
            )
        )
    if (p := _path_problem(hook.get("path", ""), f"{where}.path", "hook path")) is not None:
        problems.append(p)
    problems += _env_problems(hook.get("env"), f"{where}.env")
    timeout = hook.get("timeout")
    if timeout is not None and timeout <= 0:
        problems.append(Problem(f"{where}.timeout", f"invalid timeout {timeout}, should be > 0"))
    return problems


def edits_problems(edits: Mapping[str, Any], where: str) -> list[Problem]:
    """Problems of one wire ``containerEdits`` object found at ``where``."""
    problems = _env_problems(edits.get("env"), f"{where}.env")
    for i, node in enumerate(edits.get("deviceNodes") or ()):
        problems += _device_node_problems(node, f"{where}.deviceNodes[{i}]")
    for i, hook in enumerate(edits.get("hooks") or ()):
        problems += _hook_problems(hook, f"{where}.hooks[{i}]")
    for i, mount in enumerate(edits.get("mounts") or ()):
        problems += _mount_problems(mount, f"{where}.mounts[{i}]")
    problems += _net_device_problems(edits.get("netDevices") or (), f"{where}.netDevices")
    rdt = edits.get("intelRdt")
    if rdt is not None and rdt.get("closID") not in (None, "/"):
        clos = rdt["closID"]
        if len(clos) >= 4096 or clos in (".", "..") or "/" in clos or "\n" in clos:
            problems.append(Problem(f"{where}.intelRdt.closID", f"invalid closID {quote(clos)}"))
    return problems


def _device_node_problems(node: Mapping[str, Any], where: str) -> list[Problem]:
    # Fast path: a plain absolute node with no type/permissions needs no further look.
    if len(node) == 1 and (path := node.get("path", ""))[:1] == "/":
        if _plain_path(path):
            return []
        p = _path_shape_problem(path, f"{where}.path", "device node path")
        return [p] if p else []
    return _node_problems(node, where)


def _mount_problems(mount: Mapping[str, Any], where: str) -> list[Problem]:
    problems: list[Problem] = []
    host = mount.get("hostPath")
    if not host:
        problems.append(Problem(f"{where}.hostPath", "mount hostPath must not be empty"))
    # Not necessarily absolute: the source of a tmpfs or overlay mount is a word.
    elif p := _path_shape_problem(host, f"{where}.hostPath", "mount hostPath"):
        problems.append(p)
    if p := _path_problem(
        mount.get("containerPath", ""), f"{where}.containerPath", "containerPath"
    ):
        problems.append(p)
    return problems


def _net_device_problems(nets: Sequence[Mapping[str, Any]], where: str) -> list[Problem]:
    problems: list[Problem] = []
    seen_host: set[str] = set()
    seen_name: set[str] = set()
    for i, net in enumerate(nets):
        for field, seen in (("hostInterfaceName", seen_host), ("name", seen_name)):
            value = net.get(field, "")
            at = f"{where}[{i}].{field}"
            if not value:
                problems.append(Problem(at, f"{field} must not be empty"))
            elif (why := _interface_name_problem(value)) is not None:
                # Both ends are kernel interface names: the runtime renames the interface to
                # ``name`` in the pod and fails the container on a name the kernel refuses.
                problems.append(Problem(at, why))
            elif value in seen:
                problems.append(Problem(at, f"duplicate {field} {quote(value)}"))
            seen.add(value)
    return problems


def _interface_name_problem(value: str) -> str | None:
    try:
        names.validate_interface_name(value)
    except InvalidNameError as exc:
        return str(exc)
    return None


def _edits_empty(edits: Mapping[str, Any]) -> bool:
    return not any(
        value is not None and (value or key == "intelRdt") for key, value in edits.items()
    )


def annotation_problems(annotations: Mapping[str, str] | None, where: str) -> list[Problem]:
    """Annotation keys must be Kubernetes qualified names; total size ≤ 256 KiB."""
    problems: list[Problem] = []
    total = 0
    for key, value in (annotations or {}).items():
        total += len(key) + len(value)
        prefix, slash, name = key.lower().rpartition("/")
        ok = names.is_k8s_qualified_name(name) and (not slash or names.is_dns_subdomain(prefix))
        if not ok:
            problems.append(
                Problem(
                    f"{where}[{quote(key)}]",
                    f"invalid annotation key {quote(key)}, should be [prefix/]name "
                    "(DNS subdomain prefix, name of A-Z a-z 0-9 - _ . up to 63)",
                )
            )
    if total > _MAX_ANNOTATIONS_SIZE:
        problems.append(Problem(where, f"annotations total {total} bytes, limit 256 KiB"))
    return problems


def device_problems(device: Mapping[str, Any], where: str) -> list[Problem]:
    """Problems of one wire device object (name, annotations, non-empty edits)."""
    problems: list[Problem] = []
    name = device.get("name", "")
    try:
        names.validate_device_name(name)
    except InvalidNameError as exc:
        problems.append(Problem(f"{where}.name", str(exc)))
    if device.get("annotations"):
        problems += annotation_problems(device["annotations"], f"{where}.annotations")
    edits = device.get("containerEdits") or {}
    if _edits_empty(edits):
        problems.append(Problem(f"{where}.containerEdits", "invalid device, empty device edits"))
    problems += edits_problems(edits, f"{where}.containerEdits")
    return problems


def _declared_version_problems(doc: Mapping[str, Any]) -> list[Problem]:
    """The declared ``cdiVersion`` is known and allows every field the document uses."""
    declared = doc.get("cdiVersion", "")
    try:
        parse_version(declared)
    except ValueError as exc:
        return [Problem("cdiVersion", str(exc))]
    problems: list[Problem] = []
    reqs = list(document_requirements(doc))
    needed = minimum_of(reqs)
    if parse_version(declared) < parse_version(needed):
        problems.append(
            Problem(
                "cdiVersion",
                f"the spec version must be at least v{needed}, it is {quote(declared)}",
            )
        )
    problems += [p for p in problems_for(reqs, declared) if "only valid up to" in p.message]
    return problems


def check_document(doc: Mapping[str, Any], *, check_version: bool = True) -> list[Problem]:
    """Every semantic problem of a wire spec document; empty when a runtime would accept it.

    With ``check_version`` the declared ``cdiVersion`` must be known and at least the minimum
    the content needs (builders set it afterwards, so they pass False).
    """
    problems = _declared_version_problems(doc) if check_version else []
    try:
        names.parse_kind(doc.get("kind", ""))
    except InvalidNameError as exc:
        problems.append(Problem("kind", str(exc)))
    if doc.get("annotations"):
        problems += annotation_problems(doc["annotations"], "annotations")
    devices = doc.get("devices") or ()
    if not devices:
        problems.append(Problem("devices", "invalid spec, no devices"))
    seen: set[str] = set()
    for i, device in enumerate(devices):
        problems += device_problems(device, f"devices[{i}]")
        name = device.get("name", "")
        if name in seen:
            problems.append(
                Problem(f"devices[{i}].name", f"invalid spec, multiple device {quote(name)}")
            )
        seen.add(name)
    if doc.get("containerEdits") is not None:
        problems += edits_problems(doc["containerEdits"], "containerEdits")
    return problems


def check_spec(spec: Spec, *, check_version: bool = True) -> list[Problem]:
    """Every semantic problem of ``spec`` (see :func:`check_document`)."""
    return check_document(spec.to_wire(), check_version=check_version)
