"""A node replacement's request checked before any process starts: the path under /dev with no
climbing or empty component, the type, numbers, mode and owner in the kernel's ranges, each
refusal one line quoting the value and naming the rule; and the look-up below a folder that
follows no link, with ``openat2`` and without it."""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdi_gen.containernode import linux, replace
from cdi_gen.containernode.linux import beneath, process_start
from cdi_gen.containernode.node import ContainerProcess, DeviceNode, NodeResult
from cdi_gen.containernode.replace import replace_node

GOOD = DeviceNode("/dev/ttyUSB0", "c", 188, 0, 0o660, 0, 20)
#: A PID no process has (above the kernel's pid_max ceiling): a request that got as far as
#: the child would come back "skipped", never "refused".
NO_PROCESS = ContainerProcess(2**22 + 1, 1)


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"path": "/etc/passwd"}, "is not under /dev/"),
        ({"path": "dev/ttyUSB0"}, "is not under /dev/"),
        ({"path": "/dev"}, "is not under /dev/"),
        ({"path": "/dev/"}, "empty, '.' or '..' component"),
        ({"path": "/dev/../etc/passwd"}, "empty, '.' or '..' component"),
        ({"path": "/dev/serial/../../etc/shadow"}, "empty, '.' or '..' component"),
        ({"path": "/dev/./ttyUSB0"}, "empty, '.' or '..' component"),
        ({"path": "/dev//ttyUSB0"}, "empty, '.' or '..' component"),
        ({"path": "/dev/ttyUSB0/"}, "empty, '.' or '..' component"),
        ({"path": "/dev/tty\0USB0"}, "NUL"),
        ({"path": "/dev/" + "x" * 256}, "longer than 255 bytes"),
        ({"path": "/dev/" + "x/" * 2100 + "x"}, "longer than 4095 bytes"),
        ({"type": "p"}, "is not 'c' or 'b'"),
        ({"type": "a"}, "is not 'c' or 'b'"),
        ({"major": 4096}, "major 4096 is not in 0..4095"),
        ({"minor": -1}, "minor -1 is not in 0..1048575"),
        ({"minor": True}, "minor True"),
        ({"uid": 2**32 - 1}, "uid 4294967295 is not in"),
        ({"gid": "5"}, "gid '5' is not in"),
        ({"mode": 0o4755}, "mode 2541 is not permission bits"),
        ({"mode": -1}, "is not permission bits"),
    ],
)
def test_a_request_that_breaks_a_rule_is_refused_before_any_process(
    changes: dict[str, object], rule: str, caplog: pytest.LogCaptureFixture
) -> None:
    node = dataclasses.replace(GOOD, **changes)  # type: ignore[arg-type]
    result = replace_node(NO_PROCESS, node)
    assert result.status == "refused", result.line
    assert rule in result.reason
    assert caplog.messages == [result.line]
    assert "\n" not in result.line and len(result.line) < 400


def test_the_line_names_the_path_the_process_and_the_rule() -> None:
    result = NodeResult("refused", "PID reused", 42, "/dev/ttyUSB0")
    assert result.line == (
        "device node '/dev/ttyUSB0' in the container of process 42: refused: PID reused"
    )
    assert not result.done and NodeResult("done", "", 42, "/dev/x").done


def test_a_process_that_does_not_exist_is_skipped() -> None:
    assert GOOD.problem() is None
    result = replace_node(NO_PROCESS, GOOD)
    assert (result.status, result.reason) == ("skipped", "the process has exited")


def test_a_process_start_is_its_own_and_none_once_gone() -> None:
    me = ContainerProcess.now(os.getpid())
    assert me is not None and me.start == process_start(os.getpid()) and me.start > 0
    assert ContainerProcess.now(NO_PROCESS.pid) is None


@pytest.fixture(params=["openat2", "component by component"])
def lookup(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each look-up test twice: with the kernel's openat2, and as on a kernel without it."""
    monkeypatch.setattr(linux._kernel, "openat2", request.param == "openat2")
    return str(request.param)


def test_a_look_up_below_a_folder_follows_no_link(tmp_path: Path, lookup: str) -> None:
    (tmp_path / "dev" / "real").mkdir(parents=True)
    (tmp_path / "dev" / "real" / "node").write_text("")
    (tmp_path / "dev" / "up").symlink_to(tmp_path)
    (tmp_path / "dev" / "inside").symlink_to("real")
    (tmp_path / "dev" / "file").symlink_to("real/node")
    dev = os.open(tmp_path / "dev", os.O_PATH | os.O_DIRECTORY)
    try:
        found = beneath(dev, "real/node", os.O_PATH)
        os.close(found)
        for path, flags in (
            ("up/dev/real", os.O_PATH | os.O_DIRECTORY),
            ("inside/node", os.O_PATH),
            ("inside", os.O_PATH | os.O_DIRECTORY),
            ("file", os.O_RDONLY),
            ("../dev/real", os.O_PATH | os.O_DIRECTORY),
        ):
            with pytest.raises(OSError) as caught:
                os.close(beneath(dev, path, flags))
            assert caught.value.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV), path
    finally:
        os.close(dev)


@pytest.mark.parametrize(
    ("code", "timeout", "rule"),
    [
        ("import sys; sys.stderr.write('Traceback...\\nboom\\n'); sys.exit(3)", 10.0, "exited 3"),
        ("print('done'); print('done')", 10.0, "with no answer"),
        ("print('maybe so')", 10.0, "with no answer"),
        ("import signal; signal.pause()", 0.5, "no answer within 0.5 s and was killed"),
    ],
)
def test_a_child_that_fails_or_hangs_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, code: str, timeout: float, rule: str
) -> None:
    """Whatever the child does (crashes, prints two answers or a word that is none, hangs on
    a file system that does not answer), the caller gets a refusal and serves on."""
    monkeypatch.setattr(replace, "CHILD", (sys.executable, "-I", "-S", "-c", code))
    me = ContainerProcess.now(os.getpid())
    assert me is not None
    result = replace.replace_node(me, GOOD, timeout=timeout)
    assert result.status == "refused" and rule in result.reason, result.line
    assert "\n" not in result.line


@pytest.mark.parametrize(
    "arguments",
    [
        [],
        ["1", "2", "/etc/passwd", "c", "1", "5", "438", "0", "0"],
        ["1", "2", "/dev/../etc/passwd", "c", "1", "5", "438", "0", "0"],
        ["1", "2", "/dev/ttyUSB0", "p", "1", "5", "438", "0", "0"],
        ["x", "2", "/dev/ttyUSB0", "c", "1", "5", "438", "0", "0"],
    ],
)
def test_the_child_refuses_a_malformed_request_itself(arguments: list[str]) -> None:
    """The child checks again what it relies on, so that nothing but a checked request
    reaches a container even if the caller's check were skipped."""
    child = subprocess.run(
        [*replace.CHILD, *arguments], capture_output=True, text=True, timeout=60, check=False
    )
    assert (child.returncode, child.stdout) == (0, "refused the request is malformed\n")
