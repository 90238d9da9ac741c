#!/bin/sh
# Re-render the spec of every example from its config.yaml and records.json, as
#   cdi-gen render --config config.yaml --records records.json --class <class> \
#     --runtime containerd@2.3.7,runc@1.4.0
# does (spec.json, or spec-<class>.json in a folder of several classes).
# tests/unit/test_examples.py fails when a shipped spec differs from what this writes.
set -eu
cd "$(dirname "$0")/../.."
exec .venv/bin/python -m tests.examples
