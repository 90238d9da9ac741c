"""Certificates for the tests' TLS: one CA, serving certs and client certs, and kubeconfigs, for
the cluster of tests/cluster and the fake API server's HTTPS (tests/fakes/apiserver.py).

Everything is generated per cluster or server with the ``cryptography`` package (EC P-256 keys:
fast to make, accepted by every component). Client identities follow what the API server's Node
and RBAC authorizers expect: ``CN=system:node:<name>, O=system:nodes`` for the kubelet,
``CN=system:kube-scheduler`` and ``CN=system:kube-controller-manager`` for the control plane,
``O=system:masters`` for the tests' admin.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=2)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common)])


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


class Authority:
    """A CA that issues into ``folder``; ``ca.crt`` is what every component trusts."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._key = _key()
        now = datetime.datetime.now(datetime.UTC)
        self._name = _name("cdi-gen-test-ca")
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = folder / "ca.crt"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        self.key = folder / "ca.key"
        _write_key(self._key, self.key)

    def issue(
        self,
        stem: str,
        common: str,
        *,
        orgs: tuple[str, ...] = (),
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
    ) -> Pair:
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common, orgs))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = Pair(self.folder / f"{stem}.crt", self.folder / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair

    def service_account_keys(self) -> Pair:
        """The key pair the API server signs service-account tokens with (not a certificate:
        ``cert`` is the public key)."""
        key = _key()
        pair = Pair(self.folder / "sa.pub", self.folder / "sa.key")
        pair.cert.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        _write_key(key, pair.key)
        return pair


def encrypted_key(pair: Pair, path: Path, passphrase: bytes = b"secret") -> Path:
    """``pair``'s key written to ``path`` encrypted with ``passphrase`` (PKCS#8 PEM, as
    ``openssl genpkey -aes256`` writes it)."""
    key = serialization.load_pem_private_key(pair.key.read_bytes(), None)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(passphrase),
        )
    )
    path.chmod(0o600)
    return path


def kubeconfig(path: Path, server: str, ca: Path, client: Pair, user: str) -> Path:
    """A kubeconfig with one cluster, one user (client certificate) and one context."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate": str(client.cert), "client-key": str(client.key)},
            }
        ],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
