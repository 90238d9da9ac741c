#!/usr/bin/env bash
# Regenerate the committed Python modules of the kubelet device plugin API.
#
#   proto/generate.sh [OUT_ROOT]     (default OUT_ROOT: src)
#
# protoc names a module after the proto's path under the include root, so the proto is staged
# under cdi_gen/_proto/... in a scratch include root: the generated api_pb2_grpc.py then imports
# `cdi_gen._proto.deviceplugin.v1beta1.api_pb2` absolutely, with no patching afterwards. The proto
# package stays `v1beta1`, which is what puts `/v1beta1.DevicePlugin/...` on the wire.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out_root="${1:-$here/../src}"
python="${PYTHON:-python3}"
module_dir="cdi_gen/_proto/deviceplugin/v1beta1"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$module_dir" "$out_root/$module_dir"
cp "$here/deviceplugin/v1beta1/api.proto" "$stage/$module_dir/api.proto"

# Type stubs come from mypy-protobuf when its plugins are installed, else from protoc's own pyi.
if command -v protoc-gen-mypy >/dev/null && command -v protoc-gen-mypy_grpc >/dev/null; then
    stubs=(--mypy_out="$out_root" --mypy_grpc_out="$out_root")
else
    stubs=(--pyi_out="$out_root")
fi

"$python" -m grpc_tools.protoc \
    --proto_path="$stage" \
    --python_out="$out_root" \
    --grpc_python_out="$out_root" \
    "${stubs[@]}" \
    "$stage/$module_dir/api.proto"

# Package markers so the generated modules import as cdi_gen._proto.deviceplugin.v1beta1.
for pkg in cdi_gen/_proto cdi_gen/_proto/deviceplugin "$module_dir"; do
    [ -e "$out_root/$pkg/__init__.py" ] || : >"$out_root/$pkg/__init__.py"
done
