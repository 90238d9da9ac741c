"""Claims read through the agent's API client from an API server stand-in over real HTTP:
whatever the server answers (not JSON, another kind, a result without its device), stalls
on, or would be asked for with a name that is not a Kubernetes name, each claim gets one
line naming it and the rule, within the time it is given, and a bad name is never sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from cdi_gen.apiserver.client import ApiClient
from cdi_gen.apiserver.resourceclaim import claim_view
from cdi_gen.dra.plugin.claimreader import ApiClaimReader
from cdi_gen.errors import ClaimError
from cdi_gen.model import AllocatedDevice, ClaimView, ConfigEntry
from tests.fakes.claimserver import ClaimServer, claim_body

pytestmark = pytest.mark.timeout(60)

RESULT = {"request": "r", "driver": "cdi-gen.example.com", "pool": "node-a", "device": "fpga-0"}


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[ClaimServer, ApiClaimReader]]:
    with ClaimServer.running(tmp_path) as server:
        client = ApiClient(server.kubeconfig)
        try:
            yield server, ApiClaimReader(client, asyncio.get_running_loop(), timeout=10)
        finally:
            await client.close()


async def read(reader: ApiClaimReader, *refs: tuple[str, str], within: float = 5) -> list[object]:
    # From a thread, as the gRPC server's threads call it: the client runs on this loop.
    return list(await asyncio.to_thread(reader.read_claims, refs, within))


async def test_a_claim_is_read(served: tuple[ClaimServer, ApiClaimReader]) -> None:
    server, reader = served
    server.bodies["ns", "c"] = claim_body("ns", "c", "u1", {**RESULT, "shareID": "s"})
    [view] = await read(reader, ("ns", "c"))
    assert view == ClaimView(
        "ns", "c", "u1", (AllocatedDevice("r", "cdi-gen.example.com", "node-a", "fpga-0", "s"),)
    )
    [missing] = await read(reader, ("ns", "gone"))
    assert isinstance(missing, ClaimError)
    assert str(missing) == "ResourceClaim ns/gone: not found"


PARAMETERS = {"apiVersion": "cdi-gen.io/v1alpha1", "kind": "DeviceConfig", "env": {"A": "1"}}


async def test_config_entries_and_admin_access_are_read(
    served: tuple[ClaimServer, ApiClaimReader],
) -> None:
    # Before: the allocation's config and adminAccess were dropped, so a claim's
    # configuration was silently ignored.
    server, reader = served
    config = [
        {"source": "FromClass", "opaque": {"driver": "other.example.com", "parameters": {}}},
        {
            "source": "FromClaim",
            "requests": ["r"],
            "opaque": {"driver": "d", "parameters": PARAMETERS},
        },
        {"source": "FromClaim", "future": {"kind": "not opaque"}},
    ]
    server.bodies["ns", "c"] = claim_body(
        "ns", "c", "u1", {**RESULT, "adminAccess": True}, config=config
    )
    [view] = await read(reader, ("ns", "c"))
    assert isinstance(view, ClaimView)
    assert view.results is not None and view.results[0].admin_access
    assert view.config == (
        ConfigEntry("FromClass", "other.example.com", (), index=0),
        ConfigEntry("FromClaim", "d", ("r",), index=1),
    )
    assert view.config[1].parameters == PARAMETERS


@pytest.mark.parametrize(
    ("config", "rule"),
    [
        ("x", "status.allocation.devices: config: want a list, got 'x'"),
        ([{"source": 1}], "status.allocation.devices.config[0]: source: want a string, got 1"),
        ([{"requests": ["a", 2]}], "config[0]: requests: want a list of strings, got ['a', 2]"),
        ([{"opaque": {"parameters": {}}}], "config[0].opaque: has no 'driver'"),
    ],
)
async def test_a_malformed_config_entry_is_that_claims_error(
    served: tuple[ClaimServer, ApiClaimReader], config: object, rule: str
) -> None:
    server, reader = served
    body = orjson.loads(claim_body("ns", "c", "u1", RESULT))
    body["status"]["allocation"]["devices"]["config"] = config
    server.bodies["ns", "c"] = orjson.dumps(body)
    [error] = await read(reader, ("ns", "c"))
    assert isinstance(error, ClaimError)
    assert rule in str(error)


@pytest.mark.parametrize(
    ("annotation", "outcome"),
    [
        ("accel", "accel"),
        ("../etc", "annotation resource.kubernetes.io/pod-claim-name '../etc' is not a pod's"),
        (7, "annotations: resource.kubernetes.io/pod-claim-name: want a string, got 7"),
    ],
)
async def test_the_pod_claim_name_of_a_template_claim_is_read(
    served: tuple[ClaimServer, ApiClaimReader], annotation: object, outcome: str
) -> None:
    # The device metadata's path in the container is built from it: a DNS label or nothing.
    server, reader = served
    body = orjson.loads(claim_body("ns", "c", "u1", RESULT))
    body["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": annotation}
    server.bodies["ns", "c"] = orjson.dumps(body)
    [view] = await read(reader, ("ns", "c"))
    if isinstance(view, ClaimView):
        assert view.pod_claim_name == outcome
    else:
        assert outcome in str(view)


NOT_CLAIMS = [
    (b"{not json", "not JSON"),
    (b"<html>502 Bad Gateway</html>", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (
        orjson.dumps({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "c"}}),
        "not a ResourceClaim",
    ),
    (
        claim_body("ns", "c", "u1", {k: v for k, v in RESULT.items() if k != "device"}),
        "has no 'device'",
    ),
    (claim_body("ns", "c", "u1", {**RESULT, "pool": 7}), "pool"),
]


@pytest.mark.parametrize(("body", "rule"), NOT_CLAIMS)
async def test_an_answer_that_is_not_a_claim_is_that_claims_error(
    served: tuple[ClaimServer, ApiClaimReader], body: bytes, rule: str
) -> None:
    server, reader = served
    server.bodies["ns", "c"] = body
    server.bodies["ns", "ok"] = claim_body("ns", "ok", "u2", RESULT)
    bad, good = await read(reader, ("ns", "c"), ("ns", "ok"))
    assert isinstance(bad, ClaimError), bad
    message = str(bad)
    assert message.startswith("ResourceClaim ns/c: "), message
    assert rule in message, message
    assert message.isprintable(), message
    assert len(message) < 400, message
    assert isinstance(good, ClaimView)


async def test_a_stalled_answer_ends_within_the_time_given(
    served: tuple[ClaimServer, ApiClaimReader],
) -> None:
    server, reader = served
    server.bodies["ns", "slow"] = claim_body("ns", "slow", "u1", RESULT)
    server.stalled.add(("ns", "slow"))
    server.bodies["ns", "ok"] = claim_body("ns", "ok", "u2", RESULT)
    slow, good = await read(reader, ("ns", "slow"), ("ns", "ok"), within=0.5)
    assert isinstance(slow, ClaimError)
    assert str(slow) == "ResourceClaim ns/slow: the API server did not answer within 0.5 s"
    assert isinstance(good, ClaimView)  # read beside the stalled one, not behind it


@pytest.mark.parametrize(
    ("namespace", "name"),
    [
        ("../../../../../api/v1/nodes", ".."),
        ("kube-system", "../secrets/token"),
        ("*", "c"),
        ("", "c"),
        ("ns", "c\nforged"),
        ("ns", "C"),
        ("ns", "x" * 254),
    ],
)
async def test_a_name_that_is_not_a_kubernetes_name_is_never_sent(
    served: tuple[ClaimServer, ApiClaimReader], namespace: str, name: str
) -> None:
    server, reader = served
    [refused] = await read(reader, (namespace, name))
    assert isinstance(refused, ClaimError), refused
    message = str(refused)
    assert "DNS label" in message, message
    assert "DNS subdomain" in message, message
    assert message.isprintable(), message
    assert server.requests == []


@pytest.mark.parametrize(
    ("obj", "rule"),
    [
        ([], "want an object"),
        ({"metadata": {"name": 3}}, "name: want a string, got 3"),
        (
            {"metadata": {"name": "c"}, "status": {"allocation": {"devices": {"results": {}}}}},
            "results: want a list",
        ),
        (
            {"status": {"allocation": {"devices": {"results": [{"request": "r"}]}}}},
            "results[0]: has no 'driver'",
        ),
        (
            {"status": {"allocation": {"devices": {"results": ["x" * 500]}}}},
            "results[0]: want an object, got 'xxx",
        ),
    ],
)
def test_claim_view_names_the_field(obj: object, rule: str) -> None:
    with pytest.raises(ClaimError) as refused:
        claim_view(obj)
    message = str(refused.value)
    assert rule in message, message
    assert len(message) < 300, message
