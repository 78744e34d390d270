"""Webhook serving certificates: generated with `cryptography` (a CA + a serving cert for the host the API
server dials), or read from a directory (cert-manager's tls.crt / tls.key / ca.crt)."""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    certfile: Path
    keyfile: Path
    cafile: Optional[Path]  # the CA bundle the API server trusts (caBundle); None: the cert itself


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn[:64])])


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def generate(directory: os.PathLike[str] | str, hosts: list[str], *, days: int = 3650) -> CertFiles:
    """A fresh CA and a serving certificate (ECDSA P-256) valid for every name/IP in `hosts`."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(minutes=5)
    until = now + _dt.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("grpo-operator webhook CA")
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(until)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    uniq = list(dict.fromkeys(h for h in hosts if h))
    cert = (x509.CertificateBuilder().subject_name(_name(uniq[0] if uniq else "grpo-operator")).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in uniq]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = CertFiles(d / "tls.crt", d / "tls.key", d / "ca.crt")
    old = os.umask(0o077)
    try:
        files.keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
        files.certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files.cafile.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))  # type: ignore[union-attr]
    finally:
        os.umask(old)
    return files


def from_dir(directory: os.PathLike[str] | str) -> CertFiles:
    """cert-manager / Kubernetes TLS secret layout: tls.crt, tls.key and optionally ca.crt."""
    d = Path(directory)
    cert, key, ca = d / "tls.crt", d / "tls.key", d / "ca.crt"
    if not cert.is_file() or not key.is_file():
        raise FileNotFoundError(f"{d}: expected tls.crt and tls.key (a kubernetes.io/tls Secret mounted as a directory)")
    return CertFiles(cert, key, ca if ca.is_file() else None)
