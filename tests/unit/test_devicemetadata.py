"""Device metadata (KEP-5304): the container paths and the file's JSON stream, as Kubernetes'
``k8s.io/dynamic-resource-allocation/api/metadata`` fixes them."""

from __future__ import annotations

import orjson

from cdi_gen.dra.driver.devicemetadata import container_path, metadata_stream

BASE = "/var/run/kubernetes.io/dra-device-attributes"


def test_container_paths_for_direct_and_template_claims() -> None:
    assert (
        container_path("gpu.example.com", "my-claim", "gpu", None)
        == f"{BASE}/resourceclaims/my-claim/gpu/gpu.example.com-metadata.json"
    )
    # A subrequest's file is its request's; a template's claim is found by the pod's name.
    assert (
        container_path("gpu.example.com", "pod-x-gpu-7f2k", "gpu/small", "gpu")
        == f"{BASE}/resourceclaimtemplates/gpu/gpu/gpu.example.com-metadata.json"
    )


def test_the_stream_holds_each_version_newest_first() -> None:
    data = metadata_stream(
        driver="d.example.com",
        namespace="ns",
        claim="c",
        uid="u",
        pod_claim_name=None,
        request="r",
        devices=[("node", "dev-0", {})],
    )
    lines = data.splitlines()
    assert [orjson.loads(line)["apiVersion"] for line in lines] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    first = orjson.loads(lines[0])
    assert "podClaimName" not in first
    assert first["requests"] == [
        {"name": "r", "devices": [{"driver": "d.example.com", "pool": "node", "name": "dev-0"}]}
    ]
