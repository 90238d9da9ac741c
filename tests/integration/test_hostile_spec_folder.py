"""A spec folder holding a FIFO, a link to /dev/zero, a huge file or a YAML alias bomb
(issue 11, defect 3): `list` and `validate` answer with one line per bad file, and the device
plugin's Allocate neither hangs nor holds up the event loop the other classes share.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

import grpc
import pytest
from fakes.kubelet import FakeKubelet

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2
from cdi_gen.cdi import resolution
from cdi_gen.cdi.registry import SpecCache
from cdi_gen.deviceplugin.board import DeviceBoard
from cdi_gen.deviceplugin.server import DevicePlugin
from cdi_gen.model import AdvertisedDevice
from tests.waiting import until

GOOD = {
    "cdiVersion": "0.3.0",
    "kind": "example.com/loop",
    "devices": [{"name": "loop200", "containerEdits": {"deviceNodes": [{"path": "/dev/loop200"}]}}],
}

BOMB = "\n".join(
    [
        'cdiVersion: &a0 ["0.3.0", "0.3.0", "0.3.0", "0.3.0", "0.3.0", "0.3.0", "0.3.0"]',
        *(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)),
        "devices: *a9",
        "kind: example.com/bomb",
        "",
    ]
).replace("cdiVersion: &a0", "a0: &a0")


def plant(folder: Path) -> dict[str, str]:
    """Bad files in ``folder`` beside a good spec; returns name → expected reason."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "example.com-loop.json").write_text(json.dumps(GOOD))
    os.mkfifo(folder / "fifo.json")
    os.symlink("/dev/zero", folder / "zero.json")
    with open(folder / "huge.json", "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB that takes no disk
    (folder / "bomb.yaml").write_text(BOMB)
    return {
        "fifo.json": "not a regular file (a FIFO)",
        "zero.json": "not a regular file (a character device)",
        "huge.json": "too large (1.0 GiB; the limit is 8.0 MiB)",
        "bomb.yaml": "aliases expand the document",
    }


def cdi_gen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdi_gen", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_list_answers_with_one_warning_per_bad_file(tmp_path: Path) -> None:
    reasons = plant(tmp_path / "cdi")
    # A read blocking on the FIFO would hang: cdi_gen's subprocess timeout fails the test.
    result = cdi_gen("list", "--spec-dir", str(tmp_path / "cdi"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "example.com/loop=loop200",
        str(tmp_path / "cdi/example.com-loop.json"),
    ]
    lines = result.stderr.splitlines()
    assert len(lines) == len(reasons), lines
    for name, reason in reasons.items():
        assert any(f"cdi/{name}: " in line and reason in line for line in lines), (name, lines)
    assert "Traceback" not in result.stderr


def test_validate_answers_with_one_line_per_bad_file(tmp_path: Path) -> None:
    folder = tmp_path / "cdi"
    reasons = plant(folder)
    result = cdi_gen("validate", "--quiet", str(folder))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == len(reasons), lines
    for name, reason in reasons.items():
        assert any(line.startswith(f"{folder / name}: ") and reason in line for line in lines)
    # Named one by one, too (a FIFO given as an argument must not block either).
    result = cdi_gen("validate", str(folder / "fifo.json"), str(folder / "zero.json"))
    assert result.returncode == 1
    assert len(result.stdout.splitlines()) == 2, result.stdout
    assert "Traceback" not in result.stderr


def test_symlink_to_a_regular_spec_is_read_like_the_runtimes_do(tmp_path: Path) -> None:
    (tmp_path / "opt").mkdir()
    (tmp_path / "opt" / "loop.json").write_text(json.dumps(GOOD))
    (tmp_path / "cdi").mkdir()
    os.symlink(tmp_path / "opt" / "loop.json", tmp_path / "cdi" / "example.com-loop.json")
    result = cdi_gen("list", "--spec-dir", str(tmp_path / "cdi"))
    assert result.returncode == 0
    assert "example.com/loop=loop200" in result.stdout
    assert result.stderr == ""


def make_plugin(folder: Path, cls: str, cache: object) -> DevicePlugin:
    return DevicePlugin(
        "example.com",
        cls,
        DeviceBoard([AdvertisedDevice("loop200")]),
        cache,  # type: ignore[arg-type]
        plugin_dir=folder,
        watch_interval=0.05,
    )


def request(*ids: str) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
    )


async def test_allocate_with_a_fifo_in_the_folder_does_not_block(short_dir: Path) -> None:
    spec_dir = short_dir / "cdi"
    plant(spec_dir)
    # If a read blocks on the FIFO, a writer comes after 4 s so that the test ends (and fails:
    # the answer needed the writer) instead of hanging.
    unblocked = threading.Event()

    def writer() -> None:
        unblocked.set()
        os.close(os.open(spec_dir / "fifo.json", os.O_WRONLY))

    unblock = threading.Timer(4, writer)
    unblock.start()
    kubelet = FakeKubelet(short_dir / "dp")
    await kubelet.start()
    plugin = make_plugin(short_dir / "dp", "loop", SpecCache([spec_dir]))
    await plugin.start()
    try:
        connection = await kubelet.next_registration()
        response = await connection.stub.Allocate(request("loop200"))
        assert not unblocked.is_set(), "Allocate answered only once the FIFO got a writer"
        assert response.container_responses[0].cdi_devices[0].name == "example.com/loop=loop200"
    finally:
        unblock.cancel()
        await plugin.stop()
        await kubelet.stop()


class StuckCache:
    """A folder scan that does not return (a hung filesystem) until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def unresolved(self, qualified_names: Iterable[str]) -> list[str]:
        self.entered.set()
        self.release.wait(10)
        return []


async def test_a_stuck_folder_scan_is_bounded_and_other_classes_answer(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The scan is released only after 8 s (so that the test cannot hang): answers that come
    # while it is still stuck are the promised bound at work, no clock needed.
    monkeypatch.setattr(resolution, "SPEC_CHECK_SECONDS", 0.5)
    stuck = StuckCache()
    release = threading.Timer(8, stuck.release.set)
    release.start()
    kubelet = FakeKubelet(short_dir / "dp")
    await kubelet.start()
    slow = make_plugin(short_dir / "dp", "loop", stuck)
    fine = make_plugin(short_dir / "dp", "other", SpecCache([short_dir / "none"]))
    await slow.start()
    await fine.start()
    try:
        first = await kubelet.next_registration()
        second = await kubelet.next_registration()
        by_class = {c.request.resource_name: c for c in (first, second)}
        pending = asyncio.ensure_future(
            by_class["example.com/loop"].stub.Allocate(request("loop200"))
        )
        await until(stuck.entered.is_set, "the loop class's folder scan started")
        # Meanwhile the other class answers too: its first check queues behind the stuck scan
        # on the one scan worker and is cut at the same bound, its gRPC thread not held.
        with pytest.raises(grpc.aio.AioRpcError) as other:
            await by_class["example.com/other"].stub.Allocate(request("loop200"))
        assert not stuck.release.is_set(), "the other class answered only once the scan ended"
        assert other.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await pending
        assert not stuck.release.is_set(), "the stuck scan was never cut, only released"
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not read within 0.5s" in (caught.value.details() or "")
    finally:
        stuck.release.set()
        release.cancel()
        await slow.stop()
        await fine.stop()
        await kubelet.stop()


async def test_runtime_spec_dir_given_twice_still_allocates(short_dir: Path) -> None:
    from cdi_gen.config.settings import Settings

    spec_dir = short_dir / "cdi"
    spec_dir.mkdir()
    (spec_dir / "example.com-loop.json").write_text(json.dumps(GOOD))
    options = Settings(spec_dir=spec_dir, runtime_spec_dirs=(spec_dir, Path(f"{spec_dir}/")))
    assert options.paths.for_runtime() == (spec_dir,)
    kubelet = FakeKubelet(short_dir / "dp")
    await kubelet.start()
    # Even handed straight to the cache, a folder named twice does not conflict with itself.
    plugin = make_plugin(short_dir / "dp", "loop", SpecCache([spec_dir, spec_dir]))
    await plugin.start()
    try:
        connection = await kubelet.next_registration()
        response = await connection.stub.Allocate(request("loop200"))
        assert response.container_responses[0].cdi_devices[0].name == "example.com/loop=loop200"
    finally:
        await plugin.stop()
        await kubelet.stop()


def test_the_fast_path_never_reads_and_a_stuffed_folder_costs_it_nothing(
    tmp_path: Path,
) -> None:
    spec_dir = tmp_path / "cdi"
    plant(spec_dir)
    cache = SpecCache([spec_dir])
    assert cache.fresh_registry() is None  # never scanned: only a worker thread may read
    assert cache.unresolved(["example.com/loop=loop200"]) == []
    assert cache.unresolved_if_fresh(["example.com/loop=loop200"]) == []
    (spec_dir / "example.com-loop.json").write_text(json.dumps(GOOD) + " ")
    assert cache.fresh_registry() is None  # changed: to be read off the fast path
    cache.registry()
    assert cache.fresh_registry() is not None
    scans = cache.scans
    # The fast path looks at inotify's queue, never at the folder: a folder stuffed with
    # files runtimes ignore changes nothing for it, and nothing is scanned again.
    for i in range(2000):
        (spec_dir / f"junk{i}").touch()
    assert cache.fresh_registry() is not None
    assert cache.unresolved_if_fresh(["example.com/loop=loop200"]) == []
    assert cache.scans == scans


def swap_link(entry: Path, target: Path) -> None:
    """``ln -s target tmp && mv -T tmp entry``, as a configuration manager swaps a folder."""
    tmp = entry.with_name(f".{entry.name}.swap")
    tmp.symlink_to(target)
    os.rename(tmp, entry)


async def test_allocate_follows_the_folder_a_swapped_path_leads_to(short_dir: Path) -> None:
    # Issue 26, item 18: the runtime opens the spec folder by its path; when a link on that
    # path is swapped, or a parent renamed and made again, Allocate must judge by the folder
    # the path leads to now, not by the one watched until then.
    with_spec, without = short_dir / "v1", short_dir / "v2"
    with_spec.mkdir()
    (with_spec / "example.com-loop.json").write_text(json.dumps(GOOD))
    without.mkdir()
    (short_dir / "etc").mkdir()
    link = short_dir / "etc" / "cdi"
    link.symlink_to(with_spec)
    kubelet = FakeKubelet(short_dir / "dp")
    await kubelet.start()
    cache = SpecCache([link])
    plugin = make_plugin(short_dir / "dp", "loop", cache)
    await plugin.start()
    try:
        stub = (await kubelet.next_registration()).stub

        async def allocate() -> grpc.StatusCode:
            try:
                await stub.Allocate(request("loop200"))
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

        for _ in range(3):  # until answered from the cache, as it is between changes
            assert await allocate() == grpc.StatusCode.OK
        assert cache.fresh_registry() is not None
        swap_link(link, without)
        assert await allocate() == grpc.StatusCode.FAILED_PRECONDITION
        swap_link(link, with_spec)
        assert await allocate() == grpc.StatusCode.OK
        # The parent renamed and made again, now with the link to the empty folder.
        os.rename(short_dir / "etc", short_dir / "etc.old")
        (short_dir / "etc").mkdir()
        link.symlink_to(without)
        assert await allocate() == grpc.StatusCode.FAILED_PRECONDITION
        os.rename(short_dir / "etc", short_dir / "etc.new")  # the path leads to nothing
        assert await allocate() == grpc.StatusCode.FAILED_PRECONDITION
        os.rename(short_dir / "etc.old", short_dir / "etc")
        assert await allocate() == grpc.StatusCode.OK
    finally:
        await plugin.stop()
        await kubelet.stop()
        cache.close()
