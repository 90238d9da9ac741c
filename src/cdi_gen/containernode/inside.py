"""The child's side of a node replacement, run by :data:`~cdi_gen.containernode.replace.CHILD`
(an isolated interpreter with no ``site``) with the request on its command line (PID, start
time, then the node: path, type, major, minor, mode, uid, gid); it prints one answer line,
``STATUS REASON``, and exits 0.

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
after: from then on an import would read the container's files, which it must not. It
imports only the standard library's lightest modules, since it starts on every replacement.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

from cdi_gen.containernode.linux import CLONE_NEWNS, beneath, pidfd_alive, process_start, setns

__all__ = ["Request", "main", "replace_inside"]

_FOLDER = os.O_PATH | os.O_DIRECTORY
_GONE = "the process has exited"
_LINK = "a component is a link or leaves /dev (links are never followed)"
_DEV = "/dev/"


class _AnswerError(Exception):
    """One answer, from wherever it is found."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Request:
    """What the caller checked (:class:`~cdi_gen.containernode.node.DeviceNode`), read from
    the command line and checked again here for what this side relies on."""

    __slots__ = ("device", "folder", "gid", "kind", "mode", "name", "pid", "start", "uid")

    def __init__(self, arguments: list[str]) -> None:
        pid, start, path, kind, major, minor, mode, uid, gid = arguments
        parts = path.removeprefix(_DEV).split("/")
        if not path.startswith(_DEV) or any(part in ("", ".", "..") for part in parts):
            raise ValueError("path")
        self.folder, self.name = "/".join(parts[:-1]), parts[-1]
        self.kind = {"c": stat.S_IFCHR, "b": stat.S_IFBLK}[kind]
        self.device = os.makedev(int(major), int(minor))
        self.pid, self.start = int(pid), int(start)
        self.mode, self.uid, self.gid = int(mode) & 0o777, int(uid), int(gid)


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
            reason = f"PID reused: its process started at tick {now}, not at {start}"
            raise _AnswerError("refused", reason)
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
            if not pidfd_alive(pidfd):
                raise OSError(errno.ESRCH, "exited")
            setns(pidfd, CLONE_NEWNS)
        except OSError as error:
            os.close(root)
            os.close(own_fds)
            if error.errno == errno.ESRCH:
                raise _AnswerError("skipped", _GONE) from None
            reason = f"cannot enter its mount namespace: {error.strerror}"
            raise _AnswerError("refused", reason) from None
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


def _place(root: int, own_fds: int, request: Request) -> None:
    """Make the node at a temporary name beside the target and rename it over the target."""
    dev = _open(root, "dev", _FOLDER, "/dev")
    try:
        folder = request.folder
        parent = _open(dev, folder, _FOLDER, f"/dev/{folder}") if folder else os.dup(dev)
    finally:
        os.close(dev)
    try:
        name = request.name
        try:
            there = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            there = None
        if there is not None and not (stat.S_ISCHR(there.st_mode) or stat.S_ISBLK(there.st_mode)):
            reason = f"the path is {_kind(there.st_mode)}, not a device node: left as it is"
            raise _AnswerError("refused", reason)
        temporary = f".cdi-gen-{os.urandom(8).hex()}"
        # No permission bits until its owner is set: nobody opens it half-made.
        os.mknod(temporary, request.kind, request.device, dir_fd=parent)
        try:
            _own(parent, temporary, own_fds, request)
            os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            # Not contextlib.suppress: the child imports no more than it must.
            try:  # noqa: SIM105
                os.unlink(temporary, dir_fd=parent)
            except OSError:
                pass  # the container took the name away: nothing of ours is left there
            raise
    finally:
        os.close(parent)


def _own(parent: int, temporary: str, own_fds: int, request: Request) -> None:
    """Owner, group and mode set on the node just made, through its own descriptor: the
    container may rename something else to the temporary name meanwhile, and that is then
    refused, never changed."""
    fd = _open(parent, temporary, os.O_PATH, "the new node")
    try:
        made = os.fstat(fd)
        if stat.S_IFMT(made.st_mode) != request.kind or made.st_rdev != request.device:
            raise _AnswerError("refused", "the new node was replaced while it was made")
        # chown and chmod take no O_PATH descriptor; its /proc/self/fd entry names its inode.
        os.chown(str(fd), request.uid, request.gid, dir_fd=own_fds)
        os.chmod(str(fd), request.mode, dir_fd=own_fds)
    finally:
        os.close(fd)


def replace_inside(request: Request) -> tuple[str, str]:
    """Replace (or create) the node in the container of the request's process; the answer's
    status and reason. Changes this process's mount namespace: run it only in a child of its
    own."""
    try:
        root, own_fds = _enter(request.pid, request.start)
        try:
            _place(root, own_fds, request)
        finally:
            os.close(root)
            os.close(own_fds)
    except _AnswerError as answer:
        return answer.status, answer.reason
    except OSError as error:
        return "refused", f"{error.strerror} (errno {error.errno})"
    return "done", ""


def main(arguments: list[str]) -> int:
    try:
        request = Request(arguments)
    except (ValueError, KeyError):
        status, reason = "refused", "the request is malformed"
    else:
        status, reason = replace_inside(request)
    sys.stdout.write(f"{status} {reason}\n")
    sys.stdout.flush()
    return 0
