"""Podman host mode and network interfaces (issue 57): ``podman run --device
example.com/veth=<name>`` for a net class, with podman pointed at runc 1.5 (built from its Go
module for the cluster lanes, ``tests/cluster/lane.py``; it applies OCI ``linux.netDevices``).

This machine's podman is Debian 12's 4.3, whose CDI library (0.5.2) reads cdiVersion 0.5.0 at
most, and a spec moving an interface needs 1.1.0: whatever runc runs under it, podman 4.3
cannot move the interface. So this is the refusal on both sides: cdi-gen, finding podman 4.3
on the node, leaves the interface out with one line naming podman and the need; a spec
pinned to 1.1.0 (the user's word) is refused by podman itself, while the same podman and runc
run a container without the device, so the refusal is the CDI library's, not runc's, and the
interface stays on the host.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from consumers import Podman, SpecDirs, cdi_gen

from tests.cluster.lane import CURRENT

VENDOR = "example.com"
CLASS = "veth"
#: Test-owned names, unique per process (at most 15 bytes: IFNAMSIZ).
HOST_END = f"cge{os.getpid() % 100000}h"


@pytest.fixture
def veth() -> Iterator[str]:
    """A veth pair whose host end (returned) the class matches; deleted at the end."""
    subprocess.run(["ip", "link", "del", HOST_END], capture_output=True, check=False)
    subprocess.run(
        ["ip", "link", "add", HOST_END, "type", "veth", "peer", "name", HOST_END[:-1] + "p"],
        capture_output=True,
        check=True,
    )
    try:
        yield HOST_END
    finally:
        subprocess.run(["ip", "link", "del", HOST_END], capture_output=True, check=False)


def _config(path: Path, host_end: str) -> Path:
    cls = {
        "name": CLASS,
        "match": {"subsystem": "net", "kernel": host_end},
        "deviceName": "{kernel}",
        "netDevice": {"name": "net0"},
    }
    path.write_text(json.dumps({"vendor": VENDOR, "classes": [cls]}))
    return path


def test_podman_4_3_cannot_move_an_interface_and_both_sides_say_so(
    podman: Podman, spec_dirs: SpecDirs, veth: str, tmp_path: Path
) -> None:
    runc = CURRENT.runc(allow_build=False)
    config = _config(tmp_path / "config.json", veth)
    out = spec_dirs.dynamic / f"{VENDOR}-{CLASS}.json"

    unpinned = cdi_gen(
        "render", "--vendor", VENDOR, "--class", CLASS, "--config", config, "--output", out
    )
    assert unpinned.returncode != 0
    (line,) = [x for x in unpinned.stderr.splitlines() if "left out of the spec" in x]
    assert f"device '{veth}'" in line and "netDevices needs cdiVersion 1.1.0" in line, line
    assert "podman 4.3" in line, line
    assert not out.exists()

    pinned = cdi_gen(
        "render", "--vendor", VENDOR, "--class", CLASS, "--config", config,
        "--cdi-version", "1.1.0", "--output", out,
    )  # fmt: skip
    assert pinned.returncode == 0, pinned.stderr
    (device,) = json.loads(out.read_text())["devices"]
    assert device["containerEdits"]["netDevices"] == [{"hostInterfaceName": veth, "name": "net0"}]

    base = ["--runtime", runc, "run", "--rm", podman.image, "sh", "-c"]
    plain = podman.run_isolated(spec_dirs, [*base, "ls /sys/class/net"])
    assert plain.returncode == 0, f"podman 4.3 under {runc}: {plain.stderr}"
    refused = podman.run_isolated(
        spec_dirs,
        [*base[:4], "--device", f"{VENDOR}/{CLASS}={veth}", *base[4:], "ls /sys/class/net"],
    )
    assert refused.returncode != 0
    assert "unresolvable CDI devices" in refused.stderr, refused.stderr
    assert Path("/sys/class/net", veth).exists(), "the interface left the host"
