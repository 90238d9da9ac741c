"""Generated gRPC/protobuf modules (proto/generate.sh); never edited by hand."""
