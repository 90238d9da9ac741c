"""Real CDI consumers and real devices for the end-to-end tests.

Podman 4.3, runc and the Go CDI library (0.5.2) are driven exactly as a node would drive
them; loop devices are created and removed through /dev/loop-control so the kernel emits real
uevents. Everything here keeps the machine clean: podman uses a private image store, its spec
folders are replaced by test folders inside a private mount namespace, and loop devices are
always removed again.

The module is named after what it provides rather than ``helpers`` because pytest puts every
test folder without ``__init__.py`` on ``sys.path``; a generic name could shadow another folder's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cdicheck.build import CDICHECK_SRC, GO_CDI_SRC, build_command
from podman_store import PodmanStore

REPO = Path(__file__).resolve().parents[2]
BUSYBOX = Path("/bin/busybox")
Json = dict[str, Any]  # a decoded JSON object from cdicheck or cdi-gen
IMAGE = "localhost/cdi-gen-test:1"

# The folders podman 4.3 reads; it has no option to change them, hence the mount namespace.
STATIC_DIR = Path("/etc/cdi")
DYNAMIC_DIR = Path(os.path.realpath("/var/run")) / "cdi"

# What scripts/setup.sh installs; named in failures so a missing tool is fixed, not skipped.
APT_HINT = "run `make test` as root: scripts/setup.sh test installs it from Debian's packages"


def require_tool(name: str) -> str:
    """Absolute path of a required program, or a test failure naming how to get it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"e2e: required program {name!r} not found on PATH; {APT_HINT}", False)
    return path


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("e2e: these tests need root (mount namespaces, loop devices, runc)", False)


def run(
    args: Sequence[str | Path],
    *,
    timeout: float = 60,
    check: bool = False,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a program and capture text output; with check, fail the test quoting both streams."""
    proc = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        input=input_text,
        check=False,
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, args))} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}",
            False,
        )
    return proc


def cdi_gen(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The cdi-gen command line of this checkout, as a user would call it."""
    return run([sys.executable, "-m", "cdi_gen", *args], timeout=timeout)


def doctor(
    work: Path,
    spec_dir: Path,
    runtime_dirs: Sequence[Path],
    *extra: str | Path,
    path: str | None = None,
) -> tuple[int, list[str]]:
    """``cdi-gen doctor`` on test folders alone: no CRI-O config, no kubelet, and (unless
    ``extra`` names a config) no devices. ``path``: the PATH it finds runtimes on; the code
    under test is the one this test runs. Returns (exit code, output lines)."""
    records = work / "no-devices.json"
    records.write_text("[]")
    if "--config" not in extra:
        extra = (*extra, "--records", records)
    env = None if path is None else {"PATH": path, "PYTHONPATH": ":".join(sys.path)}
    proc = run(
        [
            sys.executable, "-m", "cdi_gen", "doctor",
            "--spec-dir", spec_dir,
            *(a for d in runtime_dirs for a in ("--runtime-spec-dir", d)),
            "--crio-config", work / "no-crio.conf",
            "--device-plugin-dir", work,
            *extra,
        ],
        env=env,
    )  # fmt: skip
    return proc.returncode, (proc.stdout + proc.stderr).splitlines()


# ---------------------------------------------------------------------------------------------
# Loop devices


# Loop devices: tests/loopdev.py, shared with the integration tests and benchmarks.


# ---------------------------------------------------------------------------------------------
# Registry-free busybox image


def build_rootfs(dest: Path) -> Path:
    """A root file system made of Debian's static busybox and a link per applet."""
    if not BUSYBOX.exists():
        pytest.fail(f"e2e: {BUSYBOX} missing; {APT_HINT}", False)
    bindir = dest / "bin"
    bindir.mkdir(parents=True)
    shutil.copy2(BUSYBOX, bindir / "busybox")
    applets = run([BUSYBOX, "--list"], check=True).stdout.split()
    for applet in applets:
        link = bindir / applet
        if not link.exists():
            link.symlink_to("busybox")
    for d in ("dev", "proc", "sys", "tmp", "etc", "opt"):
        (dest / d).mkdir(exist_ok=True)
    return dest


def rootfs_tar(rootfs: Path, tar_path: Path) -> Path:
    with tarfile.open(tar_path, "w") as tar:
        for child in sorted(rootfs.iterdir()):
            tar.add(child, arcname=child.name)
    return tar_path


# ---------------------------------------------------------------------------------------------
# podman in a private mount namespace


@dataclass(frozen=True)
class SpecDirs:
    """Test folders that stand in for /etc/cdi (static) and /var/run/cdi (dynamic)."""

    static: Path
    dynamic: Path

    @classmethod
    def under(cls, base: Path) -> SpecDirs:
        dirs = cls(base / "etc-cdi", base / "run-cdi")
        dirs.static.mkdir(parents=True, exist_ok=True)
        dirs.dynamic.mkdir(parents=True, exist_ok=True)
        return dirs


def ensure_mount_points() -> None:
    """Bind mounts need existing targets; an empty folder is what a runtime install leaves."""
    for target in (STATIC_DIR, DYNAMIC_DIR):
        target.mkdir(parents=True, exist_ok=True)


def isolated(spec_dirs: SpecDirs, argv: Sequence[str | Path]) -> list[str]:
    """argv wrapped so that it sees the test folders as /etc/cdi and /var/run/cdi.

    The mounts live in a private mount namespace that dies with the command, so the machine's
    own spec folders are never read or written.
    """
    script = 'mount --bind "$1" "$3" && mount --bind "$2" "$4" && shift 4 && exec "$@"'
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        script,
        "sh",
        str(spec_dirs.static),
        str(spec_dirs.dynamic),
        str(STATIC_DIR),
        str(DYNAMIC_DIR),
        *map(str, argv),
    ]


@dataclass(frozen=True)
class Podman(PodmanStore):
    """podman with a private image store (tests/podman_store.py) holding the busybox image."""

    image: str = IMAGE

    def run_isolated(
        self, spec_dirs: SpecDirs, args: Sequence[str | Path], timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return run(isolated(spec_dirs, self.argv(args)), env=self.env(), timeout=timeout)

    def run_container(
        self,
        spec_dirs: SpecDirs,
        script: str,
        devices: Sequence[str] = (),
        extra: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        """``podman run --rm`` of a shell script in the test image with CDI devices."""
        args: list[str] = ["run", "--rm", "--network", "none"]
        for name in devices:
            args += ["--device", name]
        args += [*extra, self.image, "sh", "-c", script]
        return self.run_isolated(spec_dirs, args)


def setup_podman(home: Path) -> Podman:
    for tool in ("podman", "runc", "conmon", "unshare", "mount"):
        require_tool(tool)
    home.mkdir(parents=True, exist_ok=True)
    podman = Podman(home)
    podman.write_conf()
    ensure_mount_points()
    tar = rootfs_tar(build_rootfs(home / "rootfs"), home / "rootfs.tar")
    run(podman.argv(["import", tar, podman.image]), env=podman.env(), check=True)
    return podman


def run_podman_isolated(
    podman: Podman, spec_dirs: SpecDirs, args: Sequence[str | Path]
) -> subprocess.CompletedProcess[str]:
    """The brief's name for :meth:`Podman.run_isolated`."""
    return podman.run_isolated(spec_dirs, args)


# ---------------------------------------------------------------------------------------------
# The Go CDI library (through tests/e2e/cdicheck)


@dataclass(frozen=True)
class GoCDI:
    binary: Path

    def _json(self, args: Sequence[str | Path], ok_codes: tuple[int, ...] = (0,)) -> Json:
        proc = run([self.binary, *args])
        if proc.returncode not in ok_codes:
            pytest.fail(f"cdicheck {args} exited {proc.returncode}: {proc.stderr}", False)
        doc: Json = json.loads(proc.stdout)
        return doc

    def list(self, *dirs: Path) -> Json:
        """{"devices": {name: file}, "errors": {file: [msg]}, "conflicts": [...], "panic"?}"""
        return self._json(["list", *dirs])

    def validate(self, *files: Path) -> dict[str, Json]:
        """Per file: {"ok", "error"?, "panic"?, "kind", "devices"}."""
        files_doc: dict[str, Json] = self._json(["validate", *files])["files"]
        return files_doc

    def inject(self, config: Path, dirs: Sequence[Path], names: Sequence[str]) -> Json:
        return self._json(["inject", config, ":".join(map(str, dirs)), *names], ok_codes=(0, 1))


def build_cdicheck(workdir: Path) -> GoCDI:
    go = require_tool("go")
    if not GO_CDI_SRC.is_dir():
        pytest.fail(f"e2e: Go CDI library source {GO_CDI_SRC} missing; {APT_HINT}", False)
    workdir.mkdir(parents=True, exist_ok=True)
    argv, env, binary = build_command(go, workdir)
    run(argv, cwd=CDICHECK_SRC, env=env, timeout=300, check=True)
    return GoCDI(binary)


# ---------------------------------------------------------------------------------------------
# runc


@dataclass(frozen=True)
class Runc:
    root: Path  # private state folder, so containers never mix with the machine's

    def bundle(self, dest: Path, rootfs: Path, args: Sequence[str]) -> Path:
        """An OCI bundle from ``runc spec`` with our rootfs and a non-interactive process."""
        dest.mkdir(parents=True)
        run(["runc", "spec", "--bundle", dest], check=True)
        config_path = dest / "config.json"
        config = json.loads(config_path.read_text())
        config["root"] = {"path": str(rootfs), "readonly": True}
        config["process"]["terminal"] = False
        config["process"]["args"] = list(args)
        config_path.write_text(json.dumps(config, indent=2))
        return dest

    def run(self, bundle: Path, container_id: str) -> subprocess.CompletedProcess[str]:
        try:
            return run(["runc", "--root", self.root, "run", "--bundle", bundle, container_id])
        finally:
            # `runc run` deletes on exit; this covers a timeout or a crash half way.
            run(["runc", "--root", self.root, "delete", "--force", container_id])


# ---------------------------------------------------------------------------------------------
# cdi-gen configs


def loop_class_config(
    path: Path,
    kernel_names: Sequence[str],
    *,
    env: Sequence[str] = ("DEMO_DEVICE_IDS={name}",),
    mounts: Sequence[dict[str, object]] = (),
    vendor: str = "example.com",
    class_name: str = "loop",
    extra: dict[str, object] | None = None,
    extra_edits: dict[str, object] | None = None,
) -> Path:
    """A cdi-gen config with one class matching exactly the given loop devices.

    Exact kernel names rather than ``loop2[0-9][0-9]``: other suites create loop devices in
    the same range at the same time, and this test must not publish theirs. JSON is valid YAML,
    so the file is written with json.dumps and needs no quoting rules.
    """
    cls: dict[str, object] = {
        "name": class_name,
        "match": [{"subsystem": "block", "kernel": k} for k in kernel_names],
        "deviceName": "{kernel}",
        "containerEdits": {"env": list(env), "mounts": list(mounts), **(extra_edits or {})},
        **(extra or {}),
    }
    path.write_text(json.dumps({"vendor": vendor, "classes": [cls]}, indent=2) + "\n")
    return path
