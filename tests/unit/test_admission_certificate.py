"""The webhook's serving certificate is taken up again when its files change: a kubelet Secret
swap, files renamed into place, and a certificate written before its key — over real TLS on a
real socket, with and without a server name, and in the real ``cdi-gen admission`` process."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pty
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import termios
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from cdi_gen.admission.certificate import (
    TLS_MAX_BYTES,
    CertificateError,
    ServingCertificate,
    tls_context,
)
from cdi_gen.admission.https import serve_admission
from tests.pki import Authority, Pair, encrypted_key
from tests.ports import free_port
from tests.waiting import until, until_sync

DRIVER = "cdi-gen.example.com"


def _issue(ca: Authority, stem: str) -> Pair:
    return ca.issue(stem, "cdi-gen-admission", dns=("localhost",), ips=("127.0.0.1",), server=True)


def _der(pair: Pair) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pair.cert.read_text())


def _served(port: int, ca: Path, name: str | None) -> bytes:
    """The certificate a new connection to ``port`` is handed (``name``: the server name
    sent, or None for none, as a client that dials an IP address sends)."""
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = name is not None
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=name) as tls,
    ):
        peer = tls.getpeercert(binary_form=True)
    assert peer is not None
    return peer


def _place(pair: Pair, cert: Path, key: Path) -> None:
    """Rename copies of ``pair`` over ``cert`` and ``key``, key first, as a writer that
    renews in place does."""
    for source, target in ((pair.key, key), (pair.cert, cert)):
        staged = target.with_name(f".{target.name}.new")
        shutil.copyfile(source, staged)
        os.replace(staged, target)


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path / "pki")


@pytest.fixture
async def serving(tmp_path: Path, ca: Authority) -> AsyncIterator[tuple[ServingCertificate, int]]:
    """A server on the first pair in ``tmp_path/tls``, its certificate watched."""
    folder = tmp_path / "tls"
    folder.mkdir()
    _place(_issue(ca, "first"), folder / "tls.crt", folder / "tls.key")
    certificate = ServingCertificate(folder / "tls.crt", folder / "tls.key")
    server = await serve_admission("127.0.0.1", 0, certificate.context, DRIVER)
    watching = asyncio.create_task(certificate.watch())
    await asyncio.sleep(0)  # the watch is in place before the test changes anything
    try:
        async with server:
            yield certificate, server.sockets[0].getsockname()[1]
    finally:
        watching.cancel()


async def _connections(port: int, ca: Authority) -> tuple[bytes, bytes]:
    named = await asyncio.to_thread(_served, port, ca.cert, "localhost")
    unnamed = await asyncio.to_thread(_served, port, ca.cert, None)
    return named, unnamed


async def test_a_renewal_by_rename_is_served_to_every_new_connection(
    tmp_path: Path, ca: Authority, serving: tuple[ServingCertificate, int]
) -> None:
    certificate, port = serving
    first = _der(Pair(tmp_path / "tls" / "tls.crt", tmp_path / "tls" / "tls.key"))
    assert await _connections(port, ca) == (first, first)
    second = _issue(ca, "second")
    _place(second, certificate.cert_file, certificate.key_file)
    await until(lambda: certificate.reloads == 1, "the renewed pair taken up")
    assert await _connections(port, ca) == (_der(second), _der(second))
    assert certificate.refusals == 0


async def test_a_kubelet_secret_swap_is_taken_up(tmp_path: Path, ca: Authority) -> None:
    """The kubelet's atomic writer: files in a timestamped folder, ``..data`` linked to it,
    the names linked through ``..data``; a renewal is a new folder and ``..data`` renamed."""
    mount = tmp_path / "secret"
    mount.mkdir()

    def version(stem: str) -> Pair:
        pair, folder = _issue(ca, stem), mount / f"..{stem}"
        folder.mkdir()
        shutil.copyfile(pair.cert, folder / "tls.crt")
        shutil.copyfile(pair.key, folder / "tls.key")
        (mount / "..data_tmp").symlink_to(folder.name)
        os.replace(mount / "..data_tmp", mount / "..data")
        return pair

    first = version("2026_12_01")
    for name in ("tls.crt", "tls.key"):
        (mount / name).symlink_to(f"..data/{name}")
    certificate = ServingCertificate(mount / "tls.crt", mount / "tls.key")
    server = await serve_admission("127.0.0.1", 0, certificate.context, DRIVER)
    watching = asyncio.create_task(certificate.watch())
    await asyncio.sleep(0)
    try:
        async with server:
            port = server.sockets[0].getsockname()[1]
            assert await _connections(port, ca) == (_der(first), _der(first))
            second = version("2026_12_02")
            shutil.rmtree(mount / "..2026_12_01")
            await until(lambda: certificate.reloads == 1, "the swapped pair taken up")
            assert await _connections(port, ca) == (_der(second), _der(second))
    finally:
        watching.cancel()


async def test_a_certificate_without_its_key_is_not_served_until_the_key_comes(
    tmp_path: Path,
    ca: Authority,
    serving: tuple[ServingCertificate, int],
    caplog: pytest.LogCaptureFixture,
) -> None:
    certificate, port = serving
    first = _der(Pair(certificate.cert_file, certificate.key_file))
    second = _issue(ca, "second")
    staged = tmp_path / "tls" / ".tls.crt.new"
    shutil.copyfile(second.cert, staged)
    os.replace(staged, certificate.cert_file)
    await until(lambda: certificate.refusals == 1, "the lone certificate refused")
    assert await _connections(port, ca) == (first, first)
    refusal = [r.getMessage() for r in caplog.records if "is not used" in r.getMessage()]
    assert len(refusal) == 1, refusal
    assert str(certificate.cert_file) in refusal[0]
    assert "the last good one stays" in refusal[0]

    staged = tmp_path / "tls" / ".tls.key.new"
    shutil.copyfile(second.key, staged)
    os.replace(staged, certificate.key_file)
    await until(lambda: certificate.reloads == 1, "the pair taken up once the key came")
    assert await _connections(port, ca) == (_der(second), _der(second))
    assert certificate.refusals == 1


def test_an_unchanged_pair_is_not_loaded_again(tmp_path: Path, ca: Authority) -> None:
    pair = _issue(ca, "only")
    certificate = ServingCertificate(pair.cert, pair.key)
    os.utime(pair.cert)  # touched, same bytes
    assert certificate.reload() is False
    assert (certificate.reloads, certificate.refusals) == (0, 0)


def test_the_command_serves_a_renewed_certificate(tmp_path: Path, ca: Authority) -> None:
    """``cdi-gen admission`` as the Deployment runs it: renewed files, no restart."""
    folder = tmp_path / "tls"
    folder.mkdir()
    cert, key = folder / "tls.crt", folder / "tls.key"
    first = _issue(ca, "first")
    _place(first, cert, key)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdi_gen", "admission", "--driver", DRIVER,
         "--address", f"127.0.0.1:{port}", "--tls-cert-file", str(cert),
         "--tls-key-file", str(key)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def served() -> bytes | None:
            assert proc.poll() is None, "cdi-gen admission exited"
            try:
                return _served(port, ca.cert, "localhost")
            except OSError:
                return None

        assert until_sync(served, "cdi-gen admission serving", 30) == _der(first)
        second = _issue(ca, "second")
        _place(second, cert, key)
        until_sync(lambda: served() == _der(second), "the renewed certificate served", 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"admission: serving the renewed certificate {cert}" in err, err


# Renewed files someone else may have put there: read by the spec folder's rules.


def _swap_in(target: Path, make: Callable[[Path], object]) -> None:
    """Put what ``make`` creates at ``target`` in one rename, as a renewal does."""
    staged = target.with_name(f".{target.name}.new")
    make(staged)
    if staged.is_dir() and not staged.is_symlink():
        target.unlink()  # a folder cannot be renamed over a file
    os.replace(staged, target)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _device_link(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _huge(path: Path) -> None:
    with path.open("wb") as out:
        out.truncate(TLS_MAX_BYTES + 1)


@pytest.mark.parametrize(
    "case",
    [
        ("cert_file", _fifo, "not a regular file (a FIFO)"),
        ("key_file", _fifo, "not a regular file (a FIFO)"),
        ("key_file", _device_link, "not a regular file (a character device)"),
        ("cert_file", _huge, "too large (1.0 MiB; the limit is 1.0 MiB)"),
        ("key_file", lambda p: p.mkdir(), "not a regular file (a folder)"),
    ],
    ids=["fifo-cert", "fifo-key", "link-to-dev-zero", "huge-cert", "folder-key"],
)
async def test_a_renewed_file_that_is_no_regular_file_is_refused_and_the_last_pair_stays(
    serving: tuple[ServingCertificate, int],
    ca: Authority,
    caplog: pytest.LogCaptureFixture,
    case: tuple[str, Callable[[Path], object], str],
) -> None:
    """The event loop is not wedged on a FIFO nor fed /dev/zero: one line, the last good
    pair served, and a good pair after it taken up."""
    which, make, why = case
    certificate, port = serving
    first = _der(Pair(certificate.cert_file, certificate.key_file))
    target = getattr(certificate, which)
    _swap_in(target, make)
    await until(lambda: certificate.refusals == 1, "the refused file logged")
    assert await _connections(port, ca) == (first, first)
    refusal = [r.getMessage() for r in caplog.records if "is not used" in r.getMessage()]
    assert len(refusal) == 1, refusal
    assert refusal[0].endswith(f"{target}: {why}"), refusal[0]
    assert "\n" not in refusal[0]

    if target.is_dir():
        target.rmdir()
    second = _issue(ca, "second")
    _place(second, certificate.cert_file, certificate.key_file)
    await until(lambda: certificate.reloads == 1, "the good pair after it taken up")
    assert await _connections(port, ca) == (_der(second), _der(second))


@pytest.mark.parametrize("which", ["certificate", "key"])
def test_a_missing_file_of_the_pair_is_one_line_naming_it(
    tmp_path: Path, ca: Authority, which: str
) -> None:
    pair = _issue(ca, "first")
    gone = tmp_path / "gone.pem"
    cert, key = (gone, pair.key) if which == "certificate" else (pair.cert, gone)
    with pytest.raises(CertificateError) as info:
        tls_context(cert, key)
    assert str(info.value) == f"{which} {gone}: no such file"


def _files(certificate: ServingCertificate) -> tuple[Path, Path]:
    return certificate.cert_file, certificate.key_file


async def test_a_renewed_encrypted_key_is_refused_and_the_last_pair_stays(
    tmp_path: Path,
    serving: tuple[ServingCertificate, int],
    ca: Authority,
    caplog: pytest.LogCaptureFixture,
) -> None:
    certificate, port = serving
    first = _der(Pair(certificate.cert_file, certificate.key_file))
    second = _issue(ca, "second")
    _place(Pair(second.cert, encrypted_key(second, tmp_path / "enc.key")), *_files(certificate))
    await until(lambda: certificate.refusals == 1, "the encrypted key refused")
    assert await _connections(port, ca) == (first, first)
    refusal = [r.getMessage() for r in caplog.records if "is not used" in r.getMessage()]
    assert len(refusal) == 1, refusal
    assert refusal[0].endswith(
        f"key {certificate.key_file}: the key is encrypted; cdi-gen admission takes an "
        "unencrypted PEM key (the Secret holds it) and never asks for a passphrase"
    ), refusal[0]


def test_the_command_refuses_an_encrypted_key_without_a_prompt(
    tmp_path: Path, ca: Authority
) -> None:
    """On a terminal (its controlling one, as OpenSSL's prompt opens /dev/tty), the command
    prints its one line and exits 2: no passphrase prompt, no wait for one."""
    pair = _issue(ca, "only")
    key = encrypted_key(pair, tmp_path / "enc.key")
    controller, terminal = pty.openpty()

    def own_terminal() -> None:  # runs in the child, after setsid
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cdi_gen", "admission", "--driver", DRIVER,
             "--address", "127.0.0.1:0", "--tls-cert-file", str(pair.cert),
             "--tls-key-file", str(key)],
            stdin=terminal, stdout=terminal, stderr=terminal,
            start_new_session=True, preexec_fn=own_terminal,  # noqa: PLW1509 - only an ioctl
        )  # fmt: skip
        os.close(terminal)
        try:
            # A prompt would wait for a passphrase forever; the timeout is that failure.
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        output = b""
        with contextlib.suppress(OSError):  # EIO: the terminal's last holder has gone
            while chunk := os.read(controller, 65536):
                output += chunk
    finally:
        os.close(controller)
    text = output.decode(errors="replace")
    assert code == 2, text
    assert "pass phrase" not in text.lower(), text
    assert text.strip() == (
        f"error: --tls-cert-file {pair.cert}, --tls-key-file {key}: key {key}: the key is "
        "encrypted; cdi-gen admission takes an unencrypted PEM key (the Secret holds it) and "
        "never asks for a passphrase"
    ), text
