#!/bin/sh
# Regenerates the Python for the reduced CRI proto (runtime/v1/api.proto) into the containerd
# end-to-end tests' private package. The proto keeps its path "runtime/v1/api.proto" in the
# descriptor pool so that it can never clash with another "api.proto" (the device plugin's) in
# the same process; the generated gRPC module's absolute import is then made package-relative.
# Its messages go into a descriptor pool of their own: cdi-gen's own CRI proto (proto/cri/v1,
# the Version call) defines the same runtime.v1 symbols in the default pool, and both load in
# one pytest run (the wire knows field numbers only, so the two interoperate).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out="$here/../../tests/e2e/containerd/_cri"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m grpc_tools.protoc -I "$here" --python_out="$tmp" --pyi_out="$tmp" \
    --grpc_python_out="$tmp" runtime/v1/api.proto
mkdir -p "$out"
sed 's/^DESCRIPTOR = _descriptor_pool\.Default()\./DESCRIPTOR = _descriptor_pool.DescriptorPool()./' \
    "$tmp/runtime/v1/api_pb2.py" >"$out/api_pb2.py"
cp "$tmp/runtime/v1/api_pb2.pyi" "$out/"
sed 's/^from runtime\.v1 import api_pb2 as/from . import api_pb2 as/' \
    "$tmp/runtime/v1/api_pb2_grpc.py" >"$out/api_pb2_grpc.py"
printf '"""Generated from proto/cri/runtime/v1/api.proto by proto/cri/generate.sh; do not edit."""\n' \
    >"$out/__init__.py"
