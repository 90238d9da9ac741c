"""The devices as the doctor finds them: udevd answering (else rules on ``ID_*`` properties
cannot match), how many devices each configured class matches, and the host paths their
extra device nodes and mounts need."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cdi_gen.doctor.check import Check
from cdi_gen.errors import quote
from cdi_gen.paths import UDEV_RUN_DIR

if TYPE_CHECKING:
    from cdi_gen.discovery.inventory import Discovery

__all__ = ["check_classes", "check_host_paths", "check_udev", "in_a_pod"]


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


def check_host_paths(
    discovery: Discovery,
    exists: Callable[[str], bool] = os.path.exists,
    *,
    host_folders: Sequence[str] | None = None,
) -> list[Check]:
    """A FAIL per device and host path of its class's extra ``deviceNodes`` or bind
    ``mounts`` that is missing here (not marked ``optional``): the spec validates, but a
    runtime fails the container at creation, and the agent leaves such a device out.

    ``host_folders``: in the agent's pod, the folders of the host it sees (the rest of its
    filesystem is the image's). A path outside them is not judged, as the agent does not
    judge it, and gets one WARN per class and path saying where to check it instead."""
    from cdi_gen.discovery.spec import missing_host_paths, within

    out = []
    for cls in discovery.class_names:
        config = discovery.config_of(cls)
        unseen: list[str] = []
        judge = exists if host_folders is None else within(host_folders, exists, unseen.append)
        for device in discovery.devices(cls):
            for problem in missing_host_paths(config, device, judge):
                out.append(
                    Check(
                        "FAIL",
                        f"class {cls}",
                        f"device {device.name!r}: {problem}",
                        "create the path, fix the class's containerEdits, or mark the entry "
                        "optional: true if it appears later",
                    )
                )
        for path in dict.fromkeys(unseen):  # each once, in the order first met
            out.append(
                Check(
                    "WARN",
                    f"class {cls}",
                    f"host path {quote(path)} not checked: this pod sees only "
                    f"{', '.join(host_folders or ())} of the host",
                    "run cdi-gen doctor on the node itself to check it",
                )
            )
    return out


def in_a_pod(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process runs in a Kubernetes pod (the kubelet sets the service
    variables in every container), where the host is seen only through mounted folders."""
    return "KUBERNETES_SERVICE_HOST" in environ
