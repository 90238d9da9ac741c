"""The API client against an API server that answers too much: every answer is read within
a bound and refused beyond it in one line, and the kubeconfig (and the files it names) are
capped like other configs and read off the event loop.

A real HTTP server on 127.0.0.1 (:mod:`tests.fakes.apiserver`) speaks the API server's wire
format; the client talks to it as to the real one.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from cdi_gen.apiserver.answers import MAX_ANSWER_BYTES
from cdi_gen.apiserver.client import ApiClient
from cdi_gen.apiserver.errors import ApiServerError, KubeConfigError
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.dra.plugin.publisher import SlicePublisher
from cdi_gen.errors import ClaimError
from cdi_gen.files import CONFIG_MAX_BYTES
from cdi_gen.model import PoolDevice
from tests.fakes.apiserver import SLICES, Answer, FakeApiServer
from tests.unit.conftest import API_NODE

DRIVER = "drv.example.com"
NODE = API_NODE


def _claim(size: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "c",
            "namespace": "ns",
            "uid": "u",
            "annotations": {"pad": "x" * size},
        },
        "spec": {},
    }


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_an_oversize_claim_is_refused_in_one_line(
    api: FakeApiServer, client: ApiClient, chunked: bool
) -> None:
    body = json.dumps(_claim(MAX_ANSWER_BYTES + 1000)).encode()
    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"
    api.answers[("GET", path)] = Answer(200, body, chunked=chunked)
    with pytest.raises(ClaimError) as caught:
        await client.get_claim("ns", "c")
    message = str(caught.value)
    assert "ResourceClaim ns/c" in message and "MiB" in message and "\n" not in message


async def test_a_compressed_answer_is_refused_before_it_is_inflated(
    api: FakeApiServer, client: ApiClient
) -> None:
    # A few KiB on the wire, over the bound once inflated: the bound must hold for what is
    # decoded, and a server we asked for no compression has no reason to send any.
    body = gzip.compress(json.dumps(_claim(MAX_ANSWER_BYTES + 1000)).encode())
    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"
    api.answers[("GET", path)] = Answer(200, body, headers={"Content-Encoding": "gzip"})
    with pytest.raises(ClaimError, match=r"ResourceClaim ns/c: .*compressed"):
        await client.get_claim("ns", "c")


@pytest.mark.parametrize(
    ("status", "body", "rule"),
    [
        pytest.param(200, b"[" * 100_000 + b"]" * 100_000, "not JSON", id="nested-too-deep"),
        pytest.param(200, b"<html>502 Bad Gateway</html>", "not JSON", id="html"),
        pytest.param(200, b"[1, 2]", "not a JSON object", id="not-an-object"),
        pytest.param(
            500,
            json.dumps(
                {"kind": "Status", "reason": "Internal\nError", "message": "a\nf" + "x" * 5000}
            ).encode(),
            "HTTP 500",
            id="error-with-newlines",
        ),
        pytest.param(502, b"<html>\n502 Bad Gateway\n</html>", "HTTP 502", id="error-html"),
    ],
)
async def test_a_broken_claim_answer_is_one_line_naming_the_claim(
    api: FakeApiServer, client: ApiClient, status: int, body: bytes, rule: str
) -> None:
    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"
    api.answers[("GET", path)] = Answer(status, body)
    with pytest.raises(ClaimError) as caught:
        await client.get_claim("ns", "c")
    message = str(caught.value)
    assert message.startswith("ResourceClaim ns/c: ") and rule in message, message
    assert "\n" not in message and len(message) < 400, message


async def test_a_claim_under_the_cap_is_read(api: FakeApiServer, client: ApiClient) -> None:
    api.claims[("ns", "c")] = _claim(MAX_ANSWER_BYTES // 2)
    claim = await client.get_claim("ns", "c")
    assert (claim.namespace, claim.name, claim.uid) == ("ns", "c", "u")


async def test_an_oversize_watch_line_is_refused(api: FakeApiServer, client: ApiClient) -> None:
    big = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s", "resourceVersion": "9", "annotations": {"pad": "x"}},
        "spec": {"driver": DRIVER, "nodeName": NODE, "pool": {"name": NODE, "generation": 1,
                 "resourceSliceCount": 1}},
    }  # fmt: skip
    events = client.watch_slices(DRIVER, NODE)
    first = asyncio.ensure_future(anext(events))
    await api.until(lambda: api.watches_opened == 1)
    api.send_raw(json.dumps({"type": "ADDED", "object": big}).encode())
    assert (await first)[0] == "ADDED"
    big["metadata"]["annotations"] = {"pad": "x" * (MAX_ANSWER_BYTES + 10)}
    api.send_raw(json.dumps({"type": "MODIFIED", "object": big}).encode())
    with pytest.raises(ApiServerError, match="MiB"):
        await anext(events)
    await events.aclose()


async def test_an_oversize_slice_list_is_refused(api: FakeApiServer, client: ApiClient) -> None:
    items = [{"metadata": {"name": f"s{i}", "annotations": {"pad": "x" * (1 << 20)}}}
             for i in range(40)]  # fmt: skip
    api.answers[("GET", SLICES)] = Answer(200, json.dumps({"items": items}).encode())
    with pytest.raises(ApiServerError, match="MiB"):
        await client.list_slices(DRIVER, NODE)


async def test_a_long_slice_list_is_read_in_pages(api: FakeApiServer, client: ApiClient) -> None:
    pool = DevicePool()
    pool.publish("c", [PoolDevice(name=f"d{i}", cdi_name=f"v.com/c=d{i}", class_name="c",
                                  physical=f"/d{i}") for i in range(700)])  # fmt: skip
    publisher = SlicePublisher(client, DRIVER, NODE, pool)
    task = asyncio.create_task(publisher.run())
    assert await publisher.published(pool.version, 10)
    pool.close()
    await task
    listed = await client.list_slices(DRIVER, NODE)
    assert sorted(s["metadata"]["name"] for s in listed) == sorted(api.slices)
    assert len(listed) == 6


def _kubeconfig_text(api: FakeApiServer, **cluster: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "f", "cluster": {"server": api.url, **cluster}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "f", "user": "u"}}],
            "current-context": "c",
        }
    )


async def test_an_oversize_kubeconfig_is_refused_without_reading_it(
    api: FakeApiServer, tmp_path: Path
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(_kubeconfig_text(api) + "\n#" + "x" * CONFIG_MAX_BYTES)
    with pytest.raises(KubeConfigError, match="too large"):
        await ApiClient.open(path)


async def test_a_kubeconfig_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path = tmp_path / "kubeconfig"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(KubeConfigError, match="aliases expand"):
        await ApiClient.open(path)


async def test_a_fifo_kubeconfig_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    os.mkfifo(path)
    with pytest.raises(KubeConfigError, match="FIFO"):
        await ApiClient.open(path)


async def test_a_missing_file_the_kubeconfig_names_is_one_line_naming_it(
    api: FakeApiServer, tmp_path: Path
) -> None:
    gone = tmp_path / "gone.pem"
    path = tmp_path / "kubeconfig"
    path.write_text(_kubeconfig_text(api, **{"certificate-authority": str(gone)}))
    with pytest.raises(KubeConfigError) as info:
        await ApiClient.open(path)
    assert str(info.value).endswith(f": {str(gone)!r}: no such file"), str(info.value)


@pytest.mark.parametrize("key", ["certificate-authority"])
async def test_a_file_the_kubeconfig_names_is_bounded_too(
    api: FakeApiServer, tmp_path: Path, key: str
) -> None:
    big = tmp_path / "big.pem"
    big.write_bytes(b"x" * (CONFIG_MAX_BYTES + 1))
    path = tmp_path / "kubeconfig"
    path.write_text(_kubeconfig_text(api, **{key: str(big)}))
    with pytest.raises(KubeConfigError, match="too large"):
        await ApiClient.open(path)


async def test_a_token_file_the_kubeconfig_names_is_bounded_too(
    api: FakeApiServer, tmp_path: Path
) -> None:
    big = tmp_path / "token"
    big.write_bytes(b"x" * (CONFIG_MAX_BYTES + 1))
    config = json.loads(_kubeconfig_text(api))
    config["users"][0]["user"] = {"tokenFile": str(big)}
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    with pytest.raises(KubeConfigError, match="too large"):
        await ApiClient.open(path)


async def test_the_kubeconfig_is_read_off_the_event_loop(
    api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cdi_gen.apiserver.kubeconfig as module

    readers: list[int] = []
    real = module.read_required

    def spy(path: Any, limit: int, **kw: Any) -> bytes:
        readers.append(threading.get_ident())
        return real(path, limit, **kw)

    monkeypatch.setattr(module, "read_required", spy)
    client = await ApiClient.open(api.kubeconfig(tmp_path))
    await client.close()
    assert readers and threading.get_ident() not in readers


async def test_the_client_speaks_http1_without_loading_h2(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """In a process of its own, as in the agent: the client reads the Node over HTTP/1.1 and
    h2, hpack and hyperframe (1.3 MiB, for HTTP/2 it never speaks) are never imported."""
    script = f"""
import asyncio, sys
from pathlib import Path
from cdi_gen.apiserver.client import ApiClient

async def main() -> None:
    client = await ApiClient.open(Path({str(api.kubeconfig(tmp_path))!r}))
    try:
        print(await client.node_uid({NODE!r}))
    finally:
        await client.close()

asyncio.run(main())
print(sorted(m for m, v in sys.modules.items() if v and m.split(".")[0] in
             ("h2", "hpack", "hyperframe")))
"""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().splitlines() == ["node-uid", "[]"]


async def test_the_client_speaks_https_trusting_the_kubeconfigs_ca_only(tmp_path: Path) -> None:
    """As in a pod (the service account's ca.crt): the client reads the Node over HTTPS from a
    server the kubeconfig's CA signed, and refuses, in one line, one that another CA signed."""
    from tests.pki import Authority

    async with FakeApiServer(tls=tmp_path / "pki") as api:
        api.nodes[NODE] = "node-uid"
        client = await ApiClient.open(api.kubeconfig(tmp_path))
        try:
            assert api.url.startswith("https://")
            assert await client.node_uid(NODE) == "node-uid"
        finally:
            await client.close()
        other = Authority(tmp_path / "other")
        kubeconfig = api.kubeconfig(tmp_path)
        kubeconfig.write_text(
            kubeconfig.read_text().replace(str(api.tls / "ca.crt"), str(other.cert))
        )
        client = await ApiClient.open(kubeconfig)
        try:
            with pytest.raises(ApiServerError) as caught:
                await client.node_uid(NODE)
        finally:
            await client.close()
    message = str(caught.value)
    assert "certificate verify failed" in message and "\n" not in message, message
