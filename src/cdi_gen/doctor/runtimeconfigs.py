"""The container runtimes' own configs as the doctor reads them: whether containerd injects
CDI devices (its ``enable_cdi`` for the config's schema version, its release's defaults) and
whether containerd and CRI-O read our spec folder (their ``cdi_spec_dirs``)."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cdi_gen.doctor.check import Check
from cdi_gen.errors import quote
from cdi_gen.files import RUNTIME_CONFIG_MAX_BYTES, FileRefused, read_regular
from cdi_gen.paths import RUNTIME_SPEC_DIRS

__all__ = ["DEFAULT_RUNTIME_SPEC_DIRS", "check_containerd", "check_crio", "same_dir"]

#: The runtimes' own default folders, as strings to compare with their config files.
DEFAULT_RUNTIME_SPEC_DIRS = tuple(str(d) for d in RUNTIME_SPEC_DIRS)


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
