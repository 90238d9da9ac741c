"""The test daemon's config.toml, built on the CDI snippet that users get from deploy/.

The snippet is parsed and only its folder list is replaced by the test's own folders; the rest
(private root, state, socket, runc, sandbox image) is added around it. What the tests prove is
therefore what ``deploy/containerd/containerd-1.7-cdi.toml`` tells users to write.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
SNIPPET_17 = REPO / "deploy/containerd/containerd-1.7-cdi.toml"
SNIPPET_2X = REPO / "deploy/containerd/containerd-2.x-cdi.toml"
CRI_17 = "io.containerd.grpc.v1.cri"
CRI_2X = "io.containerd.cri.v1.runtime"
#: Debian 12's runc, which the shim runs unless a test names another (the cluster's current
#: lane runs a runc 1.5 built from its Go module: tests/cluster/lane.py).
DEBIAN_RUNC = Path("/usr/sbin/runc")


def load_snippet(path: Path = SNIPPET_17) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def daemon_config(
    work: Path,
    spec_dirs: list[Path],
    sandbox_image: str,
    *,
    enable_cdi: bool | None = None,
    runc: Path = DEBIAN_RUNC,
) -> dict[str, Any]:
    """The whole config: the deploy snippet, the test's folders, private everything else.

    ``enable_cdi`` left as None keeps the snippet's value; False reproduces a node where
    nobody turned CDI on. ``runc`` is the binary the shim runs.
    """
    snippet = load_snippet()
    cri: dict[str, Any] = {
        "cdi_spec_dirs": [str(d) for d in spec_dirs],
        "sandbox_image": sandbox_image,
        # This VM lacks CAP_SYS_RESOURCE: without this every sandbox fails with
        # "can't get final child's PID from pipe: EOF".
        "restrict_oom_score_adj": True,
        "cni": {"bin_dir": str(work / "cni/bin"), "conf_dir": str(work / "cni/conf")},
        "containerd": {
            "snapshotter": "overlayfs",
            "default_runtime_name": "runc",
            "runtimes": {
                "runc": {
                    "runtime_type": "io.containerd.runc.v2",
                    "options": {"BinaryName": str(runc), "Root": str(work / "runc")},
                }
            },
        },
    }
    if enable_cdi is not None:
        cri["enable_cdi"] = enable_cdi
    private = {
        "root": str(work / "root"),
        "state": str(work / "state"),
        "grpc": {"address": str(work / "containerd.sock")},
        "plugins": {
            CRI_17: cri,
            "io.containerd.nri.v1.nri": {"disable": True},
            "io.containerd.internal.v1.opt": {"path": str(work / "opt")},
        },
    }
    return _merge(snippet, private)


CRI_IMAGES_2X = "io.containerd.cri.v1.images"


def daemon_config_v4(
    work: Path, spec_dirs: list[Path], sandbox_image: str, runc: Path = DEBIAN_RUNC
) -> dict[str, Any]:
    """containerd 2.3's native config (version 4) for a private daemon, built on
    ``deploy/containerd/containerd-2.x-cdi.toml`` as :func:`daemon_config` is on the 1.7
    snippet: only its folder list is replaced; the shim runs ``runc``.

    CDI is left at its default, on: the snippet writes no ``enable_cdi`` (only ``false`` is
    deprecated, and a node as users get it has no such line).
    """
    private = {
        "version": 4,
        "root": str(work / "root"),
        "state": str(work / "state"),
        "plugins": {
            # Version 4 moved the [grpc] and [ttrpc] tables into server plugins; the ttrpc
            # socket must be private too (its default is shared by every daemon).
            "io.containerd.server.v1.grpc": {"address": str(work / "containerd.sock")},
            "io.containerd.server.v1.ttrpc": {"address": str(work / "containerd.sock.ttrpc")},
            CRI_IMAGES_2X: {
                "snapshotter": "overlayfs",
                "pinned_images": {"sandbox": sandbox_image},
            },
            CRI_2X: {
                "cdi_spec_dirs": [str(d) for d in spec_dirs],
                # As for 1.7: the VM lacks CAP_SYS_RESOURCE.
                "restrict_oom_score_adj": True,
                "cni": {"bin_dirs": [str(work / "cni/bin")], "conf_dir": str(work / "cni/conf")},
                "containerd": {
                    "default_runtime_name": "runc",
                    "runtimes": {
                        "runc": {
                            "runtime_type": "io.containerd.runc.v2",
                            "options": {
                                "BinaryName": str(runc),
                                "Root": str(work / "runc"),
                            },
                        }
                    },
                },
            },
            "io.containerd.nri.v1.nri": {"disable": True},
            "io.containerd.internal.v1.opt": {"path": str(work / "opt")},
        },
    }
    return _merge(load_snippet(SNIPPET_2X), private)


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE_KEY.match(k) else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def to_toml(data: dict[str, Any]) -> str:
    """TOML text for nested tables of scalars and lists (all a containerd config needs)."""
    lines: list[str] = []

    def table(path: list[str], d: dict[str, Any]) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in d.items() if isinstance(v, dict)}
        if path and scalars:
            lines.append("")
            lines.append("[" + ".".join(_key(p) for p in path) + "]")
        lines.extend(f"{_key(k)} = {_value(v)}" for k, v in scalars.items())
        for k, v in tables.items():
            table([*path, k], v)

    table([], data)
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text) != data:
        raise AssertionError("TOML round trip changed the config")
    return text
