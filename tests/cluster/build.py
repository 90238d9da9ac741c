"""The Kubernetes binaries, built with ``go build`` from the release pinned in ``k8s/go.mod``.

No registry ships kubelet or kube-apiserver binaries, so they are built from the Go module proxy
(``k8s.io/kubernetes`` plus every staging module pinned by a replace). The output goes to a
cache outside the checkout keyed by the release and a hash of go.mod and go.sum: a warm run
builds nothing, and changing the pin builds into a new folder. The cold build's duration is
recorded next to the binaries, so later runs can still report what a cold build costs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

MODULE_DIR = Path(__file__).resolve().parent / "k8s"
CACHE = Path(os.environ.get("CDI_GEN_KUBERNETES_CACHE", "/var/cache/cdi-gen-test/kubernetes"))
#: Kubernetes 1.35 needs Go >= 1.25; Debian 12's /usr/bin/go is 1.19.
MIN_GO = (1, 25)
#: The toolchain fetched through the Go module proxy when no Go on the machine is new enough.
TOOLCHAIN = "go1.26.8"
_GO_VERSION = re.compile(r"go version go(\d+)\.(\d+)")
COMMANDS = ("kubelet", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl")
_REQUIRE = re.compile(r"^require k8s\.io/kubernetes (v\d+\.\d+\.\d+)$", re.MULTILINE)


class BuildError(RuntimeError):
    """The binaries could not be built; the message names the step and carries its output."""


@dataclass(frozen=True)
class Binaries:
    version: str
    bin: Path
    #: Seconds the cold build took (0 when the binaries were found in the cache).
    build_seconds: float
    #: Seconds the cold build of this cache entry took, whenever it happened.
    cold_seconds: float

    def path(self, command: str) -> Path:
        return self.bin / command


def release() -> str:
    """The pinned release, e.g. ``v1.35.4``, read from go.mod."""
    text = (MODULE_DIR / "go.mod").read_text()
    found = _REQUIRE.search(text)
    if found is None:
        raise BuildError(f"{MODULE_DIR / 'go.mod'}: no 'require k8s.io/kubernetes vX.Y.Z' line")
    return found.group(1)


def cache_key() -> str:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update((MODULE_DIR / name).read_bytes())
    return f"{release()}-{digest.hexdigest()[:12]}"


def _ldflags(version: str) -> str:
    # What the release build stamps; without it every component reports v0.0.0-master and the
    # kubelet's version in the Node object would not name the release.
    major, minor = version.removeprefix("v").split(".")[:2]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(flags)


def _go_version(go: Path) -> tuple[str, tuple[int, int]]:
    """``go version``'s line and (major, minor); ("", (0, 0)) when it does not run."""
    try:
        out = subprocess.run(
            [str(go), "version"], capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "", (0, 0)
    found = _GO_VERSION.match(out)
    return out, (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _fetch_toolchain(old_go: Path, cache: Path) -> Path:
    """Go ``TOOLCHAIN`` from the module proxy (the module ``golang.org/toolchain`` that Go's own
    toolchain switching uses), downloaded and checksum-verified by an older ``go``."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    dest = cache / TOOLCHAIN
    if (dest / "bin/go").exists():
        return dest / "bin/go"
    module = f"golang.org/toolchain@v0.0.1-{TOOLCHAIN}.linux-{arch}"
    cache.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [str(old_go), "mod", "download", "-json", module],
        cwd=cache,
        env={**os.environ, "GO111MODULE": "on", "GOFLAGS": ""},
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise BuildError(f"{old_go} mod download {module} failed:\n{proc.stdout}{proc.stderr}")
    source = Path(json.loads(proc.stdout)["Dir"])
    staging = cache / f"{TOOLCHAIN}.new"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging)
    # Module zips keep no file modes: the commands must be made executable again.
    for tool in [*(staging / "bin").iterdir(), *(staging / "pkg/tool").glob("*/*")]:
        tool.chmod(0o755)
    staging.rename(dest)
    return dest / "bin/go"


def find_go(cache: Path) -> tuple[Path, str]:
    """A Go new enough for the pinned release, and its ``go version`` line.

    ``CDI_GEN_GO`` if set, else /usr/local/go/bin/go or the ``go`` on PATH; when none is
    new enough, ``TOOLCHAIN`` is fetched into ``cache`` with whichever Go there is.
    """
    override = os.environ.get("CDI_GEN_GO")
    candidates = [Path(override)] if override else [Path("/usr/local/go/bin/go")]
    if not override and (on_path := shutil.which("go")):
        candidates.append(Path(on_path))
    runnable = []
    for go in candidates:
        line, version = _go_version(go)
        if version >= MIN_GO:
            return go, line
        if line:
            runnable.append(go)
    if not runnable:
        raise BuildError(
            f"no Go found (tried {', '.join(map(str, candidates))}): apt-get install golang-go"
        )
    go = _fetch_toolchain(runnable[0], cache)
    line, version = _go_version(go)
    if version < MIN_GO:
        raise BuildError(f"the fetched {go} does not run or is too old: {line!r}")
    return go, line


SETUP_COMMAND = ".venv/bin/python tests/cluster/setup.py"


def build(cache: Path = CACHE, *, allow_build: bool = True) -> Binaries:
    """The binaries of the pinned release, built into the cache unless already there.

    With ``allow_build`` off a missing build is an error naming the setup command: the tests
    must not spend their time limit on a build of tens of minutes.
    """
    version = release()
    entry = cache / cache_key()
    bin_dir = entry / "bin"
    record = entry / "build.json"
    entry.mkdir(parents=True, exist_ok=True)
    with open(entry / ".lock", "w") as lock:
        # Two sessions starting at once: one builds, the other waits and finds the result.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if record.exists() and all((bin_dir / c).exists() for c in COMMANDS):
            cold = float(json.loads(record.read_text())["seconds"])
            return Binaries(version, bin_dir, 0.0, cold)
        if not allow_build:
            raise BuildError(
                f"Kubernetes {version} is not built in {entry} (go.mod or go.sum changed, or "
                f"setup never ran): run `{SETUP_COMMAND}` first"
            )
        go, go_line = find_go(cache / "go")
        staging = entry / "bin.new"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        env = {
            **os.environ,
            # Static binaries, as the release builds them; nothing depends on the host's libc.
            "CGO_ENABLED": "0",
            # go.mod and go.sum are committed: a build must never rewrite them.
            "GOFLAGS": "-mod=readonly -buildvcs=false",
        }
        args = [
            str(go), "build", "-trimpath", "-ldflags", _ldflags(version),
            "-o", f"{staging}/",
            *(f"k8s.io/kubernetes/cmd/{c}" for c in COMMANDS),
        ]  # fmt: skip
        start = time.monotonic()
        proc = subprocess.run(
            args, cwd=MODULE_DIR, env=env, capture_output=True, text=True, check=False
        )
        seconds = time.monotonic() - start
        if proc.returncode != 0:
            raise BuildError(
                f"go build of Kubernetes {version} failed (exit {proc.returncode}), "
                f"{go_line}:\n{proc.stdout}{proc.stderr[-6000:]}"
            )
        missing = [c for c in COMMANDS if not (staging / c).exists()]
        if missing:
            raise BuildError(f"go build left no {', '.join(missing)} in {staging}")
        shutil.rmtree(bin_dir, ignore_errors=True)
        staging.rename(bin_dir)
        record.write_text(
            json.dumps({"version": version, "go": go_line, "seconds": round(seconds, 1)}) + "\n"
        )
        return Binaries(version, bin_dir, seconds, seconds)
