"""The agent image from deploy/Containerfile, built without any registry and cached by its inputs.

No container registry is reachable from the project's machines, so the image's base is made
here from Debian's own packages (mmdebstrap, bookworm, python3 3.11 with venv, libudev1) and
handed to the unchanged Containerfile as ``--build-arg BASE=...``; the build itself may reach
Debian's mirror (apt-get) and PyPI (pip), as a user's build does. The result is saved as a
docker archive, which ``ctr -n k8s.io images import`` of containerd 1.7 accepts (so does an OCI
archive, but saving and importing one gzips and gunzips 360 MB: 26 s against 10 s).

Everything lives under /var/cache/cdi-gen-test/image, outside the checkout, named by a hash of
its inputs: the base by the Debian release, mirror, package list and the machine's CA bundle;
the agent image by the base, every file the Containerfile copies and the build arguments it
stamps into its labels: the package version, the source and the revision. The revision is the
last commit that changed those files (``-dirty`` when the checkout changes them further), so a
commit elsewhere in the repository does not rebuild the image, and the image never names a
commit whose files it does not hold. A warm run rebuilds nothing. Several sessions (worktrees)
may share the cache: a file lock serialises builds, and the few most recently used agent images
are kept, older ones removed.

Run it as a setup step (idempotent): ``python3 tests/cluster/image.py``; it prints the image
name and archive. A missing tool or a failed step raises :class:`ImageError` naming it; nothing
is skipped.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: make tests/ importable as pytest makes it (for podman_store), and the
    # repository root (for tests.lockfile).
    sys.path[:0] = [
        str(Path(__file__).resolve().parents[1]),
        str(Path(__file__).resolve().parents[2]),
    ]

from podman_store import PodmanStore

from tests.lockfile import lock_id

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("CDI_GEN_IMAGE_CACHE", "/var/cache/cdi-gen-test/image"))

DEBIAN_RELEASE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_VARIANT = "minbase"  # essential packages plus apt: the Containerfile runs apt-get
# python3 is Debian's 3.11 on bookworm (requires-python >= 3.11); python3-venv because the
# Containerfile installs into a venv; libudev1 for pyudev (the Containerfile installs it too,
# as it must on any base).
BASE_PACKAGES = ("python3", "python3-venv", "libudev1")
# What Debian's own slim images leave out (documentation, manuals, translations).
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)
BASE_NAME = "localhost/cdi-gen-base"
AGENT_NAME = "localhost/cdi-gen"
# The machine's trust anchors go into the base so that pip inside the build trusts what the
# host trusts (e.g. a TLS-intercepting egress proxy); on an ordinary machine it changes nothing.
CA_BUNDLE = Path(os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"))
IMAGE_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# What the Containerfile copies from the build context (see .containerignore), plus itself.
CONTAINERFILE = REPO / "deploy" / "Containerfile"
AGENT_INPUTS = (
    ".containerignore", "deploy/Containerfile", "pyproject.toml", "README.md", "requirements", "src"
)  # fmt: skip
KEEP_AGENT_IMAGES = 3
# Bumped when the recipe below changes in a way the inputs do not show.
RECIPE = "1"

APT_HINT = "apt-get install mmdebstrap podman runc conmon (.ci/run installs them)"

Log = Callable[[str], None]


class ImageError(RuntimeError):
    """The image could not be had; the message names the step or the missing tool, and why."""


@dataclass(frozen=True)
class Stamp:
    """What the image says about itself: build arguments of deploy/Containerfile."""

    version: str
    revision: str
    source: str
    #: the id of the lock it installs (requirements/, as scripts/setup.sh --lock-id prints it)
    lock: str

    def build_args(self) -> list[str]:
        return [f"--build-arg={k.upper()}={v}" for k, v in vars(self).items()]


@dataclass(frozen=True)
class AgentImage:
    """The built agent image: its name, the archive for containerd, the podman store holding it."""

    name: str
    archive: Path
    podman: PodmanStore
    stamp: Stamp

    @property
    def tag(self) -> str:
        return self.name.rsplit(":", 1)[1]


def _hash_json(doc: object) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _context_files(root: Path, rel: str) -> Iterator[Path]:
    """The files under ``rel`` that the build context admits (.containerignore drops bytecode)."""
    top = root / rel
    if top.is_file():
        yield top
        return
    for path in sorted(top.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield path


def base_key(ca_bundle: Path = CA_BUNDLE) -> str:
    return _hash_json(
        {
            "recipe": RECIPE,
            "release": DEBIAN_RELEASE,
            "mirror": DEBIAN_MIRROR,
            "variant": DEBIAN_VARIANT,
            "packages": sorted(BASE_PACKAGES),
            "dpkg": list(DPKG_EXCLUDES),
            "ca": _file_digest(ca_bundle) if ca_bundle.is_file() else None,
        }
    )


def _git(root: Path, *args: str) -> str | None:
    """``git``'s output in ``root``; None where it fails (a copy of the checkout without .git)."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def stamp(root: Path = REPO) -> Stamp:
    version = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    revision = _git(root, "log", "-1", "--format=%H", "--", *AGENT_INPUTS) or "unknown"
    if revision != "unknown" and _git(root, "status", "--porcelain", "--", *AGENT_INPUTS):
        revision += "-dirty"
    source = _git(root, "config", "--get", "remote.origin.url") or "unknown"
    lock = lock_id(root / "requirements")
    return Stamp(version, revision, source, lock)


def agent_key(base: str, root: Path = REPO, labels: Stamp | None = None) -> str:
    files = {}
    for rel in AGENT_INPUTS:
        if not (root / rel).exists():
            raise ImageError(f"agent image input {root / rel} missing")
        for path in _context_files(root, rel):
            files[str(path.relative_to(root))] = _file_digest(path)
    labels = labels or stamp(root)
    return _hash_json({"recipe": RECIPE, "base": base, "files": files, "stamp": vars(labels)})


def _require_tools() -> None:
    if os.geteuid() != 0:
        raise ImageError("building the agent image needs root (mmdebstrap, podman)")
    missing = [t for t in ("mmdebstrap", "podman", "runc", "conmon") if not shutil.which(t)]
    if missing:
        raise ImageError(f"missing program(s) {', '.join(missing)}: {APT_HINT}")


def _run(
    argv: Sequence[str | Path],
    what: str,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 1800,
) -> str:
    try:
        proc = subprocess.run(
            [str(a) for a in argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImageError(f"{what}: {shlex.join(map(str, argv))}: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise ImageError(f"{what}: {shlex.join(map(str, argv))} exited {proc.returncode}:\n{tail}")
    return proc.stdout


@contextmanager
def _locked(cache: Path) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _image_exists(podman: PodmanStore, name: str) -> bool:
    argv = podman.argv(["image", "exists", name])
    return subprocess.run(argv, env=podman.env(), capture_output=True, check=False).returncode == 0


def _build_base_tar(dest: Path, ca_bundle: Path) -> None:
    """A minbase Debian root file system with the base packages, as one tarball."""
    partial = dest.with_name(dest.name + ".partial")
    partial.unlink(missing_ok=True)
    argv: list[str | Path] = [
        "mmdebstrap",
        "--mode=root",
        f"--variant={DEBIAN_VARIANT}",
        f"--include={','.join(BASE_PACKAGES)}",
        "--format=tar",
        *(f"--dpkgopt={option}" for option in DPKG_EXCLUDES),
    ]
    if ca_bundle.is_file():
        target = f'"$1"{IMAGE_CA_BUNDLE}'
        argv.append(
            "--customize-hook="
            f'mkdir -p "$1"{os.path.dirname(IMAGE_CA_BUNDLE)} && '
            f"cp {shlex.quote(str(ca_bundle))} {target}"
        )
    argv += [DEBIAN_RELEASE, partial, DEBIAN_MIRROR]
    try:
        _run(argv, f"mmdebstrap of Debian {DEBIAN_RELEASE}")
    except ImageError:
        partial.unlink(missing_ok=True)
        raise
    partial.rename(dest)


def _ensure_base(cache: Path, podman: PodmanStore, log: Log) -> str:
    key = base_key()
    name = f"{BASE_NAME}:{key}"
    if _image_exists(podman, name):
        return name
    tar = cache / f"base-{key}.tar"
    if not tar.exists():
        start = time.monotonic()
        _build_base_tar(tar, CA_BUNDLE)
        log(f"base root file system built in {time.monotonic() - start:.1f} s: {tar}")
    start = time.monotonic()
    changes = [
        "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV=LANG=C.UTF-8",
    ]
    if CA_BUNDLE.is_file():
        # pip brings its own CA list (certifi) unless told otherwise.
        changes += [f"ENV=PIP_CERT={IMAGE_CA_BUNDLE}", f"ENV=SSL_CERT_FILE={IMAGE_CA_BUNDLE}"]
    argv: list[str | Path] = ["import"]
    for change in changes:
        argv += ["--change", change]
    _run(podman.argv([*argv, tar, name]), "podman import of the base", env=podman.env())
    log(f"base image {name} imported in {time.monotonic() - start:.1f} s")
    for old in cache.glob("base-*.tar"):
        if old != tar:
            old.unlink()
    return name


def _prune(cache: Path, podman: PodmanStore, keep: str) -> None:
    """Keep the most recently used agent images (other sessions may be using them)."""
    archives = sorted(cache.glob("agent-*.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in archives[KEEP_AGENT_IMAGES:]:
        if old.name == keep:
            continue
        tag = old.name.removeprefix("agent-").removesuffix(".tar")
        subprocess.run(
            podman.argv(["rmi", "--force", f"{AGENT_NAME}:{tag}"]),
            env=podman.env(),
            capture_output=True,
            check=False,
        )
        old.unlink(missing_ok=True)
    # Intermediate layers of removed images; the base and the kept images stay.
    subprocess.run(
        podman.argv(["image", "prune", "--force"]),
        env=podman.env(),
        capture_output=True,
        check=False,
    )


def ensure_agent_image(cache: Path = CACHE, log: Log = print) -> AgentImage:
    """The agent image for this checkout, built (or loaded) only if the cache lacks it."""
    _require_tools()
    podman = PodmanStore(cache / "podman")
    with _locked(cache):
        podman.write_conf()
        base = _ensure_base(cache, podman, log)
        labels = stamp()
        key = agent_key(base.rsplit(":", 1)[1], labels=labels)
        name = f"{AGENT_NAME}:{key}"
        archive = cache / f"agent-{key}.tar"
        in_store = _image_exists(podman, name)
        if not in_store and archive.exists():
            _run(podman.argv(["load", "-i", archive]), "podman load", env=podman.env())
            in_store = True
        if not in_store:
            start = time.monotonic()
            _run(
                podman.argv(
                    [
                        "build",
                        "--pull=never",
                        # the build's RUN steps need the network; the host's is enough and
                        # creates no bridge on a shared machine
                        "--network=host",
                        "-f",
                        CONTAINERFILE,
                        "--build-arg",
                        f"BASE={base}",
                        *labels.build_args(),
                        "-t",
                        name,
                        REPO,
                    ]
                ),
                "podman build -f deploy/Containerfile",
                env=podman.env(),
                cwd=REPO,
            )
            log(f"agent image {name} built in {time.monotonic() - start:.1f} s")
        if not archive.exists():
            start = time.monotonic()
            partial = archive.with_name(archive.name + ".partial")
            partial.unlink(missing_ok=True)
            _run(
                podman.argv(["save", "--format", "docker-archive", "-o", partial, name]),
                "podman save",
                env=podman.env(),
            )
            partial.rename(archive)
            log(f"agent image saved in {time.monotonic() - start:.1f} s: {archive}")
        archive.touch()  # most recently used: kept by _prune
        _prune(cache, podman, archive.name)
    return AgentImage(name, archive, podman, labels)


def image_size(image: AgentImage) -> int:
    """Size in bytes of the image as podman stores it (all layers, uncompressed)."""
    out = _run(
        image.podman.argv(["image", "inspect", "--format", "{{.Size}}", image.name]),
        "podman image inspect",
        env=image.podman.env(),
    )
    return int(out.strip())


def main() -> int:
    start = time.monotonic()
    try:
        image = ensure_agent_image()
    except ImageError as exc:
        print(f"tests/cluster/image.py: {exc}", file=sys.stderr)
        return 1
    print(f"agent image {image.name} ({image_size(image) / 1e6:.0f} MB)")
    print(f"archive {image.archive} ({image.archive.stat().st_size / 1e6:.0f} MB)")
    print(f"ready in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
