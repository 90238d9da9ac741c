#!/bin/sh
# Re-render every sample spec from source/config.yaml and the recorded udev data in
# source/records.json (this folder itself holds only spec files, so it can serve as a spec dir).
set -eu
cd "$(dirname "$0")"
for class in fpga loop render; do
    cdi-gen render --config source/config.yaml --records source/records.json --class "$class" \
        --output "example.com-$class.json"
done
