"""Semantic rules of a CDI spec, as the runtimes' CDI library applies them, plus the stricter
limits that keep a spec valid for every runtime (absolute paths, name lengths, no
one-character vendor/class).

Every rule broken is reported as a :class:`~cdi_gen.errors.Problem` with its path in the
document (``devices[1].containerEdits.env[0]``), so a user fixes a file in one pass.
"""

from __future__ import annotations

import re

from cdi_gen import names
from cdi_gen.errors import InvalidNameError, Problem
from cdi_gen.spec import ContainerEdits, Hook, Spec
from cdi_gen.version import minimum_version, parse_version, version_problems

HOOK_NAMES = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
DEVICE_NODE_TYPES = frozenset({"b", "c", "u", "p"})
_ANNOTATION_PREFIX_RE = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_ANNOTATION_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_MAX_ANNOTATIONS_SIZE = 256 * 1024


def _env_problems(env: list[str] | None, where: str) -> list[Problem]:
    return [
        Problem(f"{where}[{i}]", f"invalid environment variable {entry!r}, should be KEY=VALUE")
        for i, entry in enumerate(env or ())
        if entry.find("=") <= 0
    ]


def _path_problem(value: str, where: str, what: str) -> Problem | None:
    if not value:
        return Problem(where, f"{what} must not be empty")
    if not value.startswith("/"):
        return Problem(where, f"{what} {value!r} should be an absolute path")
    return None


def _hook_problems(hook: Hook, where: str) -> list[Problem]:
    problems: list[Problem] = []
    if hook.hook_name not in HOOK_NAMES:
        problems.append(
            Problem(
                f"{where}.hookName",
                f"invalid hook name {hook.hook_name!r}, should be one of "
                + ", ".join(sorted(HOOK_NAMES)),
            )
        )
    if (p := _path_problem(hook.path, f"{where}.path", "hook path")) is not None:
        problems.append(p)
    problems += _env_problems(hook.env, f"{where}.env")
    if hook.timeout is not None and hook.timeout <= 0:
        problems.append(
            Problem(f"{where}.timeout", f"invalid timeout {hook.timeout}, should be > 0")
        )
    return problems


def edits_problems(edits: ContainerEdits, where: str) -> list[Problem]:
    """Problems of one ``containerEdits`` object found at ``where``."""
    problems = _env_problems(edits.env, f"{where}.env")
    for i, node in enumerate(edits.device_nodes or ()):
        at = f"{where}.deviceNodes[{i}]"
        if (p := _path_problem(node.path, f"{at}.path", "device node path")) is not None:
            problems.append(p)
        if node.host_path and (p := _path_problem(node.host_path, f"{at}.hostPath", "hostPath")):
            problems.append(p)
        if node.type and node.type not in DEVICE_NODE_TYPES:
            problems.append(
                Problem(f"{at}.type", f"invalid device type {node.type!r}, should be b, c, u or p")
            )
        if node.permissions and set(node.permissions) - set("rwm"):
            problems.append(
                Problem(
                    f"{at}.permissions",
                    f"invalid permissions {node.permissions!r}, should be a combination of r, w, m",
                )
            )
    for i, hook in enumerate(edits.hooks or ()):
        problems += _hook_problems(hook, f"{where}.hooks[{i}]")
    for i, mount in enumerate(edits.mounts or ()):
        at = f"{where}.mounts[{i}]"
        if not mount.host_path:
            problems.append(Problem(f"{at}.hostPath", "mount hostPath must not be empty"))
        if p := _path_problem(mount.container_path, f"{at}.containerPath", "containerPath"):
            problems.append(p)
    seen_host: set[str] = set()
    seen_name: set[str] = set()
    for i, net in enumerate(edits.net_devices or ()):
        at = f"{where}.netDevices[{i}]"
        for field, value, seen in (
            ("hostInterfaceName", net.host_interface_name, seen_host),
            ("name", net.name, seen_name),
        ):
            if not value:
                problems.append(Problem(f"{at}.{field}", f"{field} must not be empty"))
            elif value in seen:
                problems.append(Problem(f"{at}.{field}", f"duplicate {field} {value!r}"))
            seen.add(value)
    rdt = edits.intel_rdt
    if rdt is not None and rdt.clos_id not in (None, "/"):
        clos = rdt.clos_id or ""
        if len(clos) >= 4096 or clos in (".", "..") or "/" in clos or "\n" in clos:
            problems.append(Problem(f"{where}.intelRdt.closID", f"invalid closID {clos!r}"))
    return problems


def annotation_problems(annotations: dict[str, str] | None, where: str) -> list[Problem]:
    """Annotation keys must be Kubernetes qualified names; total size ≤ 256 KiB."""
    problems: list[Problem] = []
    total = 0
    for key, value in (annotations or {}).items():
        total += len(key) + len(value)
        prefix, slash, name = key.lower().rpartition("/")
        ok = bool(_ANNOTATION_NAME_RE.fullmatch(name)) and len(name) <= names.MAX_SEGMENT_LEN
        if slash:
            ok = ok and bool(_ANNOTATION_PREFIX_RE.fullmatch(prefix)) and len(prefix) <= 253
        if not ok:
            problems.append(
                Problem(
                    f"{where}[{key!r}]",
                    f"invalid annotation key {key!r}, should be [prefix/]name "
                    "(DNS subdomain prefix, name of A-Z a-z 0-9 - _ . ≤ 63)",
                )
            )
    if total > _MAX_ANNOTATIONS_SIZE:
        problems.append(Problem(where, f"annotations total {total} bytes, limit 256 KiB"))
    return problems


def check_spec(spec: Spec, *, check_version: bool = True) -> list[Problem]:
    """Every semantic problem of ``spec``; empty when a runtime would accept it.

    With ``check_version`` the declared ``cdiVersion`` must be known and at least the minimum
    the content needs (builders set it afterwards, so they pass False).
    """
    problems: list[Problem] = []
    if check_version:
        try:
            parse_version(spec.cdi_version)
        except ValueError as exc:
            problems.append(Problem("cdiVersion", str(exc)))
        else:
            needed = minimum_version(spec)
            if parse_version(spec.cdi_version) < parse_version(needed):
                problems.append(
                    Problem(
                        "cdiVersion",
                        f"the spec version must be at least v{needed}, it is {spec.cdi_version!r}",
                    )
                )
            problems += [
                p
                for p in version_problems(spec, spec.cdi_version)
                if "only valid up to" in p.message
            ]
    try:
        names.parse_kind(spec.kind)
    except InvalidNameError as exc:
        problems.append(Problem("kind", str(exc)))
    problems += annotation_problems(spec.annotations, "annotations")
    if not spec.devices:
        problems.append(Problem("devices", "invalid spec, no devices"))
    seen: set[str] = set()
    for i, device in enumerate(spec.devices):
        at = f"devices[{i}]"
        try:
            names.validate_device_name(device.name)
        except InvalidNameError as exc:
            problems.append(Problem(f"{at}.name", str(exc)))
        if device.name in seen:
            problems.append(Problem(f"{at}.name", f"invalid spec, multiple device {device.name!r}"))
        seen.add(device.name)
        problems += annotation_problems(device.annotations, f"{at}.annotations")
        if device.container_edits.is_empty():
            problems.append(Problem(f"{at}.containerEdits", "invalid device, empty device edits"))
        problems += edits_problems(device.container_edits, f"{at}.containerEdits")
    if spec.container_edits is not None:
        problems += edits_problems(spec.container_edits, "containerEdits")
    return problems
