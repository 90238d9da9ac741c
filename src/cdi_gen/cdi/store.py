"""The class specs this agent last wrote, kept in memory for whoever builds on them.

The agent writes each class's spec through :meth:`SpecStore.sync` (the one writer's
:func:`~cdi_gen.cdi.writer.sync_spec`, then a note of the bytes and of the file the write
left). A DRA claim's own spec starts from its class's spec: :meth:`SpecStore.current` hands
it the document the agent wrote, parsed once per write, instead of the folder's file read
and parsed again. The folder is still looked at, with one ``lstat``: a document is handed
out only while the file at the class's name is the one the agent's write left there, so a
claim never gets edits from a spec someone else put in its place (nor from memory once the
runtime would see another file).

Allocate's and NodePrepareResources' name check does not ask this store: it must see the
folders as the runtime does, foreign specs included (:mod:`cdi_gen.cdi.registry`). It learns
from the store instead: given ``own_writes`` (the agent's
:class:`~cdi_gen.cdi.registry.SpecCache`), the store tells it each class spec written or
removed, with the bytes and the identity of the file the write left, and hands it on to
whoever else writes into the folder for the agent (a DRA claim's own specs), so that the
check after the agent's own write needs no scan of the folder.

The writes run in a worker thread and the reads on the kubelet's gRPC threads: an entry is
replaced whole (one dict assignment), and its document, parsed on first use, is never
changed by its readers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from cdi_gen.cdi.specnames import spec_filename
from cdi_gen.cdi.writer import OwnWrites, SyncOutcome, sync_spec
from cdi_gen.errors import SpecWriteError
from cdi_gen.files import FileId

__all__ = ["SpecStore", "WrittenSpec"]


def _file_id(path: Path) -> FileId | None:
    """The identity of the file at ``path`` (not followed), None when missing; other errors
    are raised, for a message that says why the file cannot be looked at."""
    try:
        return FileId.of(os.lstat(path))
    except FileNotFoundError:
        return None


class WrittenSpec:
    """One class's spec as the agent wrote it: its bytes, the file they are in, and the
    document, parsed on first use (a class of many devices costs more to parse than the
    rest of a claim's prepare)."""

    __slots__ = ("_document", "data", "file_id", "path")

    def __init__(self, path: Path, data: bytes, file_id: FileId | None) -> None:
        self.path = path
        self.data = data
        self.file_id = file_id
        self._document: dict[str, Any] | None = None

    def document(self) -> dict[str, Any]:
        """The spec as a JSON object; callers must not change it."""
        doc = self._document
        if doc is None:
            loaded = orjson.loads(self.data)
            if not isinstance(loaded, dict):  # the agent writes objects only
                raise SpecWriteError(f"{str(self.path)!r}: the class's spec is not a JSON object")
            doc = self._document = loaded
        return doc


class _Seen:
    """Notes of one write passed on to ``then``, the identity it left kept."""

    __slots__ = ("file_id", "then")

    def __init__(self, then: OwnWrites | None) -> None:
        self.then = then
        self.file_id: FileId | None = None

    def wrote(self, path: Path, data: bytes, file_id: FileId) -> None:
        self.file_id = file_id
        if self.then is not None:
            self.then.wrote(path, data, file_id)

    def removed(self, path: Path) -> None:
        if self.then is not None:
            self.then.removed(path)


class SpecStore:
    """The class specs written through :meth:`sync`, by folder, vendor and class;
    ``own_writes`` learns every change the agent makes to its spec files."""

    def __init__(self, own_writes: OwnWrites | None = None) -> None:
        self._written: dict[Path, WrittenSpec] = {}
        #: Who learns each spec file the agent writes or removes: passed to the writer by
        #: :meth:`sync`, and by whoever else writes specs for the agent.
        self.own_writes = own_writes

    def sync(
        self, spec_dir: Path, vendor: str, cls: str, data: bytes | None, *, instance: str | None
    ) -> SyncOutcome:
        """:func:`~cdi_gen.cdi.writer.sync_spec`, remembering what it left: ``data`` in
        its file, or nothing once removed. A failed write keeps the note of the last one,
        whose file is still there (or, replaced since, is then refused by :meth:`current`).
        """
        seen = _Seen(self.own_writes)
        outcome = sync_spec(spec_dir, vendor, cls, data, instance=instance, notes=seen)
        path = Path(spec_dir) / spec_filename(vendor, cls)
        if data is None:
            self._written.pop(path, None)
        else:
            # The identity of the file written, not of whatever is at the name by now; a
            # write left out (the file held these bytes already) leaves the file found there.
            found = seen.file_id if seen.file_id is not None else _file_id(path)
            self._written[path] = WrittenSpec(path, data, found)
        return outcome

    def current(self, spec_dir: Path, vendor: str, cls: str) -> WrittenSpec:
        """The spec of ``vendor/cls`` the agent last wrote to ``spec_dir``, while its file
        is still the one that write left. Raises :class:`~cdi_gen.errors.SpecWriteError`
        naming the file when it is missing, was never written by this agent, or was
        replaced or changed since."""
        path = Path(spec_dir) / spec_filename(vendor, cls)
        try:
            on_disk = _file_id(path)
        except OSError as exc:
            raise SpecWriteError(f"{str(path)!r}: the class's spec cannot be read: {exc}") from None
        if on_disk is None:
            raise SpecWriteError(f"{str(path)!r}: the class's spec is missing")
        written = self._written.get(path)
        if written is None:
            raise SpecWriteError(f"{str(path)!r}: the class's spec was not written by this agent")
        if written.file_id != on_disk:
            raise SpecWriteError(
                f"{str(path)!r}: the class's spec is not the file this agent wrote "
                "(replaced or changed since)"
            )
        return written
