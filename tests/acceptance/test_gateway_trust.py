"""A server on its own self-signed certificate (issue 26): its local runs trust that certificate without
being told, and a runner that cannot trust the gateway fails its deployment within 30 s, the message naming
the certificate problem and the host name (instead of retrying silently for minutes)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.kube_api import CertificateAuthority
from tests.support.octl import Octl
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.outages import ServerProcess, wait_for
from tests.support.stack import build_stack, runner_body

pytestmark = [pytest.mark.slow, pytest.mark.spread]


def self_signed(tls_dir: Path) -> bytes:
    """Write a self-signed certificate for localhost and 127.0.0.1 (as ``openssl req -x509`` makes one) and
    its key into ``tls_dir``; the certificate's PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    tls_dir.mkdir(parents=True, exist_ok=True)
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (tls_dir / "tls.crt").write_bytes(pem)
    (tls_dir / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return pem


def idle_warm_runners(server: ServerProcess) -> list[int]:
    """Idle warm runners of ``server``: their stderr is a file of its runs dir's ``.warm``."""
    found = []
    warm_dir = str(server.runs_dir / ".warm") + os.sep
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (
                os.readlink(entry / "fd" / "2").startswith(warm_dir)
                and (entry / "stat").read_text().split(") ")[1][0] not in "ZX"
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    pem = self_signed(tmp_path / "tls")
    process = ServerProcess(
        database_url,
        tmp_path / "data",
        https_ca=pem.decode(),
        PO_TLS_CERT_FILE=str(tmp_path / "tls" / "tls.crt"),
        PO_TLS_KEY_FILE=str(tmp_path / "tls" / "tls.key"),
        PO_LOG_LEVEL="info",
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_self_signed__the_servers_own_local_run_trusts_it_untold(
    server: ServerProcess, tmp_path: Path
) -> None:
    # No RUNNER_GATEWAY_CA in the runner's job environment.
    stack = build_stack(
        server.url, tmp_path, runner=runner_body(tmp_path / "terraformrc"), verify=server.verify
    )
    try:
        # Forked from the zygote (the default); then, with the zygote off, the first run is cold (the warm
        # pool fills on first use) and the second is handed to a warm runner.
        forked = stack.deploy()
        server.stop()
        server.env["PO_LOCAL_ZYGOTE"] = "off"
        server.start()
        cold = stack.deploy()
        wait_for(lambda: idle_warm_runners(server), 30, "a warm runner")
        warm = stack.deploy()
    finally:
        stack.client.close()
    assert forked["status"] == "succeeded", forked
    assert cold["status"] == "succeeded", cold
    assert warm["status"] == "succeeded", warm


def test_self_signed__a_runner_given_a_wrong_ca_fails_within_30_s_naming_the_certificate_and_host(
    server: ServerProcess, tmp_path: Path
) -> None:
    wrong = CertificateAuthority("not-the-servers-ca").pem.decode()
    runner = runner_body(tmp_path / "terraformrc", RUNNER_GATEWAY_CA=wrong)
    stack = build_stack(server.url, tmp_path, runner=runner, verify=server.verify)
    started = time.monotonic()
    try:
        deployed = stack.deploy()
    finally:
        stack.client.close()
    elapsed = time.monotonic() - started
    assert deployed["status"] == "failed", deployed
    assert elapsed < 30, elapsed
    message = deployed["status_message"]
    assert "certificate verify failed for 127.0.0.1" in message, message


# --- octl against the self-signed server ---------------------------------------------------------------


def test_octl__without_the_certificate_says_certificate_verify_failed_and_how_to_trust_it(
    server: ServerProcess, tmp_path: Path
) -> None:
    octl = Octl(server.url, BOOTSTRAP_TOKEN, tmp_path / "octl" / "config.yaml")
    result = octl("get", "projects")
    assert result.exit_code == 3, result.output
    assert "certificate verify failed for 127.0.0.1" in result.stderr, result.stderr
    assert "--ca-file" in result.stderr
    assert "is `orchestrator serve` running" not in result.stderr


def test_octl__ca_file_flag_env_and_profile_key_trust_the_servers_certificate(
    server: ServerProcess, tmp_path: Path
) -> None:
    cert = str(tmp_path / "tls" / "tls.crt")
    config = tmp_path / "octl" / "config.yaml"
    octl = Octl(server.url, BOOTSTRAP_TOKEN, config)
    assert octl("--ca-file", cert, "create", "org", "acme").exit_code == 0
    by_env = octl("get", "orgs", PO_CA_FILE=cert)
    assert by_env.exit_code == 0, by_env.output
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f"ca_file: {cert}\n")
    assert octl("get", "orgs").exit_code == 0
    missing = octl("--ca-file", str(tmp_path / "nope.pem"), "get", "projects")
    assert missing.exit_code == 2
    assert "nope.pem" in missing.stderr and "--ca-file" in missing.stderr
