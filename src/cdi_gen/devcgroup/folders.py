"""A cgroup folder opened beneath its hierarchy without following a link: the hierarchy's root
is checked to be a cgroup file system of the expected version, every component below it is
opened with ``O_NOFOLLOW`` from its parent's descriptor and must be a folder on the same file
system, and ``.``, ``..`` or an empty component is refused. The descriptor it gives is the only
way the rest of the package reaches the cgroup; :class:`CgroupFolder` holds it open for the
v1 and v2 device cgroups.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import TracebackType
from typing import Self

from cdi_gen.devcgroup.errors import DeviceCgroupError
from cdi_gen.errors import quote
from cdi_gen.libc import function

__all__ = [
    "CGROUP2_SUPER_MAGIC",
    "CGROUP_SUPER_MAGIC",
    "cgroup_folder",
    "file_system",
    "quote_path",
]

#: ``f_type`` of a v1 cgroup hierarchy and of the v2 one (<linux/magic.h>).
CGROUP_SUPER_MAGIC = 0x27E0EB
CGROUP2_SUPER_MAGIC = 0x63677270
#: A container's cgroup path is long (pod UID, container ID): quoted whole up to this.
PATH_QUOTE = 240
_VERSIONS = {CGROUP_SUPER_MAGIC: "cgroup v1", CGROUP2_SUPER_MAGIC: "cgroup v2"}
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: Larger than ``struct statfs`` on every machine; ``f_type`` is its first field (a long).
_STATFS_SIZE = 256

_fstatfs = function("fstatfs", (ctypes.c_int, ctypes.c_void_p))


def quote_path(path: str) -> str:
    """A cgroup path quoted for a message, whole unless it is longer than a path can be."""
    return quote(path, PATH_QUOTE)


def file_system(fd: int) -> int:
    """The magic number of the file system ``fd`` is on (``f_type`` of ``fstatfs``)."""
    buffer = ctypes.create_string_buffer(_STATFS_SIZE)
    if _fstatfs(fd, buffer) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(struct.unpack_from("@l", buffer)[0])


def _components(path: str, hierarchy: str) -> list[str]:
    if not path.startswith(hierarchy.rstrip("/") + "/"):
        raise DeviceCgroupError(f"cgroup {quote_path(path)} is not beneath {quote_path(hierarchy)}")
    parts = path[len(hierarchy.rstrip("/")) + 1 :].split("/")
    if any(part in ("", ".", "..") or "\0" in part for part in parts):
        raise DeviceCgroupError(
            f"cgroup {quote_path(path)}: a path with '.', '..' or an empty component is refused"
        )
    return parts


def _open_beneath(root: int, parts: list[str], path: str) -> int:
    device = os.fstat(root).st_dev
    fd = os.dup(root)
    try:
        for part in parts:
            try:
                child = os.open(part, _FOLDER | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as error:
                why = (
                    "is a link (never followed)"
                    if error.errno in (errno.ELOOP, errno.ENOTDIR)
                    and os.path.islink(f"/proc/self/fd/{fd}/{part}")
                    else os.strerror(error.errno or 0)
                )
                raise DeviceCgroupError(f"cgroup {quote_path(path)}: {part!r} {why}") from None
            os.close(fd)
            fd = child
            if os.fstat(fd).st_dev != device:
                raise DeviceCgroupError(
                    f"cgroup {quote_path(path)}: {part!r} is on another file system "
                    "than its hierarchy"
                )
        return fd
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def cgroup_folder(path: str, hierarchy: str, magic: int) -> Iterator[int]:
    """The descriptor of the cgroup folder ``path`` beneath ``hierarchy`` (whose file system
    must be ``magic``), closed on leaving. The hierarchy's root itself is refused: changing it
    would change every process on the node."""
    parts = _components(path, hierarchy)
    try:
        root = os.open(hierarchy, _FOLDER)
    except OSError as error:
        raise DeviceCgroupError(
            f"cgroup hierarchy {quote_path(hierarchy)}: {os.strerror(error.errno or 0)}"
        ) from None
    try:
        found = file_system(root)
        if found != magic:
            raise DeviceCgroupError(
                f"{quote_path(hierarchy)} is not a {_VERSIONS.get(magic, hex(magic))} hierarchy "
                f"(its file system is {_VERSIONS.get(found, hex(found))})"
            )
        fd = _open_beneath(root, parts, path)
    finally:
        os.close(root)
    try:
        yield fd
    finally:
        os.close(fd)


class CgroupFolder:
    """A cgroup folder held open (:func:`cgroup_folder`) from ``__init__`` to :meth:`close`:
    what the v1 and v2 device cgroups share."""

    def __init__(self, path: str, hierarchy: str, magic: int) -> None:
        self.path = path
        self._stack = ExitStack()
        self._fd = self._stack.enter_context(cgroup_folder(path, hierarchy, magic))

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
