"""A prepared claim's devices in its ResourceClaim's status.devices, written through the real
API client against the fake API server (server-side apply of the status subresource)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import threading
from typing import Any

import orjson
import pytest

from cdi_gen.apiserver.client import ApiClient
from cdi_gen.dra.plugin.claims import PreparedDevice
from cdi_gen.dra.plugin.claimstatus import MAX_DATA, ClaimStatus, device_entries, status_entry
from cdi_gen.model import PoolDevice
from tests.fakes.apiserver import Answer, FakeApiServer

DRIVER = "drv.example.com"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces"
STATUS = f"{CLAIMS}/ns/resourceclaims/c/status"
WHEN = datetime.datetime(2026, 12, 3, 14, 0, 0, tzinfo=datetime.UTC)
DEVICE = PreparedDevice(("gpu",), "node-a", "fpga-0", ("example.com/fpga=0",))
POOL = {
    "fpga-0": PoolDevice(
        "fpga-0",
        "example.com/fpga=0",
        "fpga",
        "/sys/devices/fpga0",
        attributes={"serial": "SN123", "class": "fpga"},
    )
}


def _claim(uid: str = "u", name: str = "c") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {},
        "status": {"devices": [{"driver": "other.example.com", "pool": "p", "device": "d"}]},
    }


def _status(client: ApiClient) -> ClaimStatus:
    return ClaimStatus(client, DRIVER, asyncio.get_running_loop(), retry_max=0.1, now=lambda: WHEN)


async def _settle(status: ClaimStatus) -> None:
    for _ in range(200):
        await asyncio.sleep(0.01)
        if not status.running:
            return
    raise AssertionError("status writes still running")


def _from_thread(call: Any, *args: Any) -> None:
    """Called as a gRPC server thread calls it."""
    thread = threading.Thread(target=call, args=args)
    thread.start()
    thread.join()


def test_an_entry_names_the_device_its_cdi_names_nodes_and_udev_identity() -> None:
    entry = status_entry(DRIVER, DEVICE, POOL["fpga-0"], ["/dev/fpga0"])
    assert entry == {
        "driver": DRIVER,
        "pool": "node-a",
        "device": "fpga-0",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": f"prepared by {DRIVER} on its node",
                "lastTransitionTime": "",
            }
        ],
        "data": {
            "cdiDeviceIDs": ["example.com/fpga=0"],
            "deviceNodes": ["/dev/fpga0"],
            "udev": {"sysfsPath": "/sys/devices/fpga0", "serial": "SN123"},
        },
    }
    shared = PreparedDevice(("gpu",), "node-a", "fpga-0", ("example.com/fpga=0",), share_id="s1")
    assert status_entry(DRIVER, shared, None, [])["shareID"] == "s1"
    assert status_entry(DRIVER, shared, None, [])["data"] == {
        "cdiDeviceIDs": ["example.com/fpga=0"]
    }


def test_data_over_the_api_bound_keeps_only_the_cdi_names() -> None:
    nodes = [f"/dev/fpga{i}" for i in range(MAX_DATA)]
    assert status_entry(DRIVER, DEVICE, POOL["fpga-0"], nodes)["data"] == {
        "cdiDeviceIDs": ["example.com/fpga=0"]
    }


async def test_prepare_writes_our_entry_and_unprepare_clears_only_ours(
    api: FakeApiServer, client: ApiClient
) -> None:
    api.claims[("ns", "c")] = _claim()
    status = _status(client)
    entries = device_entries(DRIVER, [DEVICE], POOL, {"fpga-0": ("/dev/fpga0",)})
    _from_thread(status.prepared, "ns", "c", "u", entries)
    await _settle(status)
    other, ours = api.claims[("ns", "c")]["status"]["devices"]
    assert other["driver"] == "other.example.com"
    assert ours["driver"] == DRIVER and ours["device"] == "fpga-0"
    assert ours["conditions"][0]["lastTransitionTime"] == "2026-12-03T14:00:00Z"
    assert ours["data"]["deviceNodes"] == ["/dev/fpga0"]
    method, path, query = api.requests[-1]
    assert (method, path) == ("PATCH", STATUS)
    assert query == {"fieldManager": [DRIVER], "force": ["true"]}

    _from_thread(status.unprepared, "ns", "c", "u")
    await _settle(status)
    assert api.claims[("ns", "c")]["status"]["devices"] == [other]


async def test_a_failing_api_server_is_retried_and_a_gone_claim_ends_the_write(
    api: FakeApiServer, client: ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    api.claims[("ns", "c")] = _claim()
    api.answers[("PATCH", STATUS)] = Answer(500, b'{"message": "etcd"}', times=2)
    status = _status(client)
    _from_thread(status.prepared, "ns", "c", "u", device_entries(DRIVER, [DEVICE], POOL, {}))
    await _settle(status)
    assert [r for r in api.requests if r[0] == "PATCH"].__len__() == 3
    assert api.claims[("ns", "c")]["status"]["devices"][-1]["device"] == "fpga-0"
    assert "its status not written (attempt 1" in caplog.text

    del api.claims[("ns", "c")]
    _from_thread(status.unprepared, "ns", "c", "u")
    await _settle(status)
    assert status.enabled  # a 404 is the claim gone, not the feature


async def test_a_claim_made_anew_under_the_name_is_not_written(
    api: FakeApiServer, client: ApiClient
) -> None:
    api.claims[("ns", "c")] = _claim(uid="another")
    status = _status(client)
    _from_thread(status.prepared, "ns", "c", "u", device_entries(DRIVER, [DEVICE], POOL, {}))
    await _settle(status)
    assert len(api.claims[("ns", "c")]["status"]["devices"]) == 1


async def test_an_api_server_dropping_the_status_is_said_once_and_not_written_again(
    api: FakeApiServer, client: ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    api.claims[("ns", "c")] = _claim()
    api.drop_device_status = True
    status = _status(client)
    for _ in range(2):
        _from_thread(status.prepared, "ns", "c", "u", device_entries(DRIVER, [DEVICE], POOL, {}))
        await _settle(status)
    assert not status.enabled
    assert caplog.text.count("keeps no ResourceClaim status.devices") == 1
    assert len([r for r in api.requests if r[0] == "PATCH"]) == 1


async def test_an_unprepare_supersedes_a_prepare_still_retrying(
    api: FakeApiServer, client: ApiClient
) -> None:
    api.claims[("ns", "c")] = _claim()
    api.answers[("PATCH", STATUS)] = Answer(500, b'{"message": "etcd"}', times=1)
    status = _status(client)
    _from_thread(status.prepared, "ns", "c", "u", device_entries(DRIVER, [DEVICE], POOL, {}))
    await asyncio.sleep(0.02)
    _from_thread(status.unprepared, "ns", "c", "u")
    await _settle(status)
    assert [d["driver"] for d in api.claims[("ns", "c")]["status"]["devices"]] == [
        "other.example.com"
    ]


async def test_a_closed_loop_is_no_error_for_the_caller(client: ApiClient) -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    status = ClaimStatus(client, DRIVER, loop, retry_max=0.1)
    status.prepared("ns", "c", "u", [])  # never raises


async def test_close_cancels_a_write_the_api_server_holds(
    api: FakeApiServer, client: ApiClient
) -> None:
    api.claims[("ns", "c")] = _claim()
    api.hold_writes = asyncio.Event()
    status = _status(client)
    _from_thread(status.prepared, "ns", "c", "u", device_entries(DRIVER, [DEVICE], POOL, {}))
    await api.until(lambda: any(r[0] == "PATCH" for r in api.requests))
    assert status.running
    await status.close()
    assert not status.running
    api.hold_writes.set()


def _not_the_claim() -> list[bytes]:
    """2xx answers to a status write that are not the claim written: a proxy's empty object,
    a Status, another claim, the claim's name under another UID, a list."""
    other = {**_claim("another"), "status": {}}
    renamed = {**_claim(name="d"), "status": {}}
    return [
        b"{}",
        b'{"kind": "Status", "apiVersion": "v1", "status": "Success"}',
        orjson.dumps({**_claim(), "kind": "ResourceClaimTemplate", "status": {}}),
        orjson.dumps(other),
        orjson.dumps(renamed),
        b'{"kind": "ResourceClaim", "apiVersion": "resource.k8s.io/v1"}',
    ]


@pytest.mark.parametrize(
    "body",
    _not_the_claim(),
    ids=["empty", "status", "other-kind", "other-uid", "other-name", "no-metadata"],
)
async def test_an_answer_that_is_not_the_claim_is_retried_and_switches_nothing_off(
    api: FakeApiServer, client: ApiClient, caplog: pytest.LogCaptureFixture, body: bytes
) -> None:
    caplog.set_level(logging.WARNING)
    api.claims[("ns", "c")] = _claim()
    api.claims[("ns", "c2")] = _claim("u2", name="c2")
    api.answers[("PATCH", STATUS)] = Answer(200, body, times=2)
    status = _status(client)
    _from_thread(status.prepared, "ns", "c", "u", device_entries(DRIVER, [DEVICE], POOL, {}))
    await _settle(status)
    assert status.enabled
    assert "keeps no ResourceClaim status.devices" not in caplog.text
    assert "the answer is not the claim" in caplog.text
    assert len([r for r in api.requests if r[0] == "PATCH"]) == 3  # retried until written
    assert api.claims[("ns", "c")]["status"]["devices"][-1]["device"] == "fpga-0"
    # Another claim of the node still gets its status.
    _from_thread(status.prepared, "ns", "c2", "u2", device_entries(DRIVER, [DEVICE], POOL, {}))
    await _settle(status)
    assert api.claims[("ns", "c2")]["status"]["devices"][-1]["device"] == "fpga-0"


def test_an_interface_entry_carries_its_network_data() -> None:
    """KEP-4817 ``networkData`` beside ``data``; a device without an interface has none."""
    network = {"interfaceName": "lan1", "hardwareAddress": "00:e0:4c:68:00:01"}
    [entry, plain] = device_entries(
        DRIVER,
        [DEVICE, dataclasses.replace(DEVICE, device="fpga-1")],
        POOL,
        {},
        {"fpga-0": network},
    )
    assert entry["networkData"] == network
    assert "networkData" not in plain
