"""Container runtime releases and the newest ``cdiVersion`` each one can read.

A runtime embeds the Go CDI library; a spec whose ``cdiVersion`` is newer than that library
knows is refused as a whole, and only when a container is created, far from its cause (the
most reported CDI failure in the peers' trackers). This module answers "can the runtime on
this node read this spec?" before that happens: it finds each runtime's version and the CDI
library it was built with, in this order of trust:

1. the Go build information in the runtime's binary, which names the CDI module and its
   version exactly (upstream release binaries and anything built with Go modules carry it);
2. a known distribution build (Debian builds from its own packaged library; the library's
   version is the package's ``Built-Using``);
3. the release table below, by the runtime's own version.

Where no binary answers (the agent in a pod sees none), the caller may look elsewhere: the
CRI adapter (``kubelet.cri``) asks the runtime's socket for its name and version, and
:func:`from_cri` maps that answer onto the table like a ``NAME@VERSION`` reference.

A network interface (``netDevices``, cdiVersion 1.1.0) needs more than a library that reads
the field: the library copies it into the OCI ``linux.netDevices`` field, which runc applies
from 1.4.0 on (its ``features.go`` and ``libcontainer/specconv`` read it; runc 1.3 ignores
it and the container starts without the interface). The runc version is known where it is
named (``containerd@2.3.7,runc@1.4.0``) or, for containerd, whose default shim runs the
``runc`` on PATH, where that binary answers; CRI-O and podman may run crun, so for them it
is known only when named.

A :class:`Ceiling` is what the node's runtimes read together: unpinned, a device needing more
is left out of its class's spec rather than making the runtime refuse the whole file.

The table is the single place these facts live. Source: the ``require`` of
``container-device-interface`` in each runtime's ``go.mod`` at its release tags, read with
``go mod graph`` / ``go list -m`` through the Go module proxy (containerd, podman) and from the
release tags of the CRI-O repository, on 2026-11-30. A row holds from its release up to the
next row of the same runtime.
"""

from __future__ import annotations

import dataclasses
import mmap
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cdi_gen.cdi.version import (
    KNOWN_VERSIONS,
    NET_DEVICES,
    Requirement,
    minimum_of,
    requirements,
)
from cdi_gen.errors import ConfigError, Problem, quote

if TYPE_CHECKING:
    from cdi_gen.cdi.spec import Spec  # annotations only: the models are built on first use

Version = tuple[int, ...]

#: The Go module paths of the CDI library, old and new.
CDI_MODULES = (
    "tags.cncf.io/container-device-interface",
    "github.com/container-orchestrated-devices/container-device-interface",
)
RUNTIMES = ("containerd", "cri-o", "podman")
#: The first runc release that applies the OCI ``linux.netDevices`` field (runc v1.4.0 in the
#: Go module cache: features.go lists it, libcontainer/specconv converts it; read 2026-12-06).
RUNC_NET_DEVICES: tuple[int, ...] = (1, 4, 0)
#: The binary that reports each runtime's version.
BINARIES = {"containerd": "containerd", "cri-o": "crio", "podman": "podman"}


@dataclass(frozen=True, slots=True)
class Release:
    """From ``first`` on (to the next row of the same runtime), ``runtime`` embeds ``library``."""

    runtime: str
    first: Version
    library: str


RELEASES: tuple[Release, ...] = (
    Release("containerd", (1, 7, 0), "0.5.4"),
    Release("containerd", (1, 7, 12), "0.6.1"),
    Release("containerd", (1, 7, 15), "0.6.2"),
    Release("containerd", (1, 7, 16), "0.7.2"),
    Release("containerd", (1, 7, 27), "0.8.1"),
    Release("containerd", (2, 0, 0), "0.8.0"),
    Release("containerd", (2, 0, 4), "0.8.1"),
    Release("containerd", (2, 0, 5), "1.0.0"),
    Release("containerd", (2, 1, 0), "1.0.1"),
    # 2.2.1 up to 2.3.7 (the current LTS; go.mod of v2.3.0 and v2.3.7 read 2026-12-01).
    Release("containerd", (2, 2, 1), "1.1.0"),
    Release("cri-o", (1, 28, 0), "0.6.0"),
    Release("cri-o", (1, 29, 0), "0.6.2"),
    Release("cri-o", (1, 30, 0), "0.7.2"),
    Release("cri-o", (1, 31, 0), "0.8.0"),
    Release("cri-o", (1, 32, 2), "0.8.1"),
    Release("cri-o", (1, 33, 0), "1.0.1"),
    # 1.35.0 up to 1.36.3, the cluster tests' crio lane: v1.36.3's go.mod requires 1.1.0
    # (read 2026-12-01 from the module proxy, which serves exact CRI-O tags only).
    Release("cri-o", (1, 35, 0), "1.1.0"),
    Release("podman", (4, 3, 1), "0.5.2"),
    Release("podman", (4, 4, 0), "0.5.3"),
    Release("podman", (4, 5, 0), "0.5.4"),
    Release("podman", (4, 7, 0), "0.6.1"),
    Release("podman", (4, 8, 0), "0.6.2"),
    Release("podman", (5, 1, 0), "0.7.2"),
    Release("podman", (5, 2, 0), "0.8.0"),
    Release("podman", (5, 5, 0), "1.0.1"),
)

#: Distribution builds that embed another library than the upstream release of the same
#: version, by the exact version string the binary prints.
DISTRIBUTION_BUILDS: dict[tuple[str, str], tuple[str, str]] = {
    # Debian 13's containerd 1.7.24~ds1-6+deb13u1 is built against Debian's packaged library:
    # Built-Using: golang-tags.cncf-container-device-interface (= 0.8.0-5); upstream 1.7.24
    # embeds 0.7.2. Measured here: it accepts cdiVersion 0.8.0.
    ("containerd", "1.7.24~ds1"): ("0.8.0", "Debian 13 build, Built-Using CDI library 0.8.0"),
}


def parse_release(text: str) -> Version:
    """``"v1.7.24~ds1"`` → ``(1, 7, 24)``; ValueError when there is no X.Y.Z in it."""
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", text.strip())
    if m is None:
        # quote(): the text may come from a socket or a binary's output, of any length.
        raise ValueError(f"{quote(text)} is not a version X.Y.Z")
    return (int(m[1]), int(m[2]), int(m[3]))


def spec_version_of_library(library: str) -> str:
    """The newest ``cdiVersion`` a CDI library release reads: its major.minor, patch 0.

    Every library release from 0.5 on reads exactly the specification versions up to its own
    major.minor (``specs-go`` CurrentVersion); patch releases add none.
    """
    major, minor, _ = parse_release(library)
    version = f"{major}.{minor}.0"
    if version not in KNOWN_VERSIONS:
        # A library newer than this cdi-gen: it reads everything cdi-gen can write.
        return KNOWN_VERSIONS[-1]
    return version


@dataclass(frozen=True, slots=True)
class Runtime:
    """A runtime release and the newest ``cdiVersion`` it reads (None: no CDI at all)."""

    name: str
    version: str
    limit: str | None
    #: How the limit is known: which library, from where.
    source: str
    #: The runc it runs, where known (named, or on PATH beside containerd); None: unknown.
    runc: str | None = None

    def describe(self) -> str:
        # The runc goes last, inside the brackets: "<name> <version> (" starts every line
        # that names a runtime, whatever is known of its runc.
        runc = f"; runs runc {self.runc}" if self.runc else ""
        shown = f"{self.name} {self.version}"
        if self.limit is None:
            return f"{shown} (no CDI support; {self.source}{runc})"
        return f"{shown} (reads cdiVersion <= {self.limit}; {self.source}{runc})"


def canonical_name(name: str) -> str:
    """``crio`` and ``cri-o`` are one runtime; anything unknown is a ConfigError."""
    lowered = name.strip().lower()
    if lowered == "crio":
        lowered = "cri-o"
    if lowered not in RUNTIMES:
        raise ConfigError(f"unknown runtime {quote(name, 40)}, known: {', '.join(RUNTIMES)}")
    return lowered


def from_table(name: str, version: str, library: str | None = None, source: str = "") -> Runtime:
    """The runtime ``name`` at ``version``; ``library`` (from build info) overrides the table."""
    name = canonical_name(name)
    try:
        release = parse_release(version)
    except ValueError as exc:
        raise ConfigError(f"{name} version: {exc}") from None
    shown = version.strip().removeprefix("v")
    if library is not None:
        return Runtime(name, shown, spec_version_of_library(library), source)
    distro = DISTRIBUTION_BUILDS.get((name, shown.split()[0]))
    if distro is not None:
        return Runtime(name, shown, distro[0], distro[1])
    rows = [r for r in RELEASES if r.runtime == name and r.first <= release]
    if not rows:
        first = min(r.first for r in RELEASES if r.runtime == name)
        return Runtime(name, shown, None, f"CDI arrived in {name} {'.'.join(map(str, first))}")
    row = max(rows, key=lambda r: r.first)
    return Runtime(
        name,
        shown,
        spec_version_of_library(row.library),
        f"CDI library {row.library}, release table",
    )


def parse_reference(text: str) -> Runtime:
    """``containerd@1.7.24`` (as given to ``--runtime`` or ``validate --for``) → its Runtime;
    ``containerd@2.3.7,runc@1.4.0`` also names the runc it runs."""
    head, comma, tail = text.partition(",")
    name, sep, version = head.partition("@")
    if not sep or not version:
        raise ConfigError(f"runtime {text[:60]!r}: expected NAME@VERSION, e.g. containerd@1.7.24")
    runtime = from_table(name, version)
    if not comma:
        return runtime
    oci, sep, runc = tail.partition("@")
    if oci != "runc" or not sep:
        raise ConfigError(
            f"runtime {text[:60]!r}: after ',' expected runc@VERSION, "
            "e.g. containerd@2.3.7,runc@1.4.0"
        )
    try:
        parse_release(runc)
    except ValueError as exc:
        raise ConfigError(f"runc version: {exc}") from None
    return dataclasses.replace(runtime, runc=runc.strip().removeprefix("v"))


def net_devices_problem(runtime: Runtime) -> str | None:
    """Why ``runtime`` would start a container without the interfaces its ``netDevices`` name
    (None: it applies them, or its runc is unknown). Its CDI library's limit is the
    :class:`Ceiling`'s business; this is the runc under it."""
    if runtime.runc is None or parse_release(runtime.runc) >= RUNC_NET_DEVICES:
        return None
    first = ".".join(map(str, RUNC_NET_DEVICES))
    return (
        f"{runtime.name} {runtime.version} runs runc {runtime.runc}, which ignores netDevices "
        f"(runc applies OCI linux.netDevices from {first}): the interface would stay on the host"
    )


def from_cri(runtime_name: str, runtime_version: str, where: str) -> Runtime:
    """The runtime a CRI ``RuntimeService/Version`` answer names (``containerd``/``v2.3.7``,
    ``cri-o``/``1.36.3``), through the table as ``containerd@2.3.7`` would be.

    Raises :class:`ConfigError` quoting a name or version that is not one of ours.
    """
    runtime = from_table(runtime_name, runtime_version)
    return dataclasses.replace(runtime, source=f"{runtime.source}; version from the CRI at {where}")


#: Looks where binaries are not visible: the runtimes found, and one line per place asked
#: that gave none (why).
Lookup = Callable[[], tuple[list[Runtime], list[str]]]


def go_module_versions(binary: Path) -> dict[str, str]:
    """The module dependencies recorded in a Go binary's build information ({} if none).

    Go 1.18+ binaries hold a header starting ``\\xff Go buildinf:`` (16-byte aligned); with
    flag bit 2 set, two varint-length-prefixed strings follow at offset 32: the Go version
    and the module information, whose ``dep`` lines are ``dep<TAB>path<TAB>version``
    (a ``=>`` line after one gives the replacement actually built).
    """
    try:
        with binary.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            start = data.find(b"\xff Go buildinf:")
            while start != -1 and start % 16:
                start = data.find(b"\xff Go buildinf:", start + 1)
            if start == -1 or not data[start + 15] & 0x2:
                return {}
            pos = start + 32
            texts: list[str] = []
            for _ in range(2):
                length, shift = 0, 0
                while True:
                    byte = data[pos]
                    pos += 1
                    length |= (byte & 0x7F) << shift
                    shift += 7
                    if not byte & 0x80:
                        break
                texts.append(data[pos : pos + length].decode("utf-8", "replace"))
                pos += length
    except (OSError, ValueError, IndexError):
        return {}
    deps: dict[str, str] = {}
    last = ""
    for line in texts[1].splitlines():
        fields = line.split("\t")
        if fields[0] == "dep" and len(fields) >= 3:
            last = fields[1]
            deps[last] = fields[2]
        elif fields[0] == "=>" and len(fields) >= 3 and last and fields[2] not in ("", "(devel)"):
            # A replacement by another module version is what was built; one by a local
            # folder has none ("(devel)"), and the required one is the best there is.
            deps[last] = fields[2]
    return deps


def _version_output(binary: str) -> str | None:
    try:
        proc = subprocess.run(
            [binary, "--version"], check=False, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout + proc.stderr


def version_from_output(name: str, output: str) -> str | None:
    """The version in a runtime's ``--version`` output, as printed (``1.7.24~ds1``)."""
    if name == "containerd":
        # "containerd github.com/containerd/containerd[/v2] v2.2.1 <revision>"
        m = re.search(r"^containerd \S+ v?(\d+\.\d+\.\d+\S*)", output, re.M)
    else:
        # podman: "podman version 4.3.1"; CRI-O: "crio version 1.30.0" or "Version:  1.30.0"
        m = re.search(r"(?i)version:?\s+v?(\d+\.\d+\.\d+\S*)", output)
    return m[1] if m else None


def detect(name: str) -> Runtime | None:
    """The runtime ``name`` installed here (None when its binary is not on PATH)."""
    name = canonical_name(name)
    path = shutil.which(BINARIES[name])
    if path is None:
        return None
    output = _version_output(path)
    version = version_from_output(name, output or "")
    if version is None:
        raise ConfigError(f"{path} --version: no version in {(output or '').strip()[:80]!r}")
    deps = go_module_versions(Path(path))
    runtime = from_table(name, version)
    for module in CDI_MODULES:
        if module in deps:
            library = deps[module].removeprefix("v")
            runtime = from_table(
                name, version, library, f"CDI library {library}, build info of {path}"
            )
            break
    # containerd's default shim (io.containerd.runc.v2) runs the runc on PATH; CRI-O and
    # podman may be set up with crun, so their runc is known only when named.
    runc = runc_version() if name == "containerd" else None
    return dataclasses.replace(runtime, runc=runc) if runc else runtime


def runc_version() -> str | None:
    """The version of the ``runc`` on PATH (None: none there, or no version in its output)."""
    path = shutil.which("runc")
    output = _version_output(path) if path is not None else None
    m = re.search(r"^runc version v?(\d+\.\d+\.\d+\S*)", output or "", re.M)
    return m[1] if m else None


def detect_all(explicit: Sequence[str] = ()) -> list[Runtime]:
    """The runtimes of this node: the ``NAME@VERSION`` references given, else every runtime
    whose binary is on PATH."""
    if explicit:
        return [parse_reference(text) for text in explicit]
    found = [detect(name) for name in RUNTIMES]
    return [r for r in found if r is not None]


def runtimes_or_fallback(
    explicit: Sequence[str] = (), fallback: Lookup | None = None
) -> tuple[list[Runtime], list[str]]:
    """:func:`detect_all`, then ``fallback`` when it found nothing (and none was named): the
    runtimes, and the fallback's lines on why it found none where it looked."""
    found = detect_all(explicit)
    if found or explicit or fallback is None:
        return found, []
    return fallback()


def node_limit(runtimes: Iterable[Runtime], notes: Sequence[str] = ()) -> str:
    """The newest ``cdiVersion`` every runtime given reads (a spec must suit all of them).

    Raises ConfigError when there is no runtime, or none with CDI; ``notes`` (why a lookup
    beyond PATH found none) join its line.
    """
    listed = list(runtimes)
    limits = [r.limit for r in listed if r.limit is not None]
    if not listed:
        raise ConfigError(
            "cdiVersion runtime: no container runtime found (containerd, crio, podman on PATH"
            + "".join(f"; {note}" for note in notes)
            + "); name it with --runtime NAME@VERSION, e.g. containerd@1.7.24"
        )
    if len(limits) < len(listed):
        broken = ", ".join(r.describe() for r in listed if r.limit is None)
        raise ConfigError(f"cdiVersion runtime: {broken}")
    return min(limits, key=KNOWN_VERSIONS.index)


@dataclass(frozen=True, slots=True)
class Ceiling:
    """The newest ``cdiVersion`` the node's runtimes read, and the runtime that reads least.

    Without a pin a spec is stated at the minimum its content needs; where the node's
    runtimes are known, content needing more than this is left out (the device, never its
    class: one device's field would otherwise make the runtime refuse the class's whole
    file, as ``doctor`` reports only afterwards).
    """

    limit: str
    runtime: Runtime
    #: Why a runtime of the node would not move a network interface (None: none known).
    net_devices: str | None = None

    def problems(self, reqs: Iterable[Requirement]) -> list[Problem]:
        """Why content with ``reqs`` cannot be read here (each field needing more, named),
        or, for ``netDevices``, would be read and not applied."""
        r = self.runtime
        reqs = list(reqs)
        problems = [
            Problem(
                req.path,
                f"{req.reason} needs cdiVersion {req.version} or newer, and {r.name} "
                f"{r.version} on this node reads at most {self.limit} ({r.source}): it would "
                "refuse the class's whole spec",
            )
            for req in too_new(reqs, self.limit)
        ]
        if not problems and self.net_devices is not None:
            # Read, and ignored: the pod would start without its interface.
            problems = [Problem(q.path, self.net_devices) for q in reqs if q.reason == NET_DEVICES]
        return problems


def too_new(reqs: Iterable[Requirement], limit: str) -> list[Requirement]:
    """The lower bounds of ``reqs`` above ``limit``: what a runtime reading ``limit`` lacks
    (the doctor's check of a spec on disk and the ceiling of one being built both ask)."""
    top = KNOWN_VERSIONS.index(limit)
    return [r for r in reqs if not r.at_most and KNOWN_VERSIONS.index(r.version) > top]


def ceiling_of(runtimes: Iterable[Runtime]) -> Ceiling | None:
    """The :class:`Ceiling` of the runtimes given (None for none with CDI: ``doctor`` names
    a runtime without CDI, and a node whose runtimes are unknown keeps the minimum)."""
    known = [r for r in runtimes if r.limit is not None]
    if not known:
        return None
    least = min(known, key=lambda r: KNOWN_VERSIONS.index(r.limit or ""))
    assert least.limit is not None
    net = next((p for r in known if (p := net_devices_problem(r)) is not None), None)
    return Ceiling(least.limit, least, net)


def readability_problems(spec: Spec, runtime: Runtime) -> list[Problem]:
    """Why ``runtime`` cannot read ``spec`` (empty when it can), naming what needs the version.

    The runtime's library refuses a ``cdiVersion`` newer than its own, whatever the content;
    so the spec's declared version decides, and the fields that need more than the runtime's
    limit (if any) say whether the file could be written for this runtime at all.
    """
    if runtime.limit is None:
        return [Problem("cdiVersion", f"{runtime.describe()}: it reads no CDI spec")]
    declared = spec.cdi_version
    if KNOWN_VERSIONS.index(declared) <= KNOWN_VERSIONS.index(runtime.limit):
        return []
    reqs = [r for r in requirements(spec) if not r.at_most]
    lacking = too_new(reqs, runtime.limit)
    if lacking:
        first = max(lacking, key=lambda r: KNOWN_VERSIONS.index(r.version))
        why = f"{first.path} ({first.reason}) needs {first.version}" + (
            f" and {len(lacking) - 1} more field(s)" if len(lacking) > 1 else ""
        )
    else:
        why = f"nothing in it needs more than {minimum_of(reqs)}: write it with that version"
    return [
        Problem(
            "cdiVersion",
            f"{declared} is newer than {runtime.name} {runtime.version} reads "
            f"(<= {runtime.limit}, {runtime.source}); {why}",
        )
    ]
