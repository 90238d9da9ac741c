"""The spec folders as a runtime sees them: each present and world-readable, the files a
runtime would skip (or crash on), ours world-readable, names shadowed by another file."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path

from cdi_gen.cdi.registry import Registry, load_registry
from cdi_gen.doctor.check import Check, Status

__all__ = ["check_spec_dirs"]


def _folder_checks(spec_dirs: Sequence[Path], ours: Path) -> list[Check]:
    """Each folder present and world-readable (rootless podman reads them as a user)."""
    checks: list[Check] = []
    topic = "spec folders"
    for d in spec_dirs:
        if not d.exists():
            level: Status = "WARN" if d == ours else "OK"
            checks.append(
                Check(
                    level,
                    topic,
                    f"{d} does not exist" + (" yet (the agent creates it)" if d == ours else ""),
                    "run `cdi-gen write` or start the agent",
                )
            )
            continue
        mode = d.stat().st_mode
        if not (mode & stat.S_IROTH and mode & stat.S_IXOTH):
            checks.append(
                Check(
                    "WARN",
                    topic,
                    f"{d} is not world-readable (mode "
                    f"{stat.S_IMODE(mode):o}): rootless podman cannot read it",
                    f"chmod 755 {d}",
                )
            )
    return checks


def _file_error_checks(reg: Registry, vendor: str) -> list[Check]:
    """The files a runtime would skip: ours FAIL, others WARN, crashers FAIL."""
    checks: list[Check] = []
    for path, msgs in sorted(reg.errors.items()):
        level: Status = "FAIL" if path.name.startswith(f"{vendor}-") else "WARN"
        for msg in msgs:
            if _crashes_runtimes(msg):
                checks.append(
                    Check(
                        "FAIL",
                        "spec files",
                        f"{path}: {msg}: this crashes podman "
                        "4.3 and containerd 1.7.24 on every CDI request",
                        "remove the file now",
                    )
                )
                continue
            checks.append(
                Check(
                    level,
                    "spec files",
                    f"{path}: {msg}",
                    "fix or remove the file; runtimes skip it",
                )
            )
    return checks


def check_spec_dirs(
    spec_dirs: Sequence[Path], ours: Path, vendor: str, reg: Registry | None = None
) -> list[Check]:
    """Folders present and readable, our files valid and world-readable, conflicts, shadowing.

    ``reg``: the folders already scanned (the same scan serves
    :func:`~cdi_gen.doctor.runtimechecks.check_runtimes`)."""
    topic = "spec folders"
    checks = _folder_checks(spec_dirs, ours)
    reg = reg if reg is not None else load_registry(spec_dirs)
    for msg in reg.dir_errors.values():
        checks.append(Check("FAIL", topic, msg, "fix the folder permissions"))
    checks += _file_error_checks(reg, vendor)
    for path in sorted({e.path for e in reg.devices.values()}):
        if path.parent == ours and not path.stat().st_mode & stat.S_IROTH:
            checks.append(
                Check("WARN", "spec files", f"{path} is not world-readable", f"chmod 644 {path}")
            )
    for name, hidden in sorted(reg.shadowed.items()):
        if name in reg.devices:
            checks.append(
                Check(
                    "WARN",
                    "shadowing",
                    f"{name} in "
                    f"{', '.join(map(str, hidden))} is overridden by "
                    f"{reg.devices[name].path}",
                    "remove the stale definition",
                )
            )
    ours_count = sum(1 for e in reg.devices.values() if e.qualified.startswith(f"{vendor}/"))
    checks.append(
        Check(
            "OK",
            topic,
            f"{len(reg.devices)} CDI devices resolve "
            f"({ours_count} of vendor {vendor}) in {', '.join(map(str, spec_dirs))}",
        )
    )
    return checks


def _crashes_runtimes(message: str) -> bool:
    """Problems that make old CDI libraries panic instead of skipping the file: a one-character
    vendor or class name, a null where an object belongs (``deviceNodes: [null]``)."""
    return "must be at least 2 characters" in message or (
        "Input should be a valid dictionary" in message and "(got None)" in message
    )
