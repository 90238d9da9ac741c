"""File modes that do not depend on the umask cdi-gen was started with.

A container runtime's umask is whatever its launcher set: with 077 a created spec folder
became 0700 (other readers of CDI specs, rootless podman among them, lost it), with 000 the
device plugin sockets became 0777 (any local user could call Allocate). So folders cdi-gen
creates get :data:`DIR_MODE` and its sockets :data:`SOCKET_MODE` explicitly; folders that
already exist keep the mode their owner gave them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

#: Folders we create: the spec folder (read by runtimes and CDI tools) and the plugin folder.
DIR_MODE = 0o755
#: Device plugin sockets: only the kubelet (root, like us) calls them.
SOCKET_MODE = 0o600


def make_folder(path: Path, mode: int = DIR_MODE) -> None:
    """Create ``path`` and its missing parents with ``mode``; leave existing ones alone.

    Raises OSError like :meth:`Path.mkdir` (a file in the way, no permission).
    """
    missing: list[Path] = []
    current = Path(path)
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=mode)
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # created meanwhile by someone else: theirs, keep its mode
        # mkdir applied the umask; fchmod does not. Through a descriptor opened without
        # following links, so a link swapped in meanwhile is refused, not chmod-ed.
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """Run the block with ``mask`` as the process umask.

    For files created by code we cannot pass a mode to (gRPC binding a unix socket): the
    file never exists with a wider mode, as it would between creation and a chmod. The
    umask is process-wide, so keep the block short and free of awaits.
    """
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)
