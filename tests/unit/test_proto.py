"""The committed generated modules must be exactly what proto/generate.sh produces now, and the
wire names the kubelet uses must come out of them."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE_DIR = Path("cdi_gen/_proto/deviceplugin/v1beta1")
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")


def test_proto_generated_modules_match_the_proto() -> None:
    if shutil.which("protoc-gen-mypy") is None:
        pytest.skip("mypy-protobuf (lint extra) is needed to regenerate the committed stubs")
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PYTHON": sys.executable}
        subprocess.run(
            ["bash", str(ROOT / "proto/generate.sh"), out],
            check=True,
            env=env,
            capture_output=True,
        )
        stale = [
            name
            for name in GENERATED
            if not filecmp.cmp(
                Path(out) / MODULE_DIR / name, ROOT / "src" / MODULE_DIR / name, shallow=False
            )
        ]
    assert stale == [], f"run proto/generate.sh: {stale} differ from proto/deviceplugin"


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
