"""Go programs of a lane, built with ``go build`` from the release its go.mod pins.

No registry ships kubelet or kube-apiserver binaries, nor a static containerd 2.x, nor a CRI-O
of the release Kubernetes 1.36 pairs with, so they are built from the Go module proxy:
``k8s.io/kubernetes`` plus every staging module pinned by a replace
(``lanes/<lane>/kubernetes/go.mod``), ``github.com/containerd/containerd/v2``
(``lanes/current/containerd/go.mod``), ``github.com/cri-o/cri-o`` (``lanes/crio/crio/go.mod``;
with cgo against Debian's libseccomp) and ``github.com/opencontainers/runc``
(``tools/runc/go.mod``, cgo and libseccomp too: Debian 12's runc 1.1 ignores OCI
``linux.netDevices``, which runc applies from 1.4). The output goes to a cache outside the checkout,
``/var/cache/cdi-gen-test/<lane>/<program>/<release>-<hash of go.mod, go.sum and flags>``: a
warm run builds nothing, and changing a pin (or CRI-O's tags) builds into a new folder. The
cold build's duration is recorded next to the binaries, so later runs can still report what a
cold build costs.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The toolchain fetched through the Go module proxy when no Go on the machine is new enough
#: for a module's ``go`` line; Debian 12's /usr/bin/go is 1.19.
TOOLCHAIN = "go1.26.8"
_GO_VERSION = re.compile(r"go version go(\d+)\.(\d+)")
_GO_LINE = re.compile(r"^go (\d+)\.(\d+)", re.MULTILINE)
COMMANDS = ("kubelet", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl")


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


@dataclass(frozen=True)
class GoProgram:
    """One Go module of a lane and the commands built from it."""

    #: The cache folder's name under the lane's, e.g. ``kubernetes``.
    name: str
    #: The module required in go.mod, e.g. ``k8s.io/kubernetes``.
    module: str
    #: The folder of our go.mod and go.sum that pin it.
    directory: Path
    #: Package paths inside the module; each binary is named after the last element.
    packages: tuple[str, ...]
    #: ``-ldflags`` for a release, e.g. the version stamps.
    ldflags: Callable[[str], str]
    #: Where the binaries go inside the cache entry (``usr/bin`` keeps a Debian-like root).
    out: str = "bin"
    #: Build with cgo (against the host's C libraries) instead of static.
    cgo: bool = False
    #: ``go build -tags``.
    tags: tuple[str, ...] = ()
    #: Folders of the module holding a C program (``src/*.c``), built with the host's cc
    #: into the same output and named after the folder: CRI-O's ``pinns``.
    c_programs: tuple[str, ...] = ()

    @property
    def commands(self) -> tuple[str, ...]:
        return (*(p.rsplit("/", 1)[-1] for p in self.packages), *self.c_programs)

    def release(self) -> str:
        """The pinned release, e.g. ``v1.37.2``, read from go.mod."""
        text = (self.directory / "go.mod").read_text()
        found = re.search(rf"^require {re.escape(self.module)} (v\d+\.\d+\.\d+)$", text, re.M)
        if found is None:
            raise BuildError(f"{self.directory / 'go.mod'}: no 'require {self.module} vX.Y.Z' line")
        return found.group(1)

    def min_go(self) -> tuple[int, int]:
        """The Go the module asks for (its go.mod's ``go`` line)."""
        found = _GO_LINE.search((self.directory / "go.mod").read_text())
        return (int(found.group(1)), int(found.group(2))) if found else (0, 0)

    def cache_key(self) -> str:
        digest = hashlib.sha256()
        for name in ("go.mod", "go.sum"):
            digest.update((self.directory / name).read_bytes())
        if self.cgo or self.tags or self.c_programs:
            # How a program is built changes its binaries as much as what it is built from:
            # new build tags must not find the old build (programs without any keep their key).
            digest.update(repr((self.cgo, self.tags, self.c_programs)).encode())
        return f"{self.release()}-{digest.hexdigest()[:12]}"


def kubernetes_ldflags(version: str) -> str:
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


def containerd_ldflags(version: str) -> str:
    # Without it containerd reports "<version>+unknown", and the CRI Version answer (what
    # cdi-gen doctor and the runtime table read) would not be the release's.
    package = "github.com/containerd/containerd/v2/version"
    return f"-s -w -X {package}.Version={version} -X {package}.Revision=release-{version}"


def crio_ldflags(version: str) -> str:
    # CRI-O's version is a constant in its source (internal/version); only the symbols go.
    return "-s -w"


#: The tags of CRI-O's Makefile that need no C library beyond libseccomp: no ostree, no gpgme
#: (the OpenPGP signature code is pure Go), no btrfs or devicemapper storage drivers.
CRIO_TAGS = (
    "containers_image_ostree_stub",
    "containers_image_openpgp",
    "exclude_graphdriver_btrfs",
    "exclude_graphdriver_devicemapper",
    "seccomp",
)


#: The tags of runc's Makefile but ``libpathrs`` (a Rust library Debian 12 does not ship; without
#: it runc uses its pure Go path resolution, as its Makefile's ``RUNC_BUILDTAGS=-libpathrs``).
RUNC_TAGS = ("seccomp", "urfave_cli_no_docs")


def runc_ldflags(version: str) -> str:
    # runc embeds its VERSION file; only the symbols go.
    return "-s -w"


def kubernetes(directory: Path) -> GoProgram:
    return GoProgram(
        "kubernetes",
        "k8s.io/kubernetes",
        directory,
        tuple(f"k8s.io/kubernetes/cmd/{c}" for c in COMMANDS),
        kubernetes_ldflags,
    )


def containerd(directory: Path) -> GoProgram:
    cmd = "github.com/containerd/containerd/v2/cmd"
    return GoProgram(
        "containerd",
        "github.com/containerd/containerd/v2",
        directory,
        (f"{cmd}/containerd", f"{cmd}/containerd-shim-runc-v2", f"{cmd}/ctr"),
        containerd_ldflags,
        # The layout of Debian's package, which tests/e2e/containerd's daemon runs from.
        out="usr/bin",
    )


def crio(directory: Path) -> GoProgram:
    return GoProgram(
        "crio",
        "github.com/cri-o/cri-o",
        directory,
        ("github.com/cri-o/cri-o/cmd/crio",),
        crio_ldflags,
        out="usr/bin",
        # seccomp needs libseccomp through cgo; CRI-O's own releases are dynamic builds too.
        cgo=True,
        tags=CRIO_TAGS,
        # CRI-O pins every pod's namespaces with this small C helper of its repository.
        c_programs=("pinns",),
    )


def runc(directory: Path) -> GoProgram:
    return GoProgram(
        "runc",
        "github.com/opencontainers/runc",
        directory,
        ("github.com/opencontainers/runc",),
        runc_ldflags,
        # Where Debian puts it.
        out="usr/sbin",
        # seccomp needs libseccomp, and runc's nsexec is C in any case.
        cgo=True,
        tags=RUNC_TAGS,
    )


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
    source = module_source(old_go, module, cache, timeout=1800)
    staging = cache / f"{TOOLCHAIN}.new"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging)
    # Module zips keep no file modes: the commands must be made executable again.
    for tool in [*(staging / "bin").iterdir(), *(staging / "pkg/tool").glob("*/*")]:
        tool.chmod(0o755)
    staging.rename(dest)
    return dest / "bin/go"


def module_source(
    go: Path, module: str, cwd: Path, *, goflags: str = "", timeout: float = 600
) -> Path:
    """The folder of ``module``'s source in Go's module cache (``go mod download -json``, run
    in ``cwd``: the version its go.mod pins, or the ``module@version`` given), downloaded
    when the cache lacks it; raises :class:`BuildError` naming the module."""
    proc = subprocess.run(
        [str(go), "mod", "download", "-json", module],
        cwd=cwd,
        env={**os.environ, "GO111MODULE": "on", "GOFLAGS": goflags},
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise BuildError(f"{go} mod download {module} failed:\n{proc.stdout}{proc.stderr}")
    return Path(json.loads(proc.stdout)["Dir"])


def find_go(cache: Path, min_go: tuple[int, int]) -> tuple[Path, str]:
    """A Go of at least ``min_go``, and its ``go version`` line.

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
        if version >= min_go:
            return go, line
        if line:
            runnable.append(go)
    if not runnable:
        raise BuildError(
            f"no Go found (tried {', '.join(map(str, candidates))}): apt-get install golang-go"
        )
    go = _fetch_toolchain(runnable[0], cache)
    line, version = _go_version(go)
    if version < min_go:
        raise BuildError(f"the fetched {go} does not run or is too old: {line!r}")
    return go, line


SETUP_COMMAND = ".venv/bin/python tests/cluster/setup.py"


def _build_c(go: Path, program: GoProgram, env: dict[str, str], folder: str, out: Path) -> None:
    """``folder``'s C program, from the module's source in the Go module cache, into ``out``."""
    listed = subprocess.run(
        [str(go), "list", "-m", "-f", "{{.Dir}}", program.module],
        cwd=program.directory, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if listed.returncode != 0:
        raise BuildError(f"go list -m {program.module} failed:\n{listed.stderr}")
    sources = sorted((Path(listed.stdout.strip()) / folder / "src").glob("*.c"))
    if not sources:
        raise BuildError(f"{program.module}: no {folder}/src/*.c in {listed.stdout.strip()}")
    # The flags of its own Makefile: static, so it runs in any mount namespace.
    argv = ["cc", "-std=c99", "-O2", "-Wall", "-static", "-s", "-o", str(out / folder),
            *map(str, sources)]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"cc of {program.module}'s {folder} failed:\n{proc.stderr[-4000:]}")


def build(program: GoProgram, cache: Path, *, allow_build: bool = True) -> Binaries:
    """The binaries of ``program``'s pinned release, built into ``cache`` unless already there.

    With ``allow_build`` off a missing build is an error naming the setup command: the tests
    must not spend their time limit on a build of minutes.
    """
    version = program.release()
    entry = cache / program.cache_key()
    bin_dir = entry / program.out
    record = entry / "build.json"
    not_built = BuildError(
        f"{program.module} {version} is not built in {entry} (go.mod or go.sum "
        f"changed, or setup never ran): run `{SETUP_COMMAND}` first"
    )
    if not allow_build and not entry.exists():
        raise not_built  # nobody builds it either: no folder to leave behind
    entry.mkdir(parents=True, exist_ok=True)
    with open(entry / ".lock", "w") as lock:
        # Two sessions starting at once: one builds, the other waits and finds the result.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if record.exists() and all((bin_dir / c).exists() for c in program.commands):
            cold = float(json.loads(record.read_text())["seconds"])
            return Binaries(version, bin_dir, 0.0, cold)
        if not allow_build:
            raise not_built
        # One toolchain folder for every lane: it does not depend on the pins.
        go, go_line = find_go(cache.parent.parent / "go", program.min_go())
        staging = entry / "bin.new"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        env = {
            **os.environ,
            # Static binaries, as the releases build them, unless the program needs C (CRI-O:
            # libseccomp).
            "CGO_ENABLED": "1" if program.cgo else "0",
            # go.mod and go.sum are committed: a build must never rewrite them.
            "GOFLAGS": "-mod=readonly -buildvcs=false",
        }
        tags = ["-tags", ",".join(program.tags)] if program.tags else []
        args = [
            str(go), "build", "-trimpath", *tags, "-ldflags", program.ldflags(version),
            "-o", f"{staging}/", *program.packages,
        ]  # fmt: skip
        start = time.monotonic()
        proc = subprocess.run(
            args, cwd=program.directory, env=env, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise BuildError(
                f"go build of {program.module} {version} failed (exit {proc.returncode}), "
                f"{go_line}:\n{proc.stdout}{proc.stderr[-6000:]}"
            )
        for folder in program.c_programs:
            _build_c(go, program, env, folder, staging)
        seconds = time.monotonic() - start
        missing = [c for c in program.commands if not (staging / c).exists()]
        if missing:
            raise BuildError(f"go build left no {', '.join(missing)} in {staging}")
        shutil.rmtree(bin_dir, ignore_errors=True)
        bin_dir.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(bin_dir)
        record.write_text(
            json.dumps({"version": version, "go": go_line, "seconds": round(seconds, 1)}) + "\n"
        )
        return Binaries(version, bin_dir, seconds, seconds)
