"""Every check of a node, in the order ``cdi-gen doctor`` prints them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cdi_gen.cdi import runtimes as rt
from cdi_gen.cdi.registry import load_registry
from cdi_gen.config.settings import Settings
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.discovery.spec import AGENT_FOLDERS
from cdi_gen.doctor.check import Check
from cdi_gen.doctor.devices import check_classes, check_host_paths, check_udev, in_a_pod
from cdi_gen.doctor.kubernetes import check_dra, check_kubelet
from cdi_gen.doctor.runtimechecks import check_runtimes, find_runtimes
from cdi_gen.doctor.runtimeconfigs import check_containerd, check_crio, same_dir
from cdi_gen.doctor.specfolders import check_spec_dirs
from cdi_gen.paths import CRIO_CONFIG

__all__ = ["diagnose"]


def diagnose(
    settings: Settings,
    discovery: Discovery,
    *,
    containerd_config: Path,
    containerd_version: str | None = None,
    crio_configs: Sequence[Path] = (),
) -> list[Check]:
    """Every check of this node for the agent's ``settings``, in the order printed.

    Raises :class:`ConfigError` for a malformed ``--runtime`` or ``--containerd-version``.
    """
    from cdi_gen.cdi.cri import lookup

    spec_dir = settings.paths.spec_dir
    runtimes, checks = find_runtimes(
        settings.runtimes.refs, containerd_version, lookup(settings.runtimes.cri_sockets)
    )
    containerd = next((r for r in runtimes if r.name == "containerd"), None)
    version = None if containerd is None else rt.parse_release(containerd.version)
    dirs = settings.paths.for_runtime()
    checks += check_containerd(containerd_config, spec_dir, version)
    checks += check_crio(
        crio_configs or (CRIO_CONFIG, CRIO_CONFIG.parent / "crio.conf.d"), spec_dir
    )
    if not any(same_dir(str(d), spec_dir) for d in dirs):
        checks.append(
            Check(
                "FAIL",
                "spec folders",
                f"{spec_dir} is not among the runtime folders {', '.join(map(str, dirs))}",
                "write into a folder the runtime reads",
            )
        )
    registry = load_registry(dirs, keep_specs=True)  # check_runtimes reads each spec
    checks += check_spec_dirs(dirs, spec_dir, discovery.config.vendor, registry)
    checks += check_runtimes(runtimes, registry)
    checks += check_kubelet(settings.kubelet.device_plugin_dir)
    checks += check_dra(settings, discovery.config)
    checks += check_udev()
    checks += check_classes(
        (
            cls,
            " | ".join(r.describe() for r in discovery.config_of(cls).match),
            len(discovery.devices(cls)),
        )
        for cls in discovery.class_names
    )
    # In the agent's pod, beyond the folders its DaemonSet mounts, the files are the image's.
    folders = AGENT_FOLDERS if in_a_pod() else None
    checks += check_host_paths(discovery, host_folders=folders)
    return checks
