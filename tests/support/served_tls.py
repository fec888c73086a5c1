"""The server's built-in TLS as an operator sees it: a key pair installed into its TLS directory the way a
rotation does it, and the certificate a new connection is shown. Shared by the TLS tests and the docs'
TLS page test."""

from __future__ import annotations

import os
import socket
import ssl
from pathlib import Path

from cryptography import x509

from tests.support.kube_api import CertificateAuthority, KeyPair


def install(pair: KeyPair, tls_dir: Path) -> int:
    """Replace the served pair (each file written aside, then renamed over the old one); its serial."""
    tls_dir.mkdir(parents=True, exist_ok=True)
    for name, data in (("tls.crt", pair.cert_pem), ("tls.key", pair.key_pem)):
        aside = tls_dir / f".{name}.new"
        aside.write_bytes(data)
        os.replace(aside, tls_dir / name)
    return x509.load_pem_x509_certificate(pair.cert_pem).serial_number


def served_serial(port: int, ca: CertificateAuthority) -> int:
    """The serial of the certificate a new connection is shown (verified against ``ca``)."""
    context = ssl.create_default_context(cadata=ca.pem.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number
