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
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
from pathlib import Path

from cdi_gen.inotify import (
    IN_ATTRIB,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_MOVED_TO,
    IN_ONLYDIR,
    inotify,
)

__all__ = ["ServingCertificate", "tls_context"]

log = logging.getLogger(__name__)

# A kubelet swap creates a folder and renames a link; an editor or cert-manager's own writers
# rewrite or rename the files; a mode change (IN_ATTRIB) may be what makes a key readable.
_MASK = IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE | IN_ATTRIB | IN_ONLYDIR


def tls_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server context for ``cert_file`` (the chain, PEM) and ``key_file``: TLS >= 1.2, as
    the API server's client speaks it. Raises OSError or ssl.SSLError for files it cannot
    use."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


class ServingCertificate:
    """The pair in ``cert_file`` and ``key_file``; :attr:`context` serves the newest pair
    that loaded. Raises OSError or ssl.SSLError when the files cannot be used at start."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        digest = self._digest()
        self._current = tls_context(cert_file, key_file)
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

    def _digest(self) -> str:
        """Both files' bytes, hashed: what decides whether there is anything to take up."""
        sha = hashlib.sha256()
        for path in (self.cert_file, self.key_file):
            sha.update(path.read_bytes())
            sha.update(b"\0")
        return sha.hexdigest()

    def reload(self) -> bool:
        """Take up the files' pair if it changed and loads; True when it was taken up. A pair
        that cannot be read or does not load is logged (once per content) and not served."""
        try:
            digest = self._digest()
            if digest in (self._served, self._refused):
                return False
            fresh = tls_context(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            digest = "unreadable" if not isinstance(exc, ssl.SSLError) else digest
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
