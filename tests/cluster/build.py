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
#: Go 1.26 (Debian's /usr/bin/go is 1.19, far too old for Kubernetes 1.35).
GO = Path(os.environ.get("CDI_GEN_GO", "/usr/local/go/bin/go"))
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


def _go_version() -> str:
    try:
        out = subprocess.run(
            [str(GO), "version"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"{GO} version: {exc} (Go >= 1.25 is needed; set CDI_GEN_GO)") from exc
    return out.strip()


SETUP_COMMAND = "python3 tests/cluster/setup.py"


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
        go = _go_version()
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
            str(GO), "build", "-trimpath", "-ldflags", _ldflags(version),
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
                f"go build of Kubernetes {version} failed (exit {proc.returncode}) with {go}:\n"
                f"{proc.stdout}{proc.stderr[-6000:]}"
            )
        missing = [c for c in COMMANDS if not (staging / c).exists()]
        if missing:
            raise BuildError(f"go build left no {', '.join(missing)} in {staging}")
        shutil.rmtree(bin_dir, ignore_errors=True)
        staging.rename(bin_dir)
        record.write_text(
            json.dumps({"version": version, "go": go, "seconds": round(seconds, 1)}) + "\n"
        )
        return Binaries(version, bin_dir, seconds, seconds)
