"""``cdi-gen admission``: the claims' admission webhook, refusing a bad ``DeviceConfig``."""

from __future__ import annotations

from pathlib import Path

import click

from cdi_gen.cli import options


def _address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{value!r}: want HOST:PORT, e.g. 0.0.0.0:8443")
    return host.strip("[]") or "0.0.0.0", int(port)


@click.command()
@options.CONFIG_FILE
@click.option(
    "--driver",
    "driver",
    envvar="CDI_GEN_DRA_DRIVER",
    help="The DRA driver whose claim entries are checked; default: the config's vendor.",
)
@click.option("--address", default="0.0.0.0:8443", show_default=True, help="HOST:PORT to serve.")
@click.option(
    "--tls-cert-file",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="The serving certificate (PEM, with its chain); a renewed one is taken up when the "
    "file changes.",
)
@click.option(
    "--tls-key-file",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="The serving certificate's key (PEM).",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0.1, max=3600),
    default=10.0,
    show_default=True,
    help="Seconds a client has for its whole connection (TLS handshake, request, and any wait "
    "for the memory budget); the API server itself waits the webhook's timeoutSeconds.",
)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text")
def admission(
    *,
    config_path: Path | None,
    driver: str | None,
    address: str,
    tls_cert_file: Path,
    tls_key_file: Path,
    request_timeout: float,
    log_format: str,
) -> None:
    """Serve the validating admission webhook of ResourceClaims and ResourceClaimTemplates:
    an opaque entry of the driver that is not a valid DeviceConfig is refused at `kubectl
    apply` with the message the driver would give at NodePrepareResources. Runs until
    SIGTERM or SIGINT."""
    import asyncio
    import contextlib
    import logging
    import signal

    from cdi_gen.admission.certificate import CertificateError, ServingCertificate
    from cdi_gen.admission.https import PATH, AdmissionLimits, serve_admission
    from cdi_gen.cli.slices import _driver
    from cdi_gen.config.loader import load_config
    from cdi_gen.errors import ConfigError
    from cdi_gen.logs import setup_logging

    setup_logging(log_format)
    host, port = _address(address)
    driver = _driver(driver, driver or load_config(config_path).vendor)
    try:
        certificate = ServingCertificate(tls_cert_file, tls_key_file)
    except CertificateError as exc:
        raise ConfigError(
            f"--tls-cert-file {tls_cert_file}, --tls-key-file {tls_key_file}: {exc}"
        ) from None

    async def main() -> None:
        limits = AdmissionLimits(deadline=request_timeout)
        server = await serve_admission(host, port, certificate.context, driver, limits)
        renewals = asyncio.create_task(certificate.watch())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        logging.getLogger("cdi_gen.admission").info(
            "admission: checking %s's claim configuration at https://%s:%d%s",
            driver, host, port, PATH,
        )  # fmt: skip
        await stop.wait()
        renewals.cancel()
        server.close()
        # Reviews under way get 5 s to be answered (the API server's own wait); any left
        # after are dropped with the loop, which failurePolicy Ignore lets through.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 5)

    asyncio.run(main())
