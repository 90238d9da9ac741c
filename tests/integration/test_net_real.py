"""Network interfaces against the real kernel: veth pairs this test creates (names cgn<pid>...,
deleted after) found by enumeration and by uevents, written as specs with ``netDevices`` by
the agent's path (kernel source → Discovery → writer) and by ``cdi-gen render``; an interface
removed is a device gone from the spec."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from cdi_gen.cdi.codec import dump_document
from cdi_gen.cdi.specnames import spec_filename
from cdi_gen.cdi.validation import check_document
from cdi_gen.cdi.writer import sync_spec
from cdi_gen.cli.main import main
from cdi_gen.config.loader import parse_config
from cdi_gen.config.models import AgentConfig
from cdi_gen.discovery.inventory import Discovery
from cdi_gen.sources.udev import UdevWatcher
from tests.waiting import until

pytestmark = pytest.mark.kernel

TIMEOUT = 5.0
#: Test-owned names, unique per process (at most 15 bytes: IFNAMSIZ).
PREFIX = f"cgn{os.getpid() % 100000}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", "link", *args], check=True, capture_output=True)


@pytest.fixture
def veths() -> Iterator[list[str]]:
    """Creates veth pairs ``<PREFIX>h<i>``/``<PREFIX>p<i>`` on demand (append i); deletes
    the ones still there after the test."""
    made: list[str] = []
    yield made
    for host in made:
        subprocess.run(["ip", "link", "del", host], capture_output=True, check=False)


def _add(veths: list[str], i: int) -> str:
    host = f"{PREFIX}h{i}"
    _ip("add", host, "type", "veth", "peer", "name", f"{PREFIX}p{i}")
    veths.append(host)
    return host


def _config() -> dict[str, Any]:
    return {
        "vendor": "example.com",
        "classes": [
            {
                "name": "veth",
                # The host ends only: the peers stay on the host to talk to the pod.
                "match": {"subsystem": "net", "kernel": f"{PREFIX}h*"},
                "deviceName": "{kernel}",
                "netDevice": {"name": "net-{number}"},
            }
        ],
    }


def _spec(spec_dir: Path) -> dict[str, Any] | None:
    try:
        doc: dict[str, Any] = orjson.loads(
            (spec_dir / spec_filename("example.com", "veth")).read_bytes()
        )
    except FileNotFoundError:
        return None
    return doc


def _nets(spec_dir: Path) -> list[dict[str, str]]:
    doc = _spec(spec_dir)
    if doc is None:
        return []
    return [n for d in doc["devices"] for n in d["containerEdits"]["netDevices"]]


@contextlib.asynccontextmanager
async def _follow(config: AgentConfig, spec_dir: Path) -> AsyncIterator[None]:
    """The agent's loop in miniature: kernel uevents → Discovery → spec folder."""
    discovery = Discovery(config)
    watcher = UdevWatcher(
        source="kernel",
        subsystems=discovery.subsystems,
        interest=discovery.interest,
        wants=discovery.wants,
    )

    def sync() -> None:
        doc = discovery.class_spec("veth").document
        sync_spec(spec_dir, "example.com", "veth", None if doc is None else dump_document(doc))

    async def run() -> None:
        async for batch in watcher.batches():
            changes = (discovery.replace if batch.full else discovery.apply)(batch.records)
            if changes:
                sync()

    discovery.replace(watcher.start())
    sync()
    task = asyncio.create_task(run())
    try:
        yield
    finally:
        watcher.close()
        await asyncio.wait_for(task, TIMEOUT)


async def test_veth_host_ends_follow_the_kernel(veths: list[str], tmp_path: Path) -> None:
    first = _add(veths, 0)  # present before start: found by the enumeration
    async with _follow(parse_config(_config(), "test"), tmp_path):
        doc = _spec(tmp_path)
        assert doc is not None and doc["cdiVersion"] == "1.1.0"
        assert check_document(doc) == []
        assert doc["devices"] == [
            {
                "name": first,
                "containerEdits": {"netDevices": [{"hostInterfaceName": first, "name": "net-0"}]},
            }
        ]
        second = _add(veths, 1)
        want = [
            {"hostInterfaceName": first, "name": "net-0"},
            {"hostInterfaceName": second, "name": "net-1"},
        ]
        await until(lambda: _nets(tmp_path) == want, f"{second} in the spec", TIMEOUT)
        _ip("del", first)  # deleting one end deletes the pair
        await until(lambda: _nets(tmp_path) == want[1:], f"{first} gone from the spec", TIMEOUT)
        _ip("del", second)
        await until(lambda: _spec(tmp_path) is None, "the spec removed with the last", TIMEOUT)


def test_render_writes_net_devices_for_the_real_interface(
    veths: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = _add(veths, 0)
    config = tmp_path / "config.json"
    config.write_bytes(orjson.dumps(_config()))
    with pytest.raises(SystemExit) as info:
        main(
            [
                "render", "--config", str(config), "--class", "veth",
                # A runtime that moves interfaces: this machine's may not.
                "--runtime", "containerd@2.3.7,runc@1.4.0",
            ]
        )  # fmt: skip
    out, err = capsys.readouterr()
    assert info.value.code in (0, None), err
    doc = orjson.loads(out)
    assert doc["cdiVersion"] == "1.1.0"
    assert doc["devices"] == [
        {
            "name": host,
            "containerEdits": {"netDevices": [{"hostInterfaceName": host, "name": "net-0"}]},
        }
    ]
