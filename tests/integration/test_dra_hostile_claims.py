"""Issue 38 over real gRPC: hostile API answers and planted files never get a claim more than
its class grants, never reach outside the spec and metadata folders, and are refused in one
line each (no traceback, no raw newline in an answer or a log line), with nothing of the
claim left after unprepare.

The node, its class spec and the claim reader are :mod:`tests.integration.test_dra_config`'s;
here the reader answers what a compromised or buggy API server might.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cdi_gen.model import ClaimView
from tests.fakes.drakubelet import FakeDraKubelet
from tests.integration.test_dra_config import DRIVER, POOL, UID, Node, entry, params, result

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def node(short_dir: Path) -> AsyncIterator[Node]:
    (short_dir / "registry").mkdir()
    node = Node(short_dir)
    try:
        yield node
    finally:
        node.resolver.close()


def files_under(root: Path) -> set[str]:
    """Every file below ``root`` (relative), sockets and the checkpoint left out."""
    out = set()
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            if not path.is_socket():
                out.add(str(path.relative_to(root)))
    return out


def claim_files(node: Node) -> set[str]:
    """What a claim may leave: anything but the class spec and its record (and, while the
    plugin serves, the locks of its sockets)."""
    return {
        f
        for f in files_under(node.root)
        if not f.startswith(("cdi/example.com-fpga.json", "cdi/.example.com-fpga.json", "state/"))
        and not f.endswith(".sock.lock")
    }


def assert_clean_logs(caplog: pytest.LogCaptureFixture) -> None:
    """No traceback and no log line a forged newline could start (issue 38, items 8 and 9)."""
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    for record in caplog.records:
        assert "\n" not in record.getMessage(), record.getMessage()
        assert "\x00" not in record.getMessage(), record.getMessage()


async def prepare_and_unprepare(node: Node, ref: tuple[str, str, str]) -> str:
    """Prepare the claim the kubelet names as ``ref``, then unprepare it; the prepare's error."""
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        error = (await connection.prepare([ref])).claims[ref[2]].error
        assert (await connection.unprepare([ref])).claims[ref[2]].error == ""
    return str(error)


def configured(
    *results: Any,
    uid: str = UID,
    namespace: str = "default",
    name: str = "c1",
    pod_claim_name: str | None = None,
) -> ClaimView:
    return ClaimView(
        namespace,
        name,
        uid,
        tuple(results),
        (entry(0, params(env={"A": "1"})),),
        pod_claim_name,
    )


@pytest.mark.parametrize(
    ("namespace", "name"),
    [
        ("kube-system", "c1"),  # another namespace
        ("default", "c2"),  # another claim
        ("default", "../../../../tmp/x"),
        ("/etc", "c1"),
        ("default", "c1\nforged"),
    ],
)
async def test_an_answer_for_another_claim_is_refused_and_writes_nothing(
    node: Node, namespace: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    node.claims.claims["c1"] = configured(result("fpga-0"), namespace=namespace, name=name)
    error = await prepare_and_unprepare(node, ("default", "c1", UID))
    assert error.startswith(f"claim default/c1 (uid '{UID}'): the API server answered claim ")
    assert error.endswith("not the one asked for") and error.isprintable(), error
    assert claim_files(node) == set()
    assert_clean_logs(caplog)


@pytest.mark.parametrize(
    "request_name", ["r\x00x", "r\n<forged>", "..", "", "r/../..", "r" * 300, "../../../etc"]
)
async def test_a_hostile_request_name_is_refused_in_one_line(
    node: Node, request_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    node.claims.claims["c1"] = configured(result("fpga-0", request_name))
    error = await prepare_and_unprepare(node, ("default", "c1", UID))
    assert "its allocation names request" in error and "want a DNS label" in error, error
    assert error.isprintable() and len(error) < 500
    assert claim_files(node) == set()
    assert_clean_logs(caplog)


async def test_hostile_config_entries_are_quoted_in_one_line(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    forged = "x\n2026-12-03 INFO prepared everything"
    for index, bad in enumerate(
        [
            entry(0, params(env={"A": "1"}), source=forged),
            entry(0, params(env={"A\nB": "1"})),
            entry(0, params(env={"A": forged})),
            entry(0, params(env={"A": "1"}), requests=[forged]),
        ]
    ):
        uid = f"uid-{index}"
        node.claims.claims["c1"] = ClaimView("default", "c1", uid, (result("fpga-0"),), (bad,))
        error = await prepare_and_unprepare(node, ("default", "c1", uid))
        assert error.isprintable(), error
        if index != 3:  # an entry limited to a request the claim lacks configures nothing
            assert error.startswith(f"claim default/c1 (uid '{uid}'): config entry "), error
    assert claim_files(node) == set()
    assert_clean_logs(caplog)


async def test_the_longest_valid_names_are_prepared_and_leave_nothing(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 38, item 6: UID 128, name 253 and namespace 63 characters, all valid in the API,
    overflowed a file name's 255 bytes."""
    uid = "u" * 127 + "1"
    namespace = "n" * 63
    name = ".".join(["a" * 63] * 3 + ["b" * 61])
    assert len(name) == 253
    node.claims.claims[name] = ClaimView(
        namespace,
        name,
        uid,
        (result("fpga-0", "r" * 63),),
        (entry(0, params(env={"A": "1"})),),
        "p" * 63,
    )
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        answer = (await connection.prepare([(namespace, name, uid)])).claims[uid]
        assert answer.error == ""
        written = claim_files(node)
        assert {Path(f).parent.name for f in written} == {"cdi", "dra-device-metadata"}
        assert all(len(Path(f).name) <= 255 for f in written)
        assert (await connection.unprepare([(namespace, name, uid)])).claims[uid].error == ""
    assert claim_files(node) == set()
    assert_clean_logs(caplog)


def plant(node: Node, kind: str) -> Path:
    """Something not ours at the claim's metadata file's name; what a write through it hits."""
    node.metadata_dir.mkdir(parents=True, exist_ok=True)
    at = node.metadata_dir / f"{UID}_fpga.json"
    target = node.root / "victim"
    target.write_bytes(b"not yours\n")
    if kind == "symlink":
        at.symlink_to(target)
    elif kind == "folder":
        at.mkdir()
    elif kind == "fifo":
        os.mkfifo(at)
    else:
        at.write_bytes(b'{"kind": "Something", "of": "someone else"}\n')
    return target


@pytest.mark.parametrize("kind", ["symlink", "folder", "fifo", "foreign"])
async def test_something_planted_at_a_metadata_files_name_is_refused_and_kept(
    node: Node, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    victim = plant(node, kind)
    node.claims.claims["c1"] = configured(result("fpga-0"))
    error = await prepare_and_unprepare(node, ("default", "c1", UID))
    assert "its own CDI spec cannot be written" in error
    assert "refusing to touch it" in error and error.isprintable(), error
    assert victim.read_bytes() == b"not yours\n"
    at = node.metadata_dir / f"{UID}_fpga.json"
    assert at.is_symlink() or at.exists()  # left as it was
    assert not list(node.spec_dir.glob("*@*"))  # no claim spec either
    assert_clean_logs(caplog)


async def test_a_metadata_folder_swapped_for_a_link_is_neither_swept_nor_written(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    elsewhere = node.root / "elsewhere"
    elsewhere.mkdir()
    theirs = elsewhere / "default_x_fpga.json"
    theirs.write_bytes(b"{}\n")
    node.metadata_dir.parent.mkdir(parents=True)
    node.metadata_dir.symlink_to(elsewhere)
    node.claims.claims["c1"] = configured(result("fpga-0"))
    error = await prepare_and_unprepare(node, ("default", "c1", UID))
    assert "is a symbolic link" in error and "refusing to write or remove" in error, error
    assert sorted(p.name for p in elsewhere.iterdir()) == ["default_x_fpga.json"]
    assert theirs.read_bytes() == b"{}\n"
    assert_clean_logs(caplog)


async def test_a_claim_may_not_widen_its_class_over_grpc(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 38, item 1: the class's nodes are 0660 without an owner; a claim asking for
    0666 (write for everyone) or mknod beyond... is refused naming the field and both values."""
    caplog.set_level(logging.INFO)
    node.claims.claims["c1"] = ClaimView(
        "default",
        "c1",
        UID,
        (result("fpga-0"),),
        (entry(0, params(deviceNodes={"fileMode": 0o666})),),
    )
    error = await prepare_and_unprepare(node, ("default", "c1", UID))
    assert error == (
        f"claim default/c1 (uid '{UID}'): its configuration asks for more than its class "
        "grants: device '0': device node '/dev/null': fileMode 0o666 sets bits 0o6 that the "
        "class's fileMode 0o660 does not"
    )
    assert claim_files(node) == set()
    assert_clean_logs(caplog)
    assert POOL and DRIVER  # the node's pool and driver, as the class's devices are published
