"""The server's TLS settings and its live context (``web.tls.ServerTls``): a changed pair is loaded into the
same context, which new handshakes then present; a pair that does not load changes nothing. Handshakes run
in memory (``ssl.MemoryBIO``) against a client that verifies with the test CA."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from pydantic import ValidationError

from orchestrator.cli.server import main
from orchestrator.errors import ConfigurationError
from orchestrator.settings import ServerSettings
from orchestrator.web.tls import ServerTls
from tests.support.kube_api import CertificateAuthority, KeyPair


def write(pair: KeyPair, directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(pair.cert_pem)
    (directory / "tls.key").write_bytes(pair.key_pem)
    return x509.load_pem_x509_certificate(pair.cert_pem).serial_number


def handshake_serial(context: ssl.SSLContext, ca: CertificateAuthority) -> int:
    """The serial of the certificate a new handshake with ``context`` presents."""
    client_in, client_out, server_in, server_out = (ssl.MemoryBIO() for _ in range(4))
    client = ssl.create_default_context(cadata=ca.pem.decode()).wrap_bio(
        client_in, client_out, server_hostname="127.0.0.1"
    )
    server = context.wrap_bio(server_in, server_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for name, side in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            server_in.write(client_out.read())
            client_in.write(server_out.read())
        if all(done.values()):
            break
    der = client.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_server_tls__changed_pair_loaded_into_the_live_context(tmp_path: Path) -> None:
    ca = CertificateAuthority("ca")
    first = write(ca.issue("127.0.0.1", server=True), tmp_path)
    tls = ServerTls(cert_file=tmp_path / "tls.crt", key_file=tmp_path / "tls.key")
    live = tls.context

    unchanged = tls.reload()
    before = handshake_serial(live, ca)
    second = write(ca.issue("127.0.0.1", server=True), tmp_path)
    changed = tls.reload()

    assert (unchanged, changed) == (False, True)
    assert before == first
    assert tls.context is live
    assert handshake_serial(live, ca) == second


def test_server_tls__a_pair_that_does_not_load_changes_nothing(tmp_path: Path) -> None:
    ca = CertificateAuthority("ca")
    first = write(ca.issue("127.0.0.1", server=True), tmp_path)
    tls = ServerTls(cert_file=tmp_path / "tls.crt", key_file=tmp_path / "tls.key")
    # Half a rotation: the new certificate beside the old key.
    (tmp_path / "tls.crt").write_bytes(ca.issue("127.0.0.1", server=True).cert_pem)

    with pytest.raises(ConfigurationError, match=r"cannot load the TLS certificate .*tls\.crt with the key"):
        tls.reload()

    assert handshake_serial(tls.context, ca) == first


def test_server_tls__unreadable_file_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"cannot read .*missing\.crt"):
        ServerTls(cert_file=tmp_path / "missing.crt", key_file=tmp_path / "missing.key")


def test_server_tls__client_ca_asks_for_a_certificate_without_requiring_one(tmp_path: Path) -> None:
    ca = CertificateAuthority("ca")
    write(ca.issue("127.0.0.1", server=True), tmp_path)
    (tmp_path / "clients.pem").write_bytes(CertificateAuthority("clients").pem)
    tls = ServerTls(
        cert_file=tmp_path / "tls.crt", key_file=tmp_path / "tls.key", client_ca_file=tmp_path / "clients.pem"
    )
    plain = ServerTls(cert_file=tmp_path / "tls.crt", key_file=tmp_path / "tls.key")

    assert tls.context.verify_mode == ssl.CERT_OPTIONAL
    assert plain.context.verify_mode == ssl.CERT_NONE
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tls_cert_file": "/c.crt"}, "PO_TLS_CERT_FILE and PO_TLS_KEY_FILE must be set together"),
        ({"tls_key_file": "/c.key"}, "PO_TLS_CERT_FILE and PO_TLS_KEY_FILE must be set together"),
        ({"tls_client_ca_file": "/ca.pem"}, "PO_TLS_CLIENT_CA_FILE needs PO_TLS_CERT_FILE"),
        ({"tls_client_auth": "always"}, "tls_client_auth"),
    ],
)
def test_settings__tls_refused_combinations(tmp_path: Path, values: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ServerSettings(data_dir=tmp_path / "data", local_runs_dir=tmp_path / "runs", **values)  # type: ignore[arg-type]


def test_settings__default_public_url_follows_the_scheme(tmp_path: Path) -> None:
    base = {"data_dir": tmp_path / "data", "local_runs_dir": tmp_path / "runs", "listen": "127.0.0.1:8443"}
    plain = ServerSettings(**base)  # type: ignore[arg-type]
    tls = ServerSettings(**base, tls_cert_file=tmp_path / "c", tls_key_file=tmp_path / "k")  # type: ignore[arg-type]

    assert plain.resolved_public_url == "http://127.0.0.1:8443"
    assert tls.resolved_public_url == "https://127.0.0.1:8443"
    assert tls.tls_client_auth == "gateway" and tls.shutdown_grace_seconds == 20


def test_serve__unloadable_certificate_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    env = {
        "PO_DATA_DIR": str(tmp_path / "data"),
        "PO_LOCAL_RUNS_DIR": str(tmp_path / "runs"),
        "PO_TLS_CERT_FILE": str(tmp_path / "tls.crt"),
        "PO_TLS_KEY_FILE": str(tmp_path / "tls.key"),
    }

    result = CliRunner().invoke(main, ["serve"], env=env)

    assert result.exit_code != 0
    assert "Error: cannot load the TLS certificate" in result.output
    assert "Traceback" not in result.output
