"""A device node replaced inside a running container, with the real kernel: the "container" is
a real process in a private mount namespace with its own tmpfs on ``/dev`` (as a runtime
gives one), holding a stale node; the node is replaced through its mount namespace and what
it sees, and what the host sees, are compared. Each hostile case of issue 55 is one test: a
link planted at the path or on it, a file or folder at the path, a process that exited (or is
a zombie), a reused PID, a process of the host's own namespace."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdi_gen.containernode.linux import process_start
from cdi_gen.containernode.node import ContainerProcess, DeviceNode, NodeResult
from cdi_gen.containernode.replace import replace_node
from tests.processes import terminate
from tests.waiting import until_sync

#: The container: a tmpfs on its /dev with a stale node (c 1:3) at /dev/ttyUSB0, then one
#: Python statement per line from the test (setting ``out``), answered with one JSON line.
CONTAINER = """
import json, os, stat, subprocess, sys
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "cdi-gen-test-dev", "/dev"], check=True)
os.mknod("/dev/ttyUSB0", stat.S_IFCHR | 0o600, os.makedev(1, 3))
print("ready", flush=True)
def node(path):
    s = os.lstat(path)
    return {"kind": stat.S_IFMT(s.st_mode), "rdev": [os.major(s.st_rdev), os.minor(s.st_rdev)],
            "mode": stat.S_IMODE(s.st_mode), "uid": s.st_uid, "gid": s.st_gid}
for line in sys.stdin:
    out = None
    try:
        exec(line)
        print(json.dumps({"out": out}), flush=True)
    except Exception as e:
        print(json.dumps({"error": repr(e)}), flush=True)
"""

NEW = DeviceNode("/dev/ttyUSB0", "c", 1, 5, 0o660, 1000, 5)


class Container:
    """A process in its own mount namespace, told what to do one statement at a time."""

    def __init__(self) -> None:
        assert shutil.which("unshare") and shutil.which("mount"), "needs util-linux"
        self.process = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", CONTAINER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdin and self.process.stdout
        self._in, self._out = self.process.stdin, self.process.stdout
        assert self._out.readline() == "ready\n", "the container did not start"
        found = ContainerProcess.now(self.process.pid)
        assert found is not None
        self.at = found

    def run(self, statement: str) -> Any:
        self._in.write(statement + "\n")
        self._in.flush()
        answer = json.loads(self._out.readline())
        assert "error" not in answer, answer["error"]
        return answer["out"]

    def node(self, path: str) -> dict[str, Any]:
        return dict(self.run(f"out = node({path!r})"))

    def listing(self, folder: str = "/dev") -> list[str]:
        return sorted(self.run(f"out = os.listdir({folder!r})"))

    def stop(self) -> None:
        self._in.close()
        terminate(self.process, grace=5)
        self._out.close()


@pytest.fixture
def container() -> Iterator[Container]:
    started = Container()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def host_folder() -> Iterator[Path]:
    """A folder of the host, standing for what a link planted in the container points at."""
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="cg"))
    (folder / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    os.chmod(folder / "passwd", 0o644)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def _snapshot(folder: Path) -> dict[str, tuple[int, int, int, int, bytes]]:
    """Each entry of a host folder: mode, owner, group, size and content (files)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        s = path.lstat()
        body = path.read_bytes() if stat.S_ISREG(s.st_mode) else b""
        out[str(path)] = (s.st_mode, s.st_uid, s.st_gid, s.st_size, body)
    return out


def _host_dev(path: str) -> tuple[int, int, int, int] | None:
    try:
        s = os.lstat(path)
    except FileNotFoundError:
        return None
    return s.st_mode, s.st_rdev, s.st_uid, s.st_gid


def _refused(result: NodeResult, *words: str) -> None:
    assert result.status == "refused", result.line
    for word in words:
        assert word in result.reason, result.line
    assert "\n" not in result.line


def test_a_stale_node_is_replaced_inside_the_container_only(container: Container) -> None:
    host_before = _host_dev("/dev/ttyUSB0")
    result = replace_node(container.at, NEW)
    assert result.done, result.line
    assert container.node("/dev/ttyUSB0") == {
        "kind": stat.S_IFCHR, "rdev": [1, 5], "mode": 0o660, "uid": 1000, "gid": 5,
    }  # fmt: skip
    # No temporary name left beside it, and the host's /dev never saw it.
    assert container.listing() == ["ttyUSB0"]
    assert _host_dev("/dev/ttyUSB0") == host_before


def test_the_mode_and_owner_are_applied_exactly_and_a_block_node_is_made(
    container: Container,
) -> None:
    """The umask and the stale node's own bits play no part; a node that is absent (the
    container removed it) is made; a block node is a block node."""
    container.run("os.umask(0o077); os.chmod('/dev/ttyUSB0', 0o7777)")
    result = replace_node(container.at, DeviceNode("/dev/ttyUSB0", "c", 1, 7, 0o604, 0, 65534))
    assert result.done, result.line
    assert container.node("/dev/ttyUSB0") == {
        "kind": stat.S_IFCHR, "rdev": [1, 7], "mode": 0o604, "uid": 0, "gid": 65534,
    }  # fmt: skip
    result = replace_node(container.at, DeviceNode("/dev/loop777", "b", 7, 777, 0o660, 0, 6))
    assert result.done, result.line
    assert container.node("/dev/loop777")["kind"] == stat.S_IFBLK
    assert container.node("/dev/loop777")["rdev"] == [7, 777]


@pytest.mark.parametrize("target", ["passwd", "", "/etc/passwd"])
def test_a_link_planted_at_the_path_is_refused_and_left(
    container: Container, host_folder: Path, target: str
) -> None:
    """A link to a host file, a host folder, or /etc/passwd: never followed, never replaced."""
    aim = target if target.startswith("/") else str(host_folder / target)
    container.run(f"os.unlink('/dev/ttyUSB0'); os.symlink({aim!r}, '/dev/ttyUSB0')")
    before, passwd = _snapshot(host_folder), Path("/etc/passwd").stat()
    _refused(replace_node(container.at, NEW), "symbolic link", "left as it is")
    assert container.run("out = os.readlink('/dev/ttyUSB0')") == aim
    assert container.listing() == ["ttyUSB0"]
    assert _snapshot(host_folder) == before
    assert Path("/etc/passwd").stat() == passwd


@pytest.mark.parametrize("aim", ["host", "relative", "dev-itself"])
def test_a_link_on_the_way_is_refused(container: Container, host_folder: Path, aim: str) -> None:
    """/dev/serial a link to a host folder (absolute, or climbing out of /dev), or to a
    folder of /dev itself: the path through it is refused, nothing is written anywhere."""
    target = {"host": str(host_folder), "relative": f"..{host_folder}", "dev-itself": "."}[aim]
    container.run(f"os.symlink({target!r}, '/dev/serial')")
    (host_folder / "by-id").mkdir()
    before, listing = _snapshot(host_folder), container.listing()
    result = replace_node(
        container.at, DeviceNode("/dev/serial/by-id/usb-x", "c", 1, 5, 0o660, 0, 0)
    )
    _refused(result, "link")
    assert _snapshot(host_folder) == before
    assert container.listing() == listing


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        ("open('/dev/ttyUSB0', 'w').write('data')", "regular file"),
        ("os.mkdir('/dev/ttyUSB0')", "folder"),
        ("os.mkfifo('/dev/ttyUSB0')", "not a device node"),
    ],
)
def test_anything_but_a_device_node_at_the_path_is_refused(
    container: Container, make: str, kind: str
) -> None:
    container.run(f"os.unlink('/dev/ttyUSB0'); {make}")
    before = container.node("/dev/ttyUSB0")
    _refused(replace_node(container.at, NEW), kind, "left as it is")
    assert container.node("/dev/ttyUSB0") == before
    assert container.listing() == ["ttyUSB0"]


def test_a_missing_folder_is_refused(container: Container) -> None:
    result = replace_node(container.at, DeviceNode("/dev/snd/pcm0", "c", 116, 3, 0o660, 0, 0))
    _refused(result, "/dev/snd does not exist")
    assert container.listing() == ["ttyUSB0"]


def test_a_folder_mounted_in_the_container_takes_the_node(
    container: Container, host_folder: Path
) -> None:
    """A host folder mounted over /dev/serial in the container: the node goes where the
    container sees its path, which is that folder."""
    container.run("os.mkdir('/dev/serial')")
    (host_folder / "ttyACM0").unlink(missing_ok=True)
    os.mknod(host_folder / "ttyACM0", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    container.run(
        f"subprocess.run(['mount', '--bind', {str(host_folder)!r}, '/dev/serial'], check=True)"
    )
    result = replace_node(container.at, DeviceNode("/dev/serial/ttyACM0", "c", 1, 5, 0o640, 0, 5))
    assert result.done, result.line
    assert container.node("/dev/serial/ttyACM0")["rdev"] == [1, 5]
    made = (host_folder / "ttyACM0").lstat()
    assert (os.major(made.st_rdev), os.minor(made.st_rdev), stat.S_IMODE(made.st_mode)) == (
        1,
        5,
        0o640,
    )
    assert sorted(p.name for p in host_folder.iterdir()) == ["passwd", "ttyACM0"]


def test_a_process_that_exited_is_skipped(container: Container) -> None:
    at = container.at
    container.stop()
    result = replace_node(at, NEW)
    assert (result.status, result.reason) == ("skipped", "the process has exited"), result.line


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_a_process_that_exited_but_is_not_reaped_is_skipped() -> None:
    """A zombie keeps its PID (and its start time) but has no root and no namespace to
    enter: the moment between a container's exit and its runtime reaping it."""
    script = "import sys; sys.stdin.read()"
    process = subprocess.Popen(
        ["unshare", "--mount", sys.executable, "-c", script], stdin=subprocess.PIPE
    )
    try:
        at = ContainerProcess.now(process.pid)
        assert at is not None and process.stdin is not None
        process.stdin.close()
        until_sync(lambda: _state(process.pid) == "Z", "the process to exit, not reaped")
        assert process_start(process.pid) == at.start
        result = replace_node(at, NEW)
        assert (result.status, result.reason) == ("skipped", "the process has exited"), result.line
    finally:
        process.wait(5)


def test_a_reused_pid_is_refused(container: Container) -> None:
    """The PID now names a process that started at another time than the one captured."""
    stale = ContainerProcess(container.at.pid, container.at.start - 1)
    _refused(replace_node(stale, NEW), "PID reused")
    assert container.node("/dev/ttyUSB0")["rdev"] == [1, 3]


def test_a_process_of_the_hosts_own_mount_namespace_is_refused() -> None:
    """The agent's own process (or any process sharing its namespace) is no container: its
    /dev is the host's."""
    me = ContainerProcess.now(os.getpid())
    assert me is not None
    assert _host_dev("/dev/cdi-gen-test-never") is None, "left by an earlier run: remove it"
    _refused(
        replace_node(me, DeviceNode("/dev/cdi-gen-test-never", "c", 1, 5, 0o666, 0, 0)),
        "own mount namespace",
    )
    assert _host_dev("/dev/cdi-gen-test-never") is None
