"""The node's container runtimes, and the cdiVersion each reads: the runtimes named, else
those on PATH, else (in a pod) the ones answering on a CRI socket; each spec file a runtime
would refuse for its ``cdiVersion`` is a FAIL naming the file and the runtime's limit, and
each file moving a network interface (``netDevices``) that the runtime's runc would ignore
is a FAIL naming the runc (a WARN when the runc is unknown)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from cdi_gen.cdi import runtimes as rt
from cdi_gen.cdi.registry import Registry
from cdi_gen.cdi.runtimes import Lookup, Runtime, net_devices_problem, readability_problems
from cdi_gen.doctor.check import Check
from cdi_gen.errors import ConfigError

if TYPE_CHECKING:
    from cdi_gen.cdi.spec import Spec

__all__ = ["check_runtimes", "find_runtimes"]


def check_runtimes(runtimes: Sequence[Runtime], reg: Registry) -> list[Check]:
    """Each runtime of the node, and every spec file in its folders it could not read.

    A runtime refuses a whole file whose ``cdiVersion`` is newer than its CDI library, and
    only when a container asks for one of its devices: FAIL here names the file, its version,
    the field that needs it and the runtime's limit, before a pod meets it. ``reg`` holds
    each parsed spec (``load_registry(..., keep_specs=True)``).
    """
    if not runtimes:
        return [
            Check(
                "WARN",
                "runtime",
                "no container runtime found (containerd, crio, podman on PATH): "
                "cannot tell which cdiVersion this node reads",
                "name it with --runtime NAME@VERSION, e.g. containerd@1.7.24",
            )
        ]
    checks: list[Check] = []
    for runtime in runtimes:
        if runtime.limit is None:
            checks.append(Check("FAIL", "runtime", runtime.describe(), f"upgrade {runtime.name}"))
            continue
        checks.append(Check("OK", "runtime", runtime.describe()))
        unreadable = 0
        for file in reg.files:
            if not file.loaded:
                continue  # already reported with the reason it does not load
            assert file.spec is not None, "check_runtimes reads a registry with its specs"
            for problem in readability_problems(file.spec, runtime):
                unreadable += 1
                checks.append(
                    Check(
                        "FAIL",
                        "cdiVersion",
                        f"{file.path}: {problem.message}: {runtime.name} refuses the whole "
                        "file when a container asks for one of its devices",
                        f"write it with cdiVersion <= {runtime.limit} (cdi-gen: "
                        f"--cdi-version runtime) or upgrade {runtime.name}",
                    )
                )
        checks += _net_device_checks(runtime, reg)
        readable = sum(1 for f in reg.files if f.loaded) - unreadable
        if not unreadable:
            checks.append(
                Check(
                    "OK",
                    "cdiVersion",
                    f"{readable} spec file(s) readable by {runtime.name} {runtime.version}",
                )
            )
    return checks


def _moves_interfaces(spec: Spec) -> bool:
    edits = [spec.container_edits, *(d.container_edits for d in spec.devices)]
    return any(e is not None and e.net_devices for e in edits)


def _net_device_checks(runtime: Runtime, reg: Registry) -> list[Check]:
    """A FAIL per spec file whose ``netDevices`` this runtime's runc would ignore (the pod
    starts without its interface, silently); one WARN when its runc is unknown."""
    files = [f for f in reg.files if f.loaded and f.spec is not None and _moves_interfaces(f.spec)]
    if not files:
        return []
    if runtime.runc is None:
        return [
            Check(
                "WARN",
                "netDevices",
                f"{len(files)} spec file(s) move network interfaces, and the runc under "
                f"{runtime.name} {runtime.version} is not known: runc applies netDevices "
                "from 1.4.0",
                f"name it: --runtime {runtime.name}@{runtime.version},runc@VERSION",
            )
        ]
    why = net_devices_problem(runtime)
    if why is None:
        shown = f"{runtime.name} {runtime.version} with runc {runtime.runc}"
        return [Check("OK", "netDevices", f"{shown} moves network interfaces")]
    return [
        Check("FAIL", "netDevices", f"{f.path}: {why}", "upgrade runc to 1.4.0 or newer")
        for f in files
    ]


def find_runtimes(
    refs: Sequence[str], containerd_version: str | None, fallback: Lookup | None = None
) -> tuple[list[Runtime], list[Check]]:
    """The node's runtimes: named ones, else every one on PATH asked for its version, else
    (in a pod, where no binary is visible) what ``fallback`` finds: the CRI sockets' answer."""
    checks: list[Check] = []
    if refs:
        found = [rt.parse_reference(ref) for ref in refs]
    else:
        found = []
        for name in rt.RUNTIMES:
            try:
                runtime = rt.detect(name)
            except ConfigError as exc:
                checks.append(Check("WARN", "runtime", str(exc), "pass --runtime NAME@VERSION"))
                continue
            if runtime is not None:
                found.append(runtime)
        if not found and containerd_version is None and fallback is not None:
            found, notes = fallback()
            checks += [
                Check("WARN", "runtime", note, "mount the runtime's CRI socket or pass --runtime")
                for note in notes
            ]
    if containerd_version is not None:
        try:
            rt.parse_release(containerd_version)
        except ValueError:
            raise ConfigError(
                f"--containerd-version: {containerd_version!r} is not X.Y.Z"
            ) from None
        found = [r for r in found if r.name != "containerd"]
        found.insert(0, rt.from_table("containerd", containerd_version))
    return found, checks
