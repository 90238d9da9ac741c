"""``cdi-gen probe``: ask the agent of this pod, over its ``--probe-socket``, whether it is
ready (or alive): the readiness probe of the DRA DaemonSet.

On the host's network two agents of a rolling update share one address, and the older one
holds it until it has gone: an HTTP probe of the address is answered by the older agent, so
the newer pod would be Ready before its own agent is, and a successor that never gets ready
(a bad config, a kubelet it cannot register with) would still replace every node's working
agent. The socket is in a folder of the pod's own (an ``emptyDir``), so this asks exactly
the agent of the container it runs in. Only the standard library's socket: a probe runs
every few seconds and must start fast.
"""

from __future__ import annotations

from pathlib import Path

import click

#: The whole exchange, connection included; the kubelet's own timeout for the probe is the
#: DaemonSet's ``timeoutSeconds``, above this.
TIMEOUT_SECONDS = 3.0
#: The longest answer read: the endpoints answer a line.
MAX_ANSWER = 64 * 1024


@click.command()
@click.option(
    "--socket",
    "socket_path",
    envvar="CDI_GEN_PROBE_SOCKET",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The agent's probe socket (its --probe-socket).  [env: CDI_GEN_PROBE_SOCKET]",
)
@click.option(
    "--live",
    is_flag=True,
    help="Ask whether the agent's event loop answers (/healthz) instead of whether it is "
    "ready (/readyz).",
)
def probe(socket_path: Path, live: bool) -> None:
    """Exit 0 when this pod's agent is ready (with --live: alive), else 1; print its answer
    (`ready`, or what it waits for)."""
    import socket
    import sys

    from cdi_gen.errors import CdiGenError, quote

    path = "/healthz" if live else "/readyz"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(TIMEOUT_SECONDS)
            conn.connect(str(socket_path))
            conn.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            answer = bytearray()
            while len(answer) < MAX_ANSWER and (chunk := conn.recv(MAX_ANSWER)):
                answer += chunk
    except OSError as exc:
        why = "no answer in time" if isinstance(exc, TimeoutError) else exc.strerror or exc
        raise CdiGenError(f"cannot ask the agent at {socket_path}: {why}") from None
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or not status[0].startswith(b"HTTP/"):
        shown = quote(bytes(answer[:80]).decode("latin-1"))
        raise CdiGenError(f"the agent at {socket_path} answered {path} with no HTTP: {shown}")
    click.echo(body.decode("utf-8", "replace").strip())
    if status[1] != b"200":
        sys.exit(1)
