"""A free TCP port on loopback, for the servers the tests start (metrics, API server, etcd).

The port is free when asked; the server binds it a moment later, which on a test machine is
as good as it gets without the server reporting the port it chose itself.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
