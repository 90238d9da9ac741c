"""``cdi-gen doctor``: preflight checks of a node, one line each with what to do.

The most expensive failure of a CDI-only device plugin is silent: containerd 1.7 ships with
``enable_cdi = false`` and then *ignores* the CDI names the kubelet passes, so pods start
without their devices. The doctor reads the runtime configs, the spec folders as a runtime
would, the kubelet and udev sockets, and what the configured classes match, and says OK, WARN
or FAIL with the fix. The runtimes are the ones named, else those on PATH, else (in a pod)
the one answering on a CRI socket.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cdi_gen.cdi.registry import Registry, load_registry
from cdi_gen.cdi.runtimes import Lookup, Runtime, readability_problems
from cdi_gen.config.models import AgentConfig
from cdi_gen.config.settings import Settings
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.errors import ConfigError, quote
from cdi_gen.files import RUNTIME_CONFIG_MAX_BYTES, FileRefused, read_regular
from cdi_gen.paths import CRIO_CONFIG, KUBELET_SOCKET_NAME, RUNTIME_SPEC_DIRS, UDEV_RUN_DIR

Status = Literal["OK", "WARN", "FAIL"]
#: The runtimes' own default folders, as strings to compare with their config files.
DEFAULT_RUNTIME_SPEC_DIRS = tuple(str(d) for d in RUNTIME_SPEC_DIRS)


@dataclass(frozen=True, slots=True)
class Check:
    status: Status
    topic: str
    message: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<4} {self.topic}: {self.message}"
        return f"{text} -> {self.fix}" if self.fix and self.status != "OK" else text


def same_dir(a: str, b: Path) -> bool:
    # /var/run is usually a link to /run: compare both spellings and the resolved paths.
    return os.path.normpath(a) == os.path.normpath(str(b)) or os.path.realpath(
        a
    ) == os.path.realpath(b)


class _MalformedError(ValueError):
    """A runtime config that parses as TOML but has a value of the wrong type."""


def _load_toml(path: Path) -> dict[str, Any]:
    """Parse a runtime config; raise ValueError (one line) if it cannot be read or parsed."""
    try:
        return tomllib.loads(read_regular(path, RUNTIME_CONFIG_MAX_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise ValueError("no such file") from None
    except (FileRefused, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(str(exc)) from None


def _typed(table: Any, key: str, kind: type | tuple[type, ...], what: str, default: Any) -> Any:
    value = table.get(key, default)
    # bool is an int to Python; a TOML "version = true" is not a version.
    if value is not default and not (
        isinstance(value, kind) and isinstance(value, bool) == (kind is bool)
    ):
        raise _MalformedError(f"{key} should be {what}, got {quote(value)}")
    return value


def _string_list(table: dict[str, Any], key: str) -> list[str] | None:
    value = table.get(key)
    if value is not None and not (
        isinstance(value, list) and all(isinstance(v, str) for v in value)
    ):
        raise _MalformedError(f"{key} should be a list of folder names, got {quote(value)}")
    return value


def _cri_section(doc: dict[str, Any]) -> tuple[str, dict[str, Any] | None, bool]:
    """(section name, section, enable_cdi default) for the config's schema version.

    Raises :class:`_MalformedError` when a value on the way has the wrong type.
    """
    version = _typed(doc, "version", int, "an integer", 1)
    plugins = _typed(doc, "plugins", dict, "a table", {})
    if version >= 3:
        name = "io.containerd.cri.v1.runtime"
        return f'plugins."{name}"', _typed(plugins, name, dict, "a table", None), True
    if version == 2:
        name = "io.containerd.grpc.v1.cri"
        return f'plugins."{name}"', _typed(plugins, name, dict, "a table", None), False
    return "plugins.cri", _typed(plugins, "cri", dict, "a table", None), False


# Complexity exception (C901, PLR0912): a checklist of the containerd config, one branch
# per verdict, in the order the lines are printed.
def check_containerd(config: Path, spec_dir: Path, version: tuple[int, ...] | None) -> list[Check]:  # noqa: C901, PLR0912
    """Whether containerd will inject CDI devices from ``spec_dir``."""
    topic = "containerd"
    checks: list[Check] = []
    if version is not None:
        shown = ".".join(map(str, version))
        if version < (1, 7, 0):
            return [
                Check(
                    "FAIL",
                    topic,
                    f"containerd {shown} has no CDI support",
                    "upgrade to containerd 1.7 or newer",
                )
            ]
        if version < (1, 7, 2):
            checks.append(
                Check(
                    "WARN",
                    topic,
                    f"containerd {shown} reads CDI only from cdi.k8s.io/ annotations",
                    "run the agent with --cdi-annotations or upgrade to containerd >= 1.7.2",
                )
            )
    if not config.exists():
        if version is None:
            return [
                Check(
                    "WARN",
                    topic,
                    f"no config at {config} and no containerd binary found; skipped",
                    "pass --containerd-config if containerd runs here",
                )
            ]
        if version >= (2, 0, 0):
            return [
                *checks,
                Check(
                    "OK",
                    topic,
                    f"no config at {config}; containerd {version[0]}.x enables CDI by default",
                ),
            ]
        return [
            *checks,
            Check(
                "FAIL",
                topic,
                f"no config at {config}: containerd 1.7 defaults to "
                "enable_cdi = false and silently drops CDI devices",
                "create it with enable_cdi = true (see deploy/containerd/)",
            ),
        ]
    try:
        doc = _load_toml(config)
        section_name, section, default_on = _cri_section(doc)
        section = section or {}
        enabled = _typed(section, "enable_cdi", bool, "true or false", default_on)
        dirs = _string_list(section, "cdi_spec_dirs")
    except ValueError as exc:
        return [*checks, Check("FAIL", topic, f"cannot read {config}: {exc}", "fix the file")]
    if version is not None and version >= (2, 0, 0) and doc.get("version", 1) < 3:
        checks.append(
            Check(
                "WARN",
                topic,
                f"{config} uses config version {doc.get('version', 1)} "
                "with containerd 2.x (migrated at start)",
                "run `containerd config migrate`",
            )
        )
    where = f"{config} [{section_name}]"
    if not enabled:
        why = (
            "enable_cdi = false" if "enable_cdi" in section else "enable_cdi is unset (off in 1.7)"
        )
        checks.append(
            Check(
                "FAIL",
                topic,
                f"{why} in {where}: CDI devices requested by the "
                "kubelet are silently ignored, pods start without their devices",
                f"set enable_cdi = true under [{section_name}] and restart containerd",
            )
        )
    else:
        checks.append(Check("OK", topic, f"CDI enabled in {where}"))
    if dirs is None:
        dirs = list(DEFAULT_RUNTIME_SPEC_DIRS)
    if any(same_dir(d, spec_dir) for d in dirs):
        checks.append(Check("OK", topic, f"cdi_spec_dirs {dirs} include {spec_dir}"))
    else:
        checks.append(
            Check(
                "FAIL",
                topic,
                f"cdi_spec_dirs {dirs} do not include {spec_dir}: "
                "containerd will not find our specs",
                f'add "{spec_dir}" to cdi_spec_dirs under [{section_name}]',
            )
        )
    return checks


def check_crio(configs: Sequence[Path], spec_dir: Path) -> list[Check]:
    """Whether CRI-O reads ``spec_dir`` (CDI is always on in CRI-O; only the folders matter)."""
    dirs: list[str] | None = None
    seen: list[Path] = []
    for path in configs:
        files = sorted(path.glob("*.conf")) if path.is_dir() else [path]
        for f in files:
            if not f.is_file():
                continue
            seen.append(f)
            try:
                doc = _load_toml(f)
                crio = _typed(doc, "crio", dict, "a table", {})
                runtime = _typed(crio, "runtime", dict, "a table", {})
                found = _string_list(runtime, "cdi_spec_dirs")
                if found is not None:
                    dirs = found
            except ValueError as exc:
                return [Check("FAIL", "cri-o", f"cannot read {f}: {exc}", "fix the file")]
    if not seen:
        return []
    dirs = dirs if dirs is not None else list(DEFAULT_RUNTIME_SPEC_DIRS)
    if any(same_dir(d, spec_dir) for d in dirs):
        return [Check("OK", "cri-o", f"cdi_spec_dirs {dirs} include {spec_dir}")]
    return [
        Check(
            "FAIL",
            "cri-o",
            f"cdi_spec_dirs {dirs} do not include {spec_dir}",
            f'add "{spec_dir}" to cdi_spec_dirs in [crio.runtime]',
        )
    ]


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

    ``reg``: the folders already scanned (the same scan serves :func:`check_runtimes`)."""
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


def _crashes_runtimes(message: str) -> bool:
    """Problems that make old CDI libraries panic instead of skipping the file: a one-character
    vendor or class name, a null where an object belongs (``deviceNodes: [null]``)."""
    return "must be at least 2 characters" in message or (
        "Input should be a valid dictionary" in message and "(got None)" in message
    )


def check_kubelet(plugin_dir: Path) -> list[Check]:
    sock = plugin_dir / KUBELET_SOCKET_NAME
    if sock.is_socket():
        return [Check("OK", "kubelet", f"{sock} is present")]
    return [
        Check(
            "WARN",
            "kubelet",
            f"{sock} is absent: no kubelet device manager here",
            "only host mode (cdi-gen write + podman/docker) will work on this machine",
        )
    ]


def check_dra(settings: Settings, config: AgentConfig) -> list[Check]:
    """For classes served through DRA: the kubelet's plugin watcher folder, and an API server
    configuration the driver can load (nothing is asked of the API server itself)."""
    classes = [c.name for c in config.classes if c.api == "dra"]
    if not classes:
        return []
    # Only a node with DRA classes loads the API client.
    from cdi_gen.apiserver.kubeconfig import load_kubeconfig

    topic = "dra"
    registry = settings.plugins_registry_dir
    checks = [
        Check("OK", topic, f"{registry} is present (the kubelet's plugin watcher)")
        if registry.is_dir()
        else Check(
            "WARN",
            topic,
            f"{registry} is absent: no kubelet plugin watcher to register DRA driver "
            f"{settings.driver_name(config)} with",
            "run a kubelet >= 1.34 here, or point --plugins-registry-dir at its folder",
        )
    ]
    try:
        current = load_kubeconfig(settings.kubeconfig).get()
    except ConfigError as exc:
        checks.append(
            Check(
                "FAIL",
                topic,
                f"classes {', '.join(classes)} use DRA, which needs the API server: {exc}",
                "give --kubeconfig, or run in a pod with a service account (deploy/kubernetes/dra)",
            )
        )
        return checks
    checks.append(
        Check(
            "OK",
            topic,
            f"driver {settings.driver_name(config)} publishes node {settings.node()}'s "
            f"ResourceSlices at {current.cluster.server if current else '?'} "
            f"(classes {', '.join(classes)})",
        )
    )
    return checks


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


def _runtimes(
    refs: Sequence[str], containerd_version: str | None, fallback: Lookup | None = None
) -> tuple[list[Runtime], list[Check]]:
    """The node's runtimes: named ones, else every one on PATH asked for its version, else
    (in a pod, where no binary is visible) what ``fallback`` finds: the CRI sockets' answer."""
    from cdi_gen.cdi import runtimes as rt

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
    from cdi_gen.cdi import runtimes as rt
    from cdi_gen.cdi.cri import lookup

    spec_dir = settings.spec_dir
    runtimes, checks = _runtimes(settings.runtime, containerd_version, lookup(settings.cri_socket))
    containerd = next((r for r in runtimes if r.name == "containerd"), None)
    version = None if containerd is None else rt.parse_release(containerd.version)
    dirs = settings.spec_dirs_for_runtime()
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
    checks += check_kubelet(settings.device_plugin_dir)
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
    return checks
