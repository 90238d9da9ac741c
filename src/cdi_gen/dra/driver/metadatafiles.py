"""The DRA driver's device-metadata folder (KEP-5304): the files it writes there and no others.

The folder (``<plugin data dir>/dra-device-metadata``) is the driver's, but it gets the spec
folder's rules, because what its names are made of comes from the API server: the folder is
opened without following a link at its own name (a folder swapped for a link to another one
is refused, never written through), every file is reached relative to it under a name built
from validated parts only (the claim's tag from its checked UID, a request name that is a DNS
label: ``<tag>_<request>.json``), written through a temporary name and a rename, and replaced
or removed only when it is ours: a regular file whose first line is the ``DeviceMetadata`` of
the claim and request its name gives. Whatever else sits at such a name (a link, a folder, a
FIFO, a file this driver did not write) is refused in one line naming it, and is never
followed, replaced or removed.

Agents before this layout named the files ``<namespace>_<claim>_<request>.json``; a claim they
prepared still mounts its file from there, so those are kept while it is prepared and removed
with it (:meth:`MetadataFolder.remove` with its namespace and name).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from cdi_gen.cdi.atomicfile import atomic_replace, remove_stale_temps_in
from cdi_gen.dra.driver.claimspec import claim_tag
from cdi_gen.dra.driver.devicemetadata import base_request
from cdi_gen.errors import SpecWriteError, quote
from cdi_gen.files import FileRefused, read_regular
from cdi_gen.modes import make_folder
from cdi_gen.names import is_dns_label, is_dns_subdomain

__all__ = ["MetadataFolder"]

log = logging.getLogger(__name__)

_MODE = 0o644
_DIR_MODE = 0o755
#: A metadata file is a few hundred bytes per device; a larger one is not ours.
_MAX_BYTES = 1 << 20
#: Longest file name (bytes) Linux file systems take.
_NAME_MAX = 255
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Who a metadata file was written for: uid, namespace, claim, request.
_Owner = tuple[str, str, str, str]
#: An empty regular file at a name of ours (see :meth:`MetadataFolder._owner_of`).
_EMPTY: _Owner = ("", "", "", "")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


class MetadataFolder:
    """The device metadata files of the claims a driver prepared, in ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    # -- names --------------------------------------------------------------------------

    @staticmethod
    def filename(uid: str, request: str) -> str:
        """The file of ``request`` (its base, for a subrequest) of the claim ``uid``; both
        were checked before (a UID of ``A-Z a-z 0-9 - _ .``, a request a DNS label)."""
        return f"{claim_tag(uid)}_{base_request(request)}.json"

    @staticmethod
    def _legacy_filename(namespace: str, name: str, request: str) -> str | None:
        """The name older agents gave, when its parts are Kubernetes names (a record read
        back from disk is checked here, not trusted)."""
        if not (is_dns_label(namespace) and is_dns_subdomain(name)):
            return None
        request = base_request(request)
        legacy = f"{namespace}_{name}_{request}.json"
        # Longer than a file name may be: no older agent could have written it.
        return legacy if is_dns_label(request) and len(legacy) <= _NAME_MAX else None

    # -- the folder ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _folder(self, create: bool = False) -> Iterator[int]:
        try:
            fd = os.open(self.path, _FOLDER_FLAGS)
        except FileNotFoundError:
            if not create:
                raise
            make_folder(self.path, _DIR_MODE)
            fd = os.open(self.path, _FOLDER_FLAGS)
        except OSError as exc:
            why = "it is a symbolic link" if self._is_link() else (exc.strerror or str(exc))
            raise SpecWriteError(
                f"device metadata folder {str(self.path)!r}: {why}; refusing to write or "
                "remove anything through it"
            ) from None
        try:
            yield fd
        finally:
            os.close(fd)

    def _is_link(self) -> bool:
        try:
            return stat.S_ISLNK(os.lstat(self.path).st_mode)
        except OSError:
            return False

    @staticmethod
    def _owner_of(dir_fd: int, name: str) -> _Owner | None:
        """``(uid, namespace, claim, request)`` the file ``name`` was written for, when it is
        a regular file holding this module's format; :data:`_EMPTY` for an empty regular
        file (what a power loss may leave of a write that was not fsynced: nothing to lose);
        None when nothing is there. Raises :class:`FileRefused` saying what is there when it
        is none of these."""
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(_kind(st.st_mode))
        try:
            data = read_regular(name, _MAX_BYTES, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not data:
            return _EMPTY
        found: tuple[Any, ...] = ()
        with contextlib.suppress(orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            first = orjson.loads(data.partition(b"\n")[0])
            meta = first["metadata"]
            (request,) = first["requests"]
            if first["kind"] == "DeviceMetadata":
                found = (meta["uid"], meta["namespace"], meta["name"], request["name"])
        if not found or not all(isinstance(v, str) and v for v in found):
            raise FileRefused("a file cdi-gen did not write (not its device metadata)")
        uid, namespace, claim, request_name = found
        return (uid, namespace, claim, request_name)

    def _state(self, dir_fd: int, name: str, want: _Owner) -> str:
        """``"absent"``, ``"ours"`` (the metadata of the claim and request of ``want``) or
        ``"empty"``; raises :class:`SpecWriteError` naming the file when something else is
        there."""
        uid, namespace, claim, request = want
        try:
            owner = self._owner_of(dir_fd, name)
        except FileRefused as exc:
            where = str(self.path / name)
            raise SpecWriteError(f"{where!r}: {exc}; refusing to touch it") from None
        if owner is None:
            return "absent"
        if owner is _EMPTY:
            return "empty"
        if owner[0] != uid or owner[1:3] != (namespace, claim) or base_request(owner[3]) != request:
            raise SpecWriteError(
                f"{str(self.path / name)!r}: holds the metadata of another claim "
                f"(uid {quote(owner[0])}); refusing to touch it"
            )
        return "ours"

    # -- what the preparer does ---------------------------------------------------------

    def write(self, uid: str, namespace: str, claim: str, request: str, data: bytes) -> Path:
        """Make the file of ``request`` of the claim hold ``data`` (the claim's
        :func:`~cdi_gen.dra.driver.devicemetadata.metadata_stream`); its host path. Raises
        :class:`SpecWriteError` naming the file when something not ours is at its name, or
        the folder is a link or cannot be written."""
        name = self.filename(uid, request)
        try:
            with self._folder(create=True) as dir_fd:
                self._state(dir_fd, name, (uid, namespace, claim, base_request(request)))
                # Not fsynced: nothing reads it after a power loss before it is written
                # anew (the claim's spec, on /var/run's tmpfs, is gone then, so the claim is
                # prepared again). The rename replaces, never follows, a name.
                atomic_replace(dir_fd, name, data, _MODE, durable=False)
        except SpecWriteError:
            raise
        except OSError as exc:
            raise SpecWriteError(
                f"cannot write {str(self.path / name)!r}: {exc.strerror or exc}"
            ) from None
        return self.path / name

    def _names(
        self, uid: str, namespace: str, claim: str, requests: Iterable[str]
    ) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for request in dict.fromkeys(base_request(r) for r in requests):
            if not is_dns_label(request):
                continue  # a record read back from disk with a request no file was named by
            out.append((self.filename(uid, request), request))
            legacy = self._legacy_filename(namespace, claim, request)
            if legacy is not None:
                out.append((legacy, request))
        return out

    def remove(self, uid: str, namespace: str, claim: str, requests: Iterable[str]) -> None:
        """Remove the claim's files of ``requests`` (those absent are fine); a file at such a
        name that is not the claim's is left, and logged. Raises :class:`SpecWriteError`
        when the folder is a link or a file cannot be removed."""
        try:
            with self._folder() as dir_fd:
                for name, request in self._names(uid, namespace, claim, requests):
                    try:
                        if self._state(dir_fd, name, (uid, namespace, claim, request)) == "absent":
                            continue
                    except SpecWriteError as exc:
                        log.warning("device metadata left in place: %s", exc)
                        continue
                    try:
                        os.unlink(name, dir_fd=dir_fd)
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        raise SpecWriteError(
                            f"{str(self.path / name)!r}: cannot remove the claim's device "
                            f"metadata: {exc.strerror or exc}"
                        ) from None
        except FileNotFoundError:
            return

    def intact(self, uid: str, namespace: str, claim: str, requests: Iterable[str]) -> bool:
        """Whether the claim has a metadata file of ours for one of ``requests`` at least,
        and every one there is whole (written without fsync, a power loss may have left one
        empty or cut)."""
        found = False
        try:
            with self._folder() as dir_fd:
                for name, request in self._names(uid, namespace, claim, requests):
                    try:
                        state = self._state(dir_fd, name, (uid, namespace, claim, request))
                    except SpecWriteError:
                        return False
                    if state == "empty":
                        return False
                    found = found or state == "ours"
        except (OSError, SpecWriteError):
            return False
        return found

    def remove_orphans(self, keep: Collection[str]) -> None:
        """Remove every file of ours not named in ``keep`` (file names, as :meth:`files`
        gives them for the prepared claims), and the temporary files of a write killed
        half-way (as the spec writer sweeps its folder). A name of another shape, or a file at
        one of ours that is not ours, is left alone."""
        try:
            with self._folder() as dir_fd:
                remove_stale_temps_in(dir_fd)
                for entry in os.listdir(dir_fd):
                    if entry not in keep and entry.endswith(".json") and "_" in entry:
                        self._unlink_orphan(dir_fd, entry)
        except FileNotFoundError:
            return  # none yet
        except SpecWriteError as exc:
            log.warning("%s", exc)

    def files(self, uid: str, namespace: str, claim: str, requests: Iterable[str]) -> list[str]:
        """The names a prepared claim's files may have (kept by :meth:`remove_orphans`)."""
        return [name for name, _ in self._names(uid, namespace, claim, requests)]

    def _unlink_orphan(self, dir_fd: int, entry: str) -> None:
        try:
            owner = self._owner_of(dir_fd, entry)
            if owner is None or (owner is not _EMPTY and not self._names_match(entry, owner)):
                return
            os.unlink(entry, dir_fd=dir_fd)
            log.info("removed device metadata %s: no prepared claim names it", quote(entry))
        except FileRefused:
            log.info("device metadata %s left alone: not a file cdi-gen wrote", quote(entry))
        except OSError as exc:
            log.warning("device metadata %s of no prepared claim stays: %s", quote(entry), exc)

    def _names_match(self, entry: str, owner: tuple[str, str, str, str]) -> bool:
        """Whether ``entry`` is the name this module or an older agent gave the file of
        ``owner``: a file copied to another name is not one we wrote there."""
        uid, namespace, claim, request = owner
        request = base_request(request)
        if not is_dns_label(request):
            return False
        if entry == self.filename(uid, request):
            return True
        return entry == self._legacy_filename(namespace, claim, request)
