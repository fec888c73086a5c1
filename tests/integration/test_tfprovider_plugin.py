"""The provider executable as Terraform starts it: handshake, TLS, RPCs, shutdown, and what it imports.

Terraform starts the provider several times per command, most of them for the schema or a validation
only. Each test here starts the real executable (``python -X importtime -m orchestrator.tfprovider.main``)
with Terraform's environment, talks gRPC to it over the socket its handshake names, shuts it down as
go-plugin does, and reads from the import log which modules the start loaded: a request loads only what
it needs (no API client for a plan of creates, no resource definitions for the schema).
"""

from __future__ import annotations

import base64
import datetime
import os
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from orchestrator.tfprovider import cty, provider, registry, server, tfplugin6
from orchestrator.tfprovider.main import MAGIC_COOKIE_VALUE
from orchestrator.tfprovider.schema import object_type

PROVIDER_TYPE = object_type(provider.ATTRIBUTES)
#: Imported by no start unless a request needs them.
HEAVY = ("httpx", "yaml", "orchestrator.client", "pyvider", "pydantic", "structlog", "cryptography.x509")


def _client_certificate() -> str:
    """A certificate like the one go-plugin's client sends (ECDSA P-521)."""
    key = ec.generate_private_key(ec.SECP521R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(key, hashes.SHA512())
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


def _environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "PLUGIN_", "PO_"))}
    return {
        **base,
        "TF_PLUGIN_MAGIC_COOKIE": MAGIC_COOKIE_VALUE,
        "PLUGIN_PROTOCOL_VERSIONS": "6",
        "PLUGIN_CLIENT_CERT": _client_certificate(),
        "PLUGIN_UNIX_SOCKET_DIR": str(tmp_path),
        # Nothing listens here: a request that called the API would fail.
        "PO_API_URL": "http://127.0.0.1:9",
        "PO_ORG_ID": "org",
        "OCTL_CONFIG": str(tmp_path / "no-octl-config.yaml"),
        **extra,
    }


@dataclass
class Started:
    process: subprocess.Popen[bytes]
    handshake: list[str]
    channel: grpc.Channel

    def call(self, method: str, request: Any = b"", service: str = "tfplugin6.Provider") -> bytes:
        payload = request if isinstance(request, bytes) else request.SerializeToString()
        answer: bytes = self.channel.unary_unary(f"/{service}/{method}")(payload, timeout=60)
        return answer

    def shutdown(self) -> tuple[int, set[str]]:
        """go-plugin's way: ``GRPCController/Shutdown``; the exit code and the modules the start imported."""
        self.call("Shutdown", service="plugin.GRPCController")
        self.channel.close()
        _, err = self.process.communicate(timeout=60)
        imported = {
            line.split("|")[-1].strip()
            for line in err.decode().splitlines()
            if line.startswith("import time:") and "|" in line
        }
        return self.process.returncode, imported


@contextmanager
def started_provider(env: dict[str, str]) -> Iterator[Started]:
    process = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "orchestrator.tfprovider.main"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        handshake = process.stdout.readline().decode().strip().split("|")
        assert len(handshake) == 6, handshake
        core, version, network, address, kind, certificate = handshake
        assert (core, version, network, kind) == ("1", "6", "unix", "grpc")
        if certificate:
            der = base64.b64decode(certificate + "=" * (-len(certificate) % 4))
            credentials = grpc.ssl_channel_credentials(
                root_certificates=ssl.DER_cert_to_PEM_cert(der).encode()
            )
            channel = grpc.secure_channel(
                f"unix:{address}", credentials, options=[("grpc.ssl_target_name_override", "localhost")]
            )
        else:
            channel = grpc.insecure_channel(f"unix:{address}")
        yield Started(process, handshake, channel)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _heavy(imported: set[str]) -> list[str]:
    return sorted(name for name in imported if name.split(".")[0] in HEAVY or name.startswith(HEAVY))


def test_start__answers_the_schema_from_its_file_and_loads_nothing_else(tmp_path: Path) -> None:
    with started_provider(_environment(tmp_path)) as started:
        certificate = started.handshake[5]
        assert certificate and not certificate.endswith("=")  # go-plugin reads it as unpadded base64
        socket_dir = Path(started.handshake[3]).parent
        assert socket_dir.name.startswith("tfprovider-")
        assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700  # only this user reaches the socket
        assert started.call("GetProviderSchema") == Path(server.SCHEMA_FILE).read_bytes()
        assert started.call("Check", service="grpc.health.v1.Health") == b"\x08\x01"
        code, imported = started.shutdown()
    assert code == 0
    assert not socket_dir.exists()
    assert _heavy(imported) == []
    assert "google.protobuf" not in imported and "msgpack" not in imported
    assert "orchestrator.tfprovider.rpc" not in imported
    assert "orchestrator.tfprovider.registry" not in imported


def test_start__plans_creates_without_the_api_client(tmp_path: Path) -> None:
    rule = registry.RESOURCES["platform-orchestrator_runner_rule"]
    rule_type = object_type(rule.attributes)
    config = {"runner_id": "r", "project_id": "p", "env_type_id": None, "id": None}
    with started_provider(_environment(tmp_path)) as started:
        # every attribute null: the settings come from the environment
        provider_config = tfplugin6.message("DynamicValue")(msgpack=cty.to_msgpack({}, PROVIDER_TYPE))
        validated = tfplugin6.message("ValidateProviderConfig.Response").FromString(
            started.call(
                "ValidateProviderConfig",
                tfplugin6.message("ValidateProviderConfig.Request")(config=provider_config),
            )
        )
        assert list(validated.diagnostics) == []
        configured = tfplugin6.message("ConfigureProvider.Response").FromString(
            started.call(
                "ConfigureProvider", tfplugin6.message("ConfigureProvider.Request")(config=provider_config)
            )
        )
        assert list(configured.diagnostics) == []
        encoded = tfplugin6.message("DynamicValue")(msgpack=cty.to_msgpack(config, rule_type))
        planned = tfplugin6.message("PlanResourceChange.Response").FromString(
            started.call(
                "PlanResourceChange",
                tfplugin6.message("PlanResourceChange.Request")(
                    type_name="platform-orchestrator_runner_rule",
                    prior_state={"msgpack": cty.to_msgpack(None, rule_type)},
                    proposed_new_state=encoded,
                    config=encoded,
                ),
            )
        )
        code, imported = started.shutdown()
    assert list(planned.diagnostics) == []
    assert cty.from_msgpack(planned.planned_state.msgpack, rule_type) == {**config, "id": cty.UNKNOWN}
    assert code == 0
    assert _heavy(imported) == []
    assert "orchestrator.tfprovider.runners" in imported


def test_start__an_api_error_is_a_diagnostic(tmp_path: Path) -> None:
    """Apply reaches the API (here: nothing listens) and answers the failure as a diagnostic."""
    rule = registry.RESOURCES["platform-orchestrator_runner_rule"]
    rule_type = object_type(rule.attributes)
    planned = {"runner_id": "r", "project_id": "p", "env_type_id": None, "id": cty.UNKNOWN}
    config = {**planned, "id": None}
    with started_provider(_environment(tmp_path)) as started:
        started.call(
            "ConfigureProvider",
            tfplugin6.message("ConfigureProvider.Request")(
                config={"msgpack": cty.to_msgpack({}, PROVIDER_TYPE)}
            ),
        )
        applied = tfplugin6.message("ApplyResourceChange.Response").FromString(
            started.call(
                "ApplyResourceChange",
                tfplugin6.message("ApplyResourceChange.Request")(
                    type_name="platform-orchestrator_runner_rule",
                    prior_state={"msgpack": cty.to_msgpack(None, rule_type)},
                    planned_state={"msgpack": cty.to_msgpack(planned, rule_type)},
                    config={"msgpack": cty.to_msgpack(config, rule_type)},
                ),
            )
        )
        code, imported = started.shutdown()
    (diagnostic,) = applied.diagnostics
    assert diagnostic.severity == tfplugin6.SEVERITY_ERROR
    assert diagnostic.summary == "create runner_rule for runner 'r': the API cannot be reached"
    assert cty.from_msgpack(applied.new_state.msgpack, rule_type) is None
    assert code == 0 and "httpx" in imported
    # httpx's command line, HTTP/2 and async backends are never loaded (session.OPTIONAL_IMPORTS); the
    # log has their names as attempts, none of what each would import once loaded
    assert not [
        name for name in imported if name.startswith(("rich", "pygments", "h2.connection", "anyio._"))
    ]


def test_start__without_a_client_certificate_serves_plaintext(tmp_path: Path) -> None:
    """TF_DISABLE_PLUGIN_TLS: Terraform sends no certificate and expects an empty sixth field. A socket
    directory too long for a Unix socket's path falls back to /tmp."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    with started_provider(
        _environment(tmp_path, PLUGIN_CLIENT_CERT="", PLUGIN_UNIX_SOCKET_DIR=str(deep))
    ) as started:
        assert started.handshake[5] == ""
        assert started.handshake[3].startswith("/tmp/tfprovider-")
        assert started.call("StopProvider") == b""
        code, _ = started.shutdown()
    assert code == 0


def test_start__refuses_a_protocol_it_does_not_speak_and_a_start_by_hand(tmp_path: Path) -> None:
    old = subprocess.run(
        [sys.executable, "-m", "orchestrator.tfprovider.main"],
        env=_environment(tmp_path, PLUGIN_PROTOCOL_VERSIONS="4,5"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert old.returncode == 1 and old.stdout == ""
    assert "offers plugin protocol versions '4,5'; this provider speaks 6" in old.stderr
    by_hand = subprocess.run(
        [sys.executable, "-m", "orchestrator.tfprovider.main"],
        env={k: v for k, v in _environment(tmp_path).items() if k != "TF_PLUGIN_MAGIC_COOKIE"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert by_hand.returncode == 1 and "octl terraform install-provider" in by_hand.stderr
    assert list(tmp_path.iterdir()) == []  # no socket directory left behind
