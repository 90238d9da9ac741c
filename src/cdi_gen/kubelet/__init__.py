"""The kubelet-facing consumers: the device plugin (and, next, DRA); the only grpc user."""
