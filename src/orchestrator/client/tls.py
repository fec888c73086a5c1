"""TLS of every orchestrator client: which CAs the runner (``po-runner standard``) and the agent
(``po-runner remote``) trust towards the runner gateway and which mTLS client certificate they present, and
the plain-``http`` fast path all three clients (``octl`` too) take (:func:`client_verify`).

An extra CA comes as a file (``RUNNER_GATEWAY_CA_FILE``) or as PEM text (``RUNNER_GATEWAY_CA``: how the
agent hands its CA to the runner Jobs it launches, whose pods do not have the agent's files; a CA
certificate is public). The system CAs stay trusted either way. Nothing here imports server code.
"""

from __future__ import annotations

import ssl
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from orchestrator import errors

__all__ = [
    "PEM_CERTIFICATE_MARKER",
    "GatewayTls",
    "check_ca_pem",
    "client_verify",
    "gateway_verify",
    "plain_http_verify",
    "read_ca_file",
]

PEM_CERTIFICATE_MARKER: Final = "-----BEGIN CERTIFICATE-----"


@dataclass(frozen=True, kw_only=True)
class GatewayTls:
    """What a gateway client trusts and presents; the key is a file path, never key material."""

    ca_file: Path | None = None
    ca_pem: str | None = None
    client_cert_file: Path | None = None
    client_key_file: Path | None = None


def check_ca_pem(text: str) -> str:
    """``text`` if it holds at least one PEM certificate OpenSSL accepts as a CA, else ``ValueError``."""
    if PEM_CERTIFICATE_MARKER not in text:
        raise ValueError("holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    try:
        ssl.create_default_context().load_verify_locations(cadata=text)
    except (ssl.SSLError, ValueError) as exc:
        raise ValueError(f"is not a usable PEM certificate: {exc}") from exc
    return text


def read_ca_file(path: Path) -> str:
    """The PEM text of a CA file, checked; ``ValueError`` naming the file otherwise."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    try:
        return check_ca_pem(text)
    except ValueError as exc:
        raise ValueError(f"{path} {exc}") from exc


def gateway_verify(tls: GatewayTls | None) -> ssl.SSLContext | bool:
    """The ``verify`` argument for httpx: system CAs plus the extra CA (file and/or PEM text), and the mTLS
    client pair; ``ConfigurationError`` if any of it cannot be loaded."""
    if tls is None or tls == GatewayTls():
        return True
    if (tls.client_cert_file is None) != (tls.client_key_file is None):
        raise errors.ConfigurationError(
            "mTLS needs both RUNNER_GATEWAY_CLIENT_CERT_FILE and RUNNER_GATEWAY_CLIENT_KEY_FILE"
        )
    context = ssl.create_default_context()
    # A certificate given is a trust anchor as it is, a CA or the server's own (self-signed or not): the
    # server's local runs are given its certificate file, chain and all.
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    try:
        if tls.ca_file is not None:
            context.load_verify_locations(cafile=str(tls.ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise errors.ConfigurationError(f"cannot load RUNNER_GATEWAY_CA_FILE {tls.ca_file}: {exc}") from exc
    try:
        if tls.ca_pem:
            context.load_verify_locations(cadata=tls.ca_pem)
    except (ssl.SSLError, ValueError) as exc:
        raise errors.ConfigurationError(f"cannot load RUNNER_GATEWAY_CA (PEM text): {exc}") from exc
    try:
        if tls.client_cert_file is not None and tls.client_key_file is not None:
            context.load_cert_chain(certfile=str(tls.client_cert_file), keyfile=str(tls.client_key_file))
    except (OSError, ssl.SSLError) as exc:
        raise errors.ConfigurationError(f"cannot load the runner gateway mTLS client pair: {exc}") from exc
    return context


def plain_http_verify(scheme: str) -> ssl.SSLContext | bool:
    """``verify`` for a client whose every request goes to ``scheme``://one host (relative paths, no
    redirects followed): every client built by :func:`client_verify`.

    ``verify=True`` makes httpx load certifi's CA bundle into a new SSL context when the client is built
    (about 50 ms, on every deployment and every ``octl`` command). Over plain http without a proxy from
    the environment no TLS connection is ever opened, so the client gets a context without any CA instead:
    it would fail every certificate check (closed, not open) if one were. https, or a proxy, keeps ``True``.
    """
    if scheme != "http" or urllib.request.getproxies():
        return True
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def client_verify(scheme: str, tls: GatewayTls | None = None) -> ssl.SSLContext | bool:
    """The ``verify`` argument of a client of ``scheme``://one host: the system CAs plus ``tls``
    (:func:`gateway_verify`), or over plain ``http`` without any :func:`plain_http_verify`'s context."""
    verify = gateway_verify(tls)
    return plain_http_verify(scheme) if verify is True else verify
