"""The child's side of a node replacement, run as ``python -I -m cdi_gen.containernode.inside``
with the request (a JSON object) on standard input; it prints one JSON answer line
(``status``, ``reason``) and exits 0.

In order: a pidfd of the PID, the process's start time checked against the one captured (a
reused PID is refused); its root opened through the host's ``/proc`` and its mount namespace
compared with our own (a process of the host's namespace is no container); the pidfd still
alive (so the root and the start time were that process's); ``setns`` into its mount
namespace by the pidfd. From there every look-up goes through descriptors: the container's
``dev`` below its root, then each component below ``dev``, with no link followed and nothing
above reached (:func:`~cdi_gen.containernode.linux.beneath`). The target must be a device
node or absent; the new node is made at a temporary name beside it with no permission bits,
given its owner and mode through its own descriptor, and renamed over the target.

Every module this side needs is imported before ``setns``, and the import path is emptied
after: from then on an import would read the container's files, which it must not.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import signal
import stat
import sys

from cdi_gen.containernode.linux import CLONE_NEWNS, beneath, setns
from cdi_gen.containernode.node import DeviceNode, Status, process_start

__all__ = ["main", "replace_inside"]

#: The request is a few hundred bytes; anything longer is not ours.
REQUEST_LIMIT = 16384
_FOLDER = os.O_PATH | os.O_DIRECTORY
_GONE = "the process has exited"
_LINK = "a component is a link or leaves /dev (links are never followed)"


class _AnswerError(Exception):
    """One answer, from wherever it is found."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a device node"


def _enter(pid: int, start: int) -> tuple[int, int]:
    """The process's root (a descriptor) and a descriptor of our own ``/proc/self/fd``, once
    in its mount namespace. Skips a process that is gone; refuses a reused PID and a process
    in our own mount namespace."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise _AnswerError("skipped", _GONE) from None
    try:
        now = process_start(pid)
        if now is None:
            raise _AnswerError("skipped", _GONE)
        if now != start:
            raise _AnswerError(
                "refused", f"PID reused: its process started at tick {now}, not at {start}"
            )
        try:
            root = os.open(f"/proc/{pid}/root", _FOLDER | os.O_CLOEXEC)
            theirs = os.stat(f"/proc/{pid}/ns/mnt")
        except (FileNotFoundError, ProcessLookupError):
            raise _AnswerError("skipped", _GONE) from None
        ours = os.stat("/proc/self/ns/mnt")
        if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
            os.close(root)
            raise _AnswerError("refused", "the process is in the agent's own mount namespace")
        # Our own descriptors, named from the host's /proc: the container's /proc is another.
        own_fds = os.open("/proc/self/fd", _FOLDER | os.O_CLOEXEC)
        try:
            # Alive now, so alive when its start time and root were read: they were its.
            signal.pidfd_send_signal(pidfd, 0)
            setns(pidfd, CLONE_NEWNS)
        except ProcessLookupError:
            raise _AnswerError("skipped", _GONE) from None
        except OSError as error:
            if error.errno == errno.ESRCH:
                raise _AnswerError("skipped", _GONE) from None
            raise _AnswerError(
                "refused", f"cannot enter its mount namespace: {error.strerror}"
            ) from None
        sys.path.clear()
        sys.path_importer_cache.clear()
        return root, own_fds
    finally:
        os.close(pidfd)


def _open(dirfd: int, path: str, flags: int, what: str) -> int:
    try:
        return beneath(dirfd, path, flags)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV):
            raise _AnswerError("refused", _LINK) from None
        if error.errno == errno.ENOENT:
            raise _AnswerError("refused", f"{what} does not exist in the container") from None
        raise _AnswerError("refused", f"cannot open {what}: {error.strerror}") from None


def _place(root: int, own_fds: int, node: DeviceNode) -> None:
    """Make the node at a temporary name beside the target and rename it over the target."""
    dev = _open(root, "dev", _FOLDER, "/dev")
    try:
        folder, _, name = node.relative.rpartition("/")
        parent = _open(dev, folder, _FOLDER, f"/dev/{folder}") if folder else os.dup(dev)
    finally:
        os.close(dev)
    try:
        try:
            there = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            there = None
        if there is not None and not (stat.S_ISCHR(there.st_mode) or stat.S_ISBLK(there.st_mode)):
            raise _AnswerError(
                "refused", f"the path is {_kind(there.st_mode)}, not a device node: left as it is"
            )
        kind = stat.S_IFCHR if node.type == "c" else stat.S_IFBLK
        device = os.makedev(node.major, node.minor)
        temporary = f".cdi-gen-{secrets.token_hex(8)}"
        # No permission bits until its owner is set: nobody opens it half-made.
        os.mknod(temporary, kind, device, dir_fd=parent)
        try:
            _own(parent, temporary, own_fds=own_fds, node=node, kind=kind, device=device)
            os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=parent)
            raise
    finally:
        os.close(parent)


def _own(
    parent: int, temporary: str, *, own_fds: int, node: DeviceNode, kind: int, device: int
) -> None:
    """Owner, group and mode set on the node just made, through its own descriptor: the
    container may rename something else to the temporary name meanwhile, and that is then
    refused, never changed."""
    fd = _open(parent, temporary, os.O_PATH, "the new node")
    try:
        made = os.fstat(fd)
        if stat.S_IFMT(made.st_mode) != kind or made.st_rdev != device:
            raise _AnswerError("refused", "the new node was replaced while it was made")
        # chown and chmod take no O_PATH descriptor; its /proc/self/fd entry names its inode.
        os.chown(str(fd), node.uid, node.gid, dir_fd=own_fds)
        os.chmod(str(fd), node.mode, dir_fd=own_fds)
    finally:
        os.close(fd)


def replace_inside(pid: int, start: int, node: DeviceNode) -> tuple[Status, str]:
    """Replace (or create) ``node`` in the container of process ``pid`` started at tick
    ``start``; the answer's status and reason. Changes this process's mount namespace: run
    it only in a child of its own."""
    problem = node.problem()
    if problem is not None:
        return "refused", problem
    try:
        root, own_fds = _enter(pid, start)
        try:
            _place(root, own_fds, node)
        finally:
            os.close(root)
            os.close(own_fds)
    except _AnswerError as stop:
        return stop.status, stop.reason
    except OSError as error:
        return "refused", f"{error.strerror} (errno {error.errno})"
    return "done", ""


def main() -> int:
    try:
        request = json.loads(sys.stdin.read(REQUEST_LIMIT))
        node = DeviceNode(**request["node"])
        status, reason = replace_inside(int(request["pid"]), int(request["start"]), node)
    except (ValueError, KeyError, TypeError) as error:
        status, reason = "refused", f"the request is malformed: {type(error).__name__}"
    print(json.dumps({"status": status, "reason": reason}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
