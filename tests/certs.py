"""A throw-away PKI for TLS tests, made in the test with the ``cryptography`` package.

``make_pki(folder)`` writes PEM files and returns their paths:

- ``ca`` signs ``server`` (SANs ``localhost``, ``127.0.0.1``, ``::1``) and two clients:
  ``client`` (SAN ``prometheus.monitoring.svc``) and ``intruder`` (SAN ``intruder.example``);
- ``other_ca`` signs ``stranger``, a client certificate no server here trusts.

Keys are EC P-256: generating them takes milliseconds, unlike RSA.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Key = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM files."""

    cert: str
    key: str


@dataclass(frozen=True)
class Pki:
    ca: Pair
    server: Pair
    client: Pair
    intruder: Pair
    other_ca: Pair
    stranger: Pair
    folder: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return builder.not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))


def make_ca(common_name: str) -> tuple[x509.Certificate, Key]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _validity(x509.CertificateBuilder()
                        .subject_name(_name(common_name)).issuer_name(_name(common_name))
                        .public_key(key.public_key()).serial_number(x509.random_serial_number())
                        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                     content_commitment=False, key_encipherment=False,
                                                     data_encipherment=False, key_agreement=False,
                                                     encipher_only=False, decipher_only=False), critical=True))
    return builder.sign(key, hashes.SHA256()), key


def issue(ca: tuple[x509.Certificate, Key], common_name: str, *, dns: tuple[str, ...] = (),
          ips: tuple[str, ...] = (), server: bool) -> tuple[x509.Certificate, Key]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = _validity(x509.CertificateBuilder()
                        .subject_name(_name(common_name)).issuer_name(ca_cert.subject)
                        .public_key(key.public_key()).serial_number(x509.random_serial_number())
                        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                        .add_extension(x509.SubjectAlternativeName(sans), critical=False))
    return builder.sign(ca_key, hashes.SHA256()), key


def write(folder: Path, stem: str, pair: tuple[x509.Certificate, Key], *, passphrase: bytes | None = None) -> Pair:
    cert, key = pair
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    encryption = (serialization.BestAvailableEncryption(passphrase) if passphrase
                  else serialization.NoEncryption())
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           encryption))
    return Pair(str(cert_path), str(key_path))


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    ca = make_ca("dra-exporter test CA")
    other = make_ca("some other CA")
    return Pki(
        ca=write(folder, "ca", ca),
        server=write(folder, "server", issue(ca, "dra-exporter", dns=("localhost",), ips=("127.0.0.1", "::1"),
                                             server=True)),
        client=write(folder, "client", issue(ca, "prometheus", dns=("prometheus.monitoring.svc",), server=False)),
        intruder=write(folder, "intruder", issue(ca, "intruder", dns=("intruder.example",), server=False)),
        other_ca=write(folder, "other-ca", other),
        stranger=write(folder, "stranger", issue(other, "stranger", dns=("prometheus.monitoring.svc",),
                                                 server=False)),
        folder=folder,
    )


def new_server_pair(folder: Path, ca: Pair, stem: str, common_name: str) -> Pair:
    """Another server certificate from the CA at ``ca`` (to test rotation)."""
    ca_cert = x509.load_pem_x509_certificate(Path(ca.cert).read_bytes())
    ca_key = serialization.load_pem_private_key(Path(ca.key).read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    return write(folder, stem, issue((ca_cert, ca_key), common_name, dns=("localhost",), ips=("127.0.0.1",),
                                     server=True))


def common_name(der: bytes) -> str:
    """The CN of a DER certificate (what ``SSLSocket.getpeercert(binary_form=True)`` returns)."""
    cert = x509.load_der_x509_certificate(der)
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)
