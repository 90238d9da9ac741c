"""What the agent may do to a running container, found once at start, and so the ``whenBack``
each class runs with.

``follow`` changes a holding container's device cgroup and makes a node in its mount
namespace: it needs the node's PID namespace (the runtime's PIDs mean the same processes
here: the runtime answering on the CRI socket is a process of the agent's own PID namespace),
the capabilities of :data:`FOLLOW_CAPABILITIES` in the effective set, a cgroup hierarchy
mounted writable, and both sockets. ``restart`` needs the kubelet's pod-resources
socket (who holds the device) and a CRI socket (to stop the holders). A class whose policy
lacks something runs as the next one down (``follow`` → ``restart`` → ``keep``), said in one
line at start naming what is missing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cdi_gen.agent.follow import Hierarchies
from cdi_gen.errors import quote

__all__ = [
    "FOLLOW_CAPABILITIES",
    "Policy",
    "Privileges",
    "effective_capabilities",
    "effective_policy",
]

log = logging.getLogger("cdi_gen.agent.agent")

Policy = Literal["keep", "restart", "follow"]
#: Capability bits (linux/capability.h).
CAP_CHOWN = 0
CAP_FOWNER = 3
CAP_SYS_CHROOT = 18
CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
CAP_MKNOD = 27
#: What ``follow`` uses each for (docs/security.md names them too).
FOLLOW_CAPABILITIES: dict[str, tuple[int, str]] = {
    "CAP_SYS_ADMIN": (CAP_SYS_ADMIN, "setns into a mount namespace, bpf(2), devices.allow"),
    "CAP_SYS_CHROOT": (CAP_SYS_CHROOT, "setns into a mount namespace"),
    "CAP_SYS_PTRACE": (CAP_SYS_PTRACE, "setns by the pidfd of a process of another user"),
    "CAP_MKNOD": (CAP_MKNOD, "the node made in the container"),
    "CAP_CHOWN": (CAP_CHOWN, "the node given the spec's owner and group"),
    "CAP_FOWNER": (CAP_FOWNER, "the node given the spec's mode once another user's"),
}
#: How long the CRI socket's peer may take to accept the connection that names it.
_CONNECT_SECONDS = 0.5


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


def _writable(folder: str) -> bool:
    """Whether this process may write ``folder`` (root may, unless its mount is read-only)."""
    try:
        return os.access(folder, os.W_OK) and not os.statvfs(folder).f_flag & os.ST_RDONLY
    except OSError:
        return False


def effective_capabilities(status: str | None = None) -> int:
    """The ``CapEff`` bits of this process (``/proc/self/status``, or ``status``'s text)."""
    if status is None:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            status = f.read()
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            with contextlib.suppress(ValueError):
                return int(line.split(":", 1)[1].strip(), 16)
    return 0


def _same_pid_namespace(cri: Path) -> str | None:
    """Why the runtime answering on ``cri`` is not of this PID namespace, or None.

    The kernel gives a unix socket's peer PID as this namespace sees it: 0 when the peer is
    not visible from here (the agent in a PID namespace of its own, no ``hostPID``)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(_CONNECT_SECONDS)
            conn.connect(str(cri))
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError as exc:
        return f"the CRI socket {cri} did not accept a connection: {exc.strerror or exc}"
    pid = struct.unpack("3i", creds)[0]
    if pid <= 0:
        return f"the runtime on {cri} is not visible in the agent's PID namespace (no hostPID)"
    try:
        theirs, ours = os.stat(f"/proc/{pid}/ns/pid"), os.stat("/proc/self/ns/pid")
    except OSError as exc:
        return f"the runtime's PID namespace cannot be read: {exc.strerror or exc}"
    if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
        return f"the runtime on {cri} runs in another PID namespace than the agent (no hostPID)"
    return None


@dataclass(frozen=True, slots=True)
class Privileges:
    """What this agent lacks for each policy (empty: nothing), and the CRI socket it uses."""

    follow_lacks: tuple[str, ...]
    restart_lacks: tuple[str, ...]
    cri_socket: Path | None

    @classmethod
    def now(
        cls,
        pod_resources: Path,
        cri_sockets: Sequence[Path],
        *,
        capabilities: Callable[[], int] = effective_capabilities,
        hierarchies: Callable[[], Hierarchies] = Hierarchies.now,
    ) -> Privileges:
        """This process's privileges: the sockets, the runtime's PID namespace, the
        capabilities and the cgroup hierarchies."""
        restart: list[str] = []
        if not _is_socket(pod_resources):
            restart.append(f"no pod-resources socket at {quote(str(pod_resources))}")
        cri = next((s for s in cri_sockets if _is_socket(s)), None)
        if cri is None:
            named = " ".join(map(str, cri_sockets)) or "(none given)"
            restart.append(f"no CRI socket at {quote(named)}")
        follow = list(restart)
        if cri is not None and (why := _same_pid_namespace(cri)) is not None:
            follow.append(why)
        caps = capabilities()
        missing = [n for n, (bit, _) in FOLLOW_CAPABILITIES.items() if not caps & (1 << bit)]
        if missing:
            follow.append(f"no {', '.join(missing)} in the effective capabilities")
        where = hierarchies()
        roots = [r for r in (where.v1, where.v2) if r is not None]
        if not any(_writable(r) for r in roots):
            follow.append(
                "no writable cgroup hierarchy (devices v1 or v2) mounted"
                + (f" (read-only: {', '.join(roots)})" if roots else "")
            )
        return cls(tuple(follow), tuple(restart), cri)

    def lacks(self, policy: Policy) -> tuple[str, ...]:
        return {"follow": self.follow_lacks, "restart": self.restart_lacks, "keep": ()}[policy]


def effective_policy(resource: str, wanted: Policy, privileges: Privileges | None) -> Policy:
    """The policy class ``resource`` runs with: ``wanted``, or the next one down that this
    agent can apply (``privileges`` None: no kubelet, host mode), said in one line."""
    if wanted == "keep":
        return "keep"
    if privileges is None:
        log.warning(
            "class %s: whenBack %s runs as keep: no kubelet (host mode) names the holders",
            resource, wanted,
        )  # fmt: skip
        return "keep"
    policy: Policy = wanted
    reasons: list[str] = []
    while policy != "keep" and (lacks := privileges.lacks(policy)):
        reasons.extend(w for w in lacks if w not in reasons)
        policy = "restart" if policy == "follow" else "keep"
    if policy != wanted:
        log.warning(
            "class %s: whenBack %s runs as %s: %s", resource, wanted, policy, "; ".join(reasons)
        )
    else:
        log.info("class %s: whenBack %s applied", resource, wanted)
    return policy
