"""The committed generated modules must be exactly what proto/generate.sh produces now, and the
wire names the kubelet uses must come out of them."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
APIS = (
    "deviceplugin/v1beta1",
    "pluginregistration/v1",
    "dra/v1",
    "dra/v1beta1",
    "drahealth/v1",
    "drahealth/v1alpha1",
    "cri/v1",
    "podresources/v1",
)
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")


def test_proto_generated_modules_match_the_proto() -> None:
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PYTHON": sys.executable}
        generated = subprocess.run(
            ["bash", str(ROOT / "proto/generate.sh"), out],
            check=False,
            env=env,
            capture_output=True,
            text=True,
        )
        assert generated.returncode == 0, generated.stderr
        stale = [
            f"{api}/{name}"
            for api in APIS
            for name in GENERATED
            if not filecmp.cmp(
                Path(out) / "cdi_gen/_proto" / api / name,
                ROOT / "src/cdi_gen/_proto" / api / name,
                shallow=False,
            )
        ]
    assert stale == [], f"run proto/generate.sh: {stale} differ from their protos"


def test_proto_wire_names_are_the_kubelets() -> None:
    from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2

    services = api_pb2.DESCRIPTOR.services_by_name
    assert [m.full_name for m in services["Registration"].methods] == [
        "v1beta1.Registration.Register"
    ]
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert services["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming
    fields = {f.name: f.number for f in api_pb2.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert fields == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    request = api_pb2.ContainerPreferredAllocationRequest.DESCRIPTOR
    assert {f.name: f.number for f in request.fields} == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }


def test_dra_wire_names_are_the_kubelets() -> None:
    """The kubelet calls /<proto package>.<Service>/<Method>: these names are the contract."""
    from cdi_gen._proto.dra.v1 import api_pb2 as v1
    from cdi_gen._proto.dra.v1beta1 import api_pb2 as v1beta1
    from cdi_gen._proto.drahealth.v1 import api_pb2 as health_v1
    from cdi_gen._proto.drahealth.v1alpha1 import api_pb2 as health
    from cdi_gen._proto.pluginregistration.v1 import api_pb2 as registration

    def methods(module: object, service: str) -> list[str]:
        descriptor = module.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
        return [m.full_name for m in descriptor.methods]

    assert methods(registration, "Registration") == [
        "pluginregistration.Registration.GetInfo",
        "pluginregistration.Registration.NotifyRegistrationStatus",
    ]
    for module, version in ((v1, "v1"), (v1beta1, "v1beta1")):
        package = f"k8s.io.kubelet.pkg.apis.dra.{version}"
        assert methods(module, "DRAPlugin") == [
            f"{package}.DRAPlugin.NodePrepareResources",
            f"{package}.DRAPlugin.NodeUnprepareResources",
        ]
        assert {f.name: f.number for f in module.Claim.DESCRIPTOR.fields} == {
            "namespace": 1,
            "uid": 2,
            "name": 3,
        }
    device = {f.name: f.number for f in v1.Device.DESCRIPTOR.fields}
    assert device == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert v1.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence
    assert "share_id" not in v1beta1.Device.DESCRIPTOR.fields_by_name
    info = {f.name: f.number for f in registration.PluginInfo.DESCRIPTOR.fields}
    assert info == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    # v1 (Kubernetes 1.37) and v1alpha1 differ only in the package: one stream serves both.
    for module, version in ((health_v1, "v1"), (health, "v1alpha1")):
        watch = module.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods_by_name
        assert watch["NodeWatchResources"].full_name == (
            f"{version}.DRAResourceHealth.NodeWatchResources"
        )
        assert watch["NodeWatchResources"].server_streaming
        assert {f.name: f.number for f in module.DeviceHealth.DESCRIPTOR.fields} == {
            "device": 1,
            "health": 2,
            "last_updated_time": 3,
            "health_check_timeout_seconds": 4,
            "message": 5,
        }
        identifier = {f.name: f.number for f in module.DeviceIdentifier.DESCRIPTOR.fields}
        assert identifier == {"pool_name": 1, "device_name": 2}
        assert (module.UNKNOWN, module.HEALTHY, module.UNHEALTHY) == (0, 1, 2)


def test_cri_wire_names_are_the_runtimes() -> None:
    """containerd and CRI-O answer /runtime.v1.RuntimeService/Version with these numbers."""
    from cdi_gen._proto.cri.v1 import api_pb2 as cri

    service = cri.DESCRIPTOR.services_by_name["RuntimeService"]
    assert [m.full_name for m in service.methods] == [
        "runtime.v1.RuntimeService.Version",
        "runtime.v1.RuntimeService.ListPodSandbox",
        "runtime.v1.RuntimeService.ListContainers",
        "runtime.v1.RuntimeService.ContainerStatus",
        "runtime.v1.RuntimeService.StopContainer",
    ]
    assert {f.name: f.number for f in cri.VersionRequest.DESCRIPTOR.fields} == {"version": 1}
    assert {f.name: f.number for f in cri.VersionResponse.DESCRIPTOR.fields} == {
        "version": 1,
        "runtime_name": 2,
        "runtime_version": 3,
        "runtime_api_version": 4,
    }


def test_cri_container_lookup_wire_numbers_are_the_runtimes() -> None:
    """The fields the container lookup sends and reads, numbered as cri-api's v1 proto."""
    from cdi_gen._proto.cri.v1 import api_pb2 as cri

    def numbers(message: Any) -> dict[str, int]:
        return {f.name: f.number for f in message.DESCRIPTOR.fields}

    assert numbers(cri.PodSandboxFilter) == {"id": 1, "state": 2, "label_selector": 3}
    assert numbers(cri.PodSandboxMetadata) == {"name": 1, "uid": 2, "namespace": 3, "attempt": 4}
    assert numbers(cri.PodSandbox) == {
        "id": 1,
        "metadata": 2,
        "state": 3,
        "created_at": 4,
        "labels": 5,
    }
    assert numbers(cri.ContainerFilter) == {
        "id": 1,
        "state": 2,
        "pod_sandbox_id": 3,
        "label_selector": 4,
    }
    assert numbers(cri.Container) == {
        "id": 1,
        "pod_sandbox_id": 2,
        "metadata": 3,
        "state": 6,
        "created_at": 7,
        "labels": 8,
    }
    assert numbers(cri.ContainerStatusRequest) == {"container_id": 1, "verbose": 2}
    assert numbers(cri.ContainerStatusResponse) == {"status": 1, "info": 2}
    assert numbers(cri.ContainerStatus) == {"id": 1, "metadata": 2, "state": 3, "started_at": 5}
    assert numbers(cri.StopContainerRequest) == {"container_id": 1, "timeout": 2}
    assert (cri.SANDBOX_READY, cri.CONTAINER_RUNNING, cri.CONTAINER_EXITED) == (0, 1, 2)


def test_podresources_wire_names_are_the_kubelets() -> None:
    """The kubelet serves /v1.PodResourcesLister/{List,Get} with these field numbers."""
    from cdi_gen._proto.podresources.v1 import api_pb2 as pr

    def numbers(message: Any) -> dict[str, int]:
        return {f.name: f.number for f in message.DESCRIPTOR.fields}

    service = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert [m.full_name for m in service.methods] == [
        "v1.PodResourcesLister.List",
        "v1.PodResourcesLister.Get",
    ]
    assert numbers(pr.PodResources) == {"name": 1, "namespace": 2, "containers": 3}
    assert numbers(pr.ContainerResources) == {"name": 1, "devices": 2, "dynamic_resources": 5}
    assert numbers(pr.ContainerDevices) == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert numbers(pr.DynamicResource) == {
        "claim_name": 2,
        "claim_namespace": 3,
        "claim_resources": 4,
    }
    assert numbers(pr.ClaimResource) == {
        "cdi_devices": 1,
        "driver_name": 2,
        "pool_name": 3,
        "device_name": 4,
    }
    assert numbers(pr.GetPodResourcesRequest) == {"pod_name": 1, "pod_namespace": 2}


def test_the_containerd_e2e_cri_client_loads_beside_ours() -> None:
    """The e2e tests' fuller CRI proto defines the same runtime.v1 symbols; one pytest run
    loads both, so it keeps its own descriptor pool (proto/cri/generate.sh)."""
    from cdi_gen._proto.cri.v1 import api_pb2 as ours
    from tests.e2e.containerd._cri import api_pb2 as e2e

    answer = e2e.VersionResponse(runtime_name="containerd", runtime_version="v2.3.7")
    assert ours.VersionResponse.FromString(answer.SerializeToString()).runtime_version == "v2.3.7"
    status = e2e.ContainerStatusResponse(info={"info": '{"pid": 7}'})
    status.status.reason = "Completed"  # a field ours leaves out: skipped on the wire
    assert dict(ours.ContainerStatusResponse.FromString(status.SerializeToString()).info) == {
        "info": '{"pid": 7}'
    }
