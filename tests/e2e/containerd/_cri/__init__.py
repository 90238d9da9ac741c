"""Generated from proto/cri/runtime/v1/api.proto by proto/cri/generate.sh; do not edit."""
