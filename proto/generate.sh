#!/usr/bin/env bash
# Regenerate the committed Python modules of the kubelet APIs cdi-gen speaks: the device
# plugin (deviceplugin/v1beta1), the plugin watcher registration (pluginregistration/v1), the
# DRA node service (dra/v1, dra/v1beta1), DRA device health (drahealth/v1, drahealth/v1alpha1),
# the CRI runtime service's calls (cri/v1, package runtime.v1) and the kubelet's pod-resources
# lister (podresources/v1).
#
#   proto/generate.sh [OUT_ROOT]     (default OUT_ROOT: src)
#
# protoc names a module after the proto's path under the include root, so each proto is staged
# under cdi_gen/_proto/... in a scratch include root: the generated api_pb2_grpc.py then imports
# `cdi_gen._proto.<api>.<version>.api_pb2` absolutely, with no patching afterwards, and every
# file has a distinct name in protobuf's descriptor pool. The proto packages stay what the
# kubelet puts on the wire (`v1beta1`, `pluginregistration`, `k8s.io.kubelet.pkg.apis.dra.v1`...).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out_root="${1:-$here/../src}"
python="${PYTHON:-python3}"
# proto/<api>/<version>/api.proto -> cdi_gen/_proto/<api>/<version>/
apis=(deviceplugin/v1beta1 pluginregistration/v1 dra/v1 dra/v1beta1 drahealth/v1 drahealth/v1alpha1 cri/v1 podresources/v1)

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT

# Type stubs come from mypy-protobuf's protoc plugins, installed beside the interpreter (the
# project's .venv/bin) — never a fallback to other stubs, which would differ from the committed
# ones only on a machine that lacks the plugins.
bin_dir="$("$python" -c 'import os, sys; print(os.path.dirname(sys.executable))')"
export PATH="$bin_dir:$PATH"
for plugin in protoc-gen-mypy protoc-gen-mypy_grpc; do
    command -v "$plugin" >/dev/null \
        || { echo "proto/generate.sh: $plugin (mypy-protobuf) not found beside $python; run scripts/setup.sh test" >&2; exit 1; }
done
stubs=(--mypy_out="$out_root" --mypy_grpc_out="$out_root")

staged=()
for api in "${apis[@]}"; do
    module_dir="cdi_gen/_proto/$api"
    mkdir -p "$stage/$module_dir" "$out_root/$module_dir"
    cp "$here/$api/api.proto" "$stage/$module_dir/api.proto"
    staged+=("$stage/$module_dir/api.proto")
done

"$python" -m grpc_tools.protoc \
    --proto_path="$stage" \
    --python_out="$out_root" \
    --grpc_python_out="$out_root" \
    "${stubs[@]}" \
    "${staged[@]}"

# Package markers so the generated modules import as cdi_gen._proto.<api>.<version>.
for api in "${apis[@]}"; do
    for pkg in cdi_gen/_proto "cdi_gen/_proto/${api%%/*}" "cdi_gen/_proto/$api"; do
        [ -e "$out_root/$pkg/__init__.py" ] || : >"$out_root/$pkg/__init__.py"
    done
done
