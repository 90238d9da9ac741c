"""The DRA sockets' names: one per node without a pod UID, one per pod with it (a rolling
update's two instances register side by side), always within the unix socket limit; and
which registration socket beside ours is a newer instance's, and which an older one's still
served."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdi_gen.kubelet.registration import (
    endpoint_socket,
    hashed_name,
    newer_siblings,
    older_siblings,
    registration_socket,
)
from cdi_gen.kubelet.transport import MAX_SOCKET_PATH

DRIVER = "cdi-gen.example.com"
UID = "6f1c7a52-0b1e-4c3e-9d55-1b2a3c4d5e6f"
REGISTRY = Path("/var/lib/kubelet/plugins_registry")


def test_without_a_pod_uid_the_names_are_todays() -> None:
    assert registration_socket(REGISTRY, DRIVER, None) == REGISTRY / f"{DRIVER}-reg.sock"
    folder = Path("/var/lib/kubelet/plugins") / DRIVER
    assert endpoint_socket(folder, None) == folder / "dra.sock"


def test_with_a_pod_uid_both_sockets_are_the_pods() -> None:
    assert registration_socket(REGISTRY, DRIVER, UID) == REGISTRY / f"{DRIVER}-{UID}-reg.sock"
    folder = Path("/var/lib/kubelet/plugins") / DRIVER
    assert endpoint_socket(folder, UID) == folder / f"dra-{UID}.sock"


def test_too_long_a_name_is_shortened_to_a_digest_within_the_limit() -> None:
    driver = "a" * 40 + ".example.com"
    # <driver>-<uid>-reg.sock would be 124 bytes: the UID's digest stands in for it.
    digest = hashed_name(UID, size=8)
    assert len(digest) == 11 and "=" not in digest
    assert registration_socket(REGISTRY, driver, UID) == REGISTRY / f"{driver}-{digest}-reg.sock"
    # A driver name too long even for that: driver and UID both digested.
    longest = "b" * 63 + ".example.com"
    path = registration_socket(REGISTRY, longest, UID)
    assert path == REGISTRY / f"dra-{hashed_name(longest, UID, size=16)}-reg.sock"
    assert len(os.fsencode(path)) <= MAX_SOCKET_PATH
    # Distinct pods, distinct sockets; the same pod, the same one.
    assert registration_socket(REGISTRY, longest, "other") != path
    assert registration_socket(REGISTRY, longest, UID) == path
    # dra-<uid>.sock in the folder of a 45-character driver would be 117 bytes.
    folder = Path("/var/lib/kubelet/plugins") / ("c" * 33 + ".example.com")
    service = endpoint_socket(folder, UID)
    assert service == folder / f"dra-{hashed_name(UID, size=16)}.sock"
    assert len(os.fsencode(service)) <= MAX_SOCKET_PATH


@pytest.fixture
def bound(short_dir: Path) -> Iterator[list[socket.socket]]:
    sockets: list[socket.socket] = []
    yield sockets
    for sock in sockets:
        sock.close()


def _bind(path: Path, sockets: list[socket.socket], *, listen: bool = False) -> int:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    if listen:
        sock.listen()
    sockets.append(sock)
    return os.lstat(path).st_ctime_ns


def test_a_newer_instances_socket_is_found_and_older_or_foreign_ones_are_not(
    short_dir: Path, bound: list[socket.socket]
) -> None:
    stale = short_dir / f"{DRIVER}-killed-reg.sock"
    _bind(stale, bound)
    ours = short_dir / f"{DRIVER}-uid-a-reg.sock"
    since = _bind(ours, bound)
    assert newer_siblings(ours, DRIVER, since) == []  # the stale one is older
    _bind(short_dir / "other.example.com-uid-x-reg.sock", bound)  # another driver
    (short_dir / f"{DRIVER}-uid-f-reg.sock").write_text("")  # not a socket
    assert newer_siblings(ours, DRIVER, since) == []
    newer = short_dir / f"{DRIVER}-uid-b-reg.sock"
    _bind(newer, bound)
    assert newer_siblings(ours, DRIVER, since) == [newer]
    # The newer instance sees no newer one: ours is older than it.
    assert newer_siblings(newer, DRIVER, os.lstat(newer).st_ctime_ns) == []


def test_two_sockets_bound_within_one_clock_tick_are_ordered_by_name(
    short_dir: Path, bound: list[socket.socket]
) -> None:
    first, second = short_dir / f"{DRIVER}-a-reg.sock", short_dir / f"{DRIVER}-b-reg.sock"
    _bind(first, bound)
    _bind(second, bound)
    # Whatever the clock says, exactly one of the two is the newer for both.
    tick = max(os.lstat(first).st_ctime_ns, os.lstat(second).st_ctime_ns)
    views = [
        bool(newer_siblings(first, DRIVER, os.lstat(first).st_ctime_ns)),
        bool(newer_siblings(second, DRIVER, os.lstat(second).st_ctime_ns)),
    ]
    assert views.count(True) == 1, (views, tick)


def test_an_older_instance_counts_while_someone_listens_on_its_socket(
    short_dir: Path, bound: list[socket.socket]
) -> None:
    # Bound and never listened on: the socket a killed instance leaves refuses connections.
    _bind(short_dir / f"{DRIVER}-killed-reg.sock", bound)
    older = short_dir / f"{DRIVER}-uid-a-reg.sock"
    _bind(older, bound, listen=True)
    _bind(short_dir / "other.example.com-uid-x-reg.sock", bound, listen=True)
    ours = short_dir / f"{DRIVER}-uid-b-reg.sock"
    since = _bind(ours, bound, listen=True)
    _bind(short_dir / f"{DRIVER}-uid-c-reg.sock", bound, listen=True)  # newer than ours
    assert older_siblings(ours, DRIVER, since) == [older]
    # Ours not served: every instance served counts, whenever it was bound.
    assert older_siblings(ours, DRIVER, None) == [older, short_dir / f"{DRIVER}-uid-c-reg.sock"]
    bound[1].close()  # the older instance stopped serving
    assert older_siblings(ours, DRIVER, since) == []
