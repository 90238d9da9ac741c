"""The admission webhook's serving certificate, taken up again whenever its files change.

A webhook certificate is renewed where it lives: cert-manager or an operator writes a new pair
into the Secret, and the kubelet swaps the mounted files (a new folder and a ``..data`` link
renamed over the old one). A server that read the pair once at start serves the old
certificate until it expires, and from then on the API server cannot call it — with the
shipped ``failurePolicy: Ignore``, every claim goes in unchecked until someone restarts the
pods. So :class:`ServingCertificate` watches
the folders of both files with inotify and, when either file's bytes changed, builds a fresh
context from them. Only a pair that loads together replaces the one served: a certificate
written before its key (a hand-made or half-done renewal) is logged once and the last good
pair stays until the key arrives. Connections open at a change keep the pair they began with;
each new one gets the newest, through the served context's SNI callback (called for every
handshake, with or without a server name).

The files are read as every file someone else may have put where we look
(:func:`~cdi_gen.files.read_required`: a regular file only, opened without blocking, at most
:data:`TLS_MAX_BYTES`), and OpenSSL is handed those bytes (an anonymous memory file), never the
name: a FIFO or a link to a device swapped in as the renewed pair is refused with one line
instead of wedging the event loop, and what is served is what was checked. A key that is
encrypted is refused too: OpenSSL would otherwise ask for its passphrase on the terminal and
wait for one.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Final

from cdi_gen.files import FileRefused, read_required
from cdi_gen.inotify import (
    IN_ATTRIB,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_MOVED_TO,
    IN_ONLYDIR,
    inotify,
)

__all__ = ["TLS_MAX_BYTES", "CertificateError", "ServingCertificate", "tls_context"]

log = logging.getLogger(__name__)

# A kubelet swap creates a folder and renames a link; an editor or cert-manager's own writers
# rewrite or rename the files; a mode change (IN_ATTRIB) may be what makes a key readable.
_MASK = IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE | IN_ATTRIB | IN_ONLYDIR


#: Largest certificate chain or key read: a chain of a few certificates is a few KiB.
TLS_MAX_BYTES: Final = 1 << 20


class CertificateError(ValueError):
    """A pair that cannot be served; ``str()`` is one line naming the file and the rule."""


class _EncryptedKeyError(Exception):
    pass


def _no_passphrase() -> bytes:
    # Called by OpenSSL instead of its own prompt, which would write to the terminal and
    # wait there for a passphrase; raising makes load_cert_chain raise it.
    raise _EncryptedKeyError


def _read(path: Path, what: str) -> bytes:
    try:
        return read_required(path, TLS_MAX_BYTES)
    except FileRefused as exc:
        raise CertificateError(f"{what} {path}: {exc}") from None


@contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A name OpenSSL can open for ``data``: an anonymous memory file, gone when closed."""
    fd = os.memfd_create("cdi-gen-tls", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _context(cert: bytes, key: bytes, cert_file: Path, key_file: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        with ExitStack() as files:
            cert_name, key_name = (files.enter_context(_memory_file(b)) for b in (cert, key))
            context.load_cert_chain(cert_name, key_name, password=_no_passphrase)
    except _EncryptedKeyError:
        raise CertificateError(
            f"key {key_file}: the key is encrypted; cdi-gen admission takes an "
            "unencrypted PEM key (the Secret holds it) and never asks for a passphrase"
        ) from None
    except ssl.SSLError as exc:
        raise CertificateError(
            f"certificate {cert_file} with key {key_file}: not a PEM certificate chain "
            f"and its matching key ({exc.reason or exc})"
        ) from None
    except OSError as exc:  # no memory file (EMFILE, no /proc): nothing about the files
        raise CertificateError(
            f"certificate {cert_file} with key {key_file}: cannot be loaded: {exc.strerror or exc}"
        ) from None
    return context


def tls_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server context for ``cert_file`` (the chain, PEM) and ``key_file``: TLS >= 1.2, as
    the API server's client speaks it. Raises :class:`CertificateError` for files it cannot
    use."""
    return _context(_read(cert_file, "certificate"), _read(key_file, "key"), cert_file, key_file)


class ServingCertificate:
    """The pair in ``cert_file`` and ``key_file``; :attr:`context` serves the newest pair
    that loaded. Raises :class:`CertificateError` when the files cannot be used at start."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        cert, key, digest = self._files()
        self._current = _context(cert, key, cert_file, key_file)
        self._served, self._refused = digest, ""
        #: The context to serve with: the first pair's, handing each handshake the newest.
        self.context = self._current
        self.context.sni_callback = self._pick
        #: Pairs taken up since start, and changed pairs left unused (what a test waits for).
        self.reloads = 0
        self.refusals = 0

    def _pick(self, conn: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: object) -> None:
        if conn.context is not self._current:
            conn.context = self._current

    def _files(self) -> tuple[bytes, bytes, str]:
        """Both files' bytes, and their hash: what decides whether there is anything to take
        up. Raises CertificateError for a file that is missing or refused."""
        cert, key = _read(self.cert_file, "certificate"), _read(self.key_file, "key")
        return cert, key, hashlib.sha256(cert + b"\0" + key).hexdigest()

    def reload(self) -> bool:
        """Take up the files' pair if it changed and loads; True when it was taken up. A pair
        that cannot be read or does not load is logged (once per content, or per reason it
        could not be read) and not served."""
        digest = ""
        try:
            cert, key, digest = self._files()
            if digest in (self._served, self._refused):
                return False
            fresh = _context(cert, key, self.cert_file, self.key_file)
        except CertificateError as exc:
            digest = digest or str(exc)
            if digest != self._refused:
                log.warning(
                    "admission: the new serving certificate %s with key %s is not used, the "
                    "last good one stays: %s",
                    self.cert_file, self.key_file, exc,
                )  # fmt: skip
                self.refusals += 1
            self._refused = digest
            return False
        self._current, self._served, self._refused = fresh, digest, ""
        self.reloads += 1
        log.info("admission: serving the renewed certificate %s", self.cert_file)
        return True

    async def watch(self) -> None:
        """Take up each change of the files until cancelled. Without inotify (or a folder it
        cannot watch) it logs why and serves the start's pair."""
        loop = asyncio.get_running_loop()
        try:
            calls = inotify()
            fd = calls.init()
        except (OSError, AttributeError) as exc:
            log.warning("admission: a renewed certificate needs a restart: no inotify (%s)", exc)
            return
        woken = asyncio.Event()
        try:
            for folder in {self.cert_file.parent, self.key_file.parent}:
                calls.add(fd, str(folder), _MASK)
            loop.add_reader(fd, woken.set)
            try:
                while True:
                    await woken.wait()
                    woken.clear()
                    try:
                        while os.read(fd, 65536):
                            pass  # which entry changed does not matter: both files are read
                    except BlockingIOError:
                        pass
                    self.reload()
            finally:
                loop.remove_reader(fd)
        except OSError as exc:
            log.warning("admission: a renewed certificate needs a restart: %s", exc)
        finally:
            os.close(fd)
