"""The devices as the doctor finds them: udevd answering (else rules on ``ID_*`` properties
cannot match) and how many devices each configured class matches."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from cdi_gen.doctor.check import Check
from cdi_gen.paths import UDEV_RUN_DIR

__all__ = ["check_classes", "check_udev"]


def check_udev(run_dir: Path = UDEV_RUN_DIR) -> list[Check]:
    from cdi_gen.sources.udev import udevd_running

    if udevd_running(run_dir):
        return [Check("OK", "udev", f"udevd answers at {run_dir}/control")]
    if run_dir.exists():
        return [
            Check(
                "WARN",
                "udev",
                f"{run_dir} exists but udevd does not answer: kernel "
                "events only, no ID_* properties",
                "mount /run/udev read-only into the pod",
            )
        ]
    return [
        Check(
            "WARN",
            "udev",
            f"{run_dir} is absent: rules on ID_* properties cannot match",
            "mount /run/udev (read-only) or run udevd",
        )
    ]


def check_classes(counts: Iterable[tuple[str, str, int]]) -> list[Check]:
    """``(class, rules, device count)`` → one line per class."""
    out = []
    for name, rules, n in counts:
        if n:
            out.append(Check("OK", f"class {name}", f"{n} device(s) match"))
        else:
            out.append(
                Check(
                    "WARN",
                    f"class {name}",
                    f"no device matches {rules}",
                    "check the rules with `cdi-gen discover --class " + name + "`",
                )
            )
    return out
