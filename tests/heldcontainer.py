"""A "container" for the tests of a device that comes back, with the real kernel and no
runtime: a real process in a private mount namespace with its own tmpfs on ``/dev`` holding
the node of a loop device, in a fresh cgroup v1 devices child and a fresh cgroup v2 child
whose device program holds the runtime's rules (runc's defaults and the loop device's
numbers). Shared by tests/integration/test_follow_real.py, test_when_back_real.py and the
benchmark of ``whenBack``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from cdi_gen.agent.follow import Holder
from cdi_gen.containernode.node import ContainerProcess
from cdi_gen.devcgroup.cgroupv1 import DEVICES_HIERARCHY, DevicesCgroup
from cdi_gen.devcgroup.cgroupv2 import UNIFIED_HIERARCHY, ProgramCgroup
from cdi_gen.devcgroup.rules import parse_oci_devices, with_runc_defaults
from tests.processes import terminate

PATH = "/dev/held"
CONTENT = b"cdi-gen follow test\n" * 26
#: The container: /dev a tmpfs with the held device's node; one statement per line.
CONTAINER = """
import errno, json, os, stat, subprocess, sys
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "cdi-gen-test-dev", "/dev"], check=True)
os.mknod("/dev/held", stat.S_IFBLK | 0o660, os.makedev(7, int(sys.argv[1])))
print("ready", flush=True)
def read(path):
    try:
        with open(path, "rb") as f:
            return f.read(20).decode()
    except OSError as e:
        return errno.errorcode[e.errno]
for line in sys.stdin:
    out = None
    try:
        exec(line)
        print(json.dumps({"out": out}), flush=True)
    except Exception as e:
        print(json.dumps({"error": repr(e)}), flush=True)
"""


class Container:
    """A process in its own mount namespace and its own v1 and v2 device cgroups."""

    def __init__(self, minor: int) -> None:
        assert shutil.which("unshare") and shutil.which("mount"), "needs util-linux"
        self.cgroup = f"/cdi-gen-test-{uuid.uuid4().hex[:12]}"
        #: The OCI spec's ``linux.resources.devices``, as a runtime would report them.
        self.oci_rules: list[dict[str, Any]] = [
            {"allow": False, "access": "rwm"},
            {"allow": True, "type": "b", "major": 7, "minor": minor, "access": "rw"},
        ]
        self.rules = with_runc_defaults(parse_oci_devices(self.oci_rules))
        self.v1, self.v2 = DEVICES_HIERARCHY + self.cgroup, UNIFIED_HIERARCHY + self.cgroup
        os.mkdir(self.v1)
        os.mkdir(self.v2)
        with DevicesCgroup(self.v1) as v1:
            v1.apply(self.rules)
        with ProgramCgroup(self.v2) as v2:
            self.program = v2.attach(self.rules)
        self.process = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", CONTAINER,
             str(minor)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdin and self.process.stdout
        self._in, self._out = self.process.stdin, self.process.stdout
        assert self._out.readline() == "ready\n", "the container did not start"
        for folder in (self.v1, self.v2):
            Path(folder, "cgroup.procs").write_text(str(self.process.pid))
        found = ContainerProcess.now(self.process.pid)
        assert found is not None
        self.at = found

    def run(self, statement: str) -> Any:
        self._in.write(statement + "\n")
        self._in.flush()
        answer = json.loads(self._out.readline())
        assert "error" not in answer, answer["error"]
        return answer["out"]

    def read(self, path: str = PATH) -> str:
        return str(self.run(f"out = read({path!r})"))

    def holder(self, process: ContainerProcess | None = None) -> Holder:
        return Holder("ns/pod/c", process or self.at, self.cgroup, self.rules)

    def listed(self) -> set[str]:
        with DevicesCgroup(self.v1) as v1:
            return {r.text for r in v1.listed()}

    def programs(self) -> list[int]:
        with ProgramCgroup(self.v2) as v2:
            return v2.attached()

    def stop(self) -> None:
        if self.process.poll() is None:
            self._in.close()
            terminate(self.process, grace=5)
        self._out.close()
        for folder in (self.v1, self.v2):
            os.rmdir(folder)
