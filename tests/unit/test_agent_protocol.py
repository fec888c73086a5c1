"""The command protocol's pure parts: envelope validation, run descriptions, receipts, the agent's backoff."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import SecretStr

from orchestrator.gateway import receipts
from orchestrator.protocol import commands as protocol
from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.results import RunnerMode

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
DEPLOYMENT = "6f1c1d2e-0000-4000-8000-000000000001"


def _spec(**job: Any) -> RunSpec:
    return RunSpec(
        org_id="acme",
        runner_id="r1",
        deployment_id=DEPLOYMENT,
        env_uuid="6f1c1d2e-0000-4000-8000-0000000000e1",
        mode=RunnerMode.DEPLOY,
        token=SecretStr("deployment-token"),
        gateway_url="https://po.example.com",
        encrypting_key="age1recipient",
        runner_configuration={"type": "vm", "connection": {"type": "agent", "key": "PEM"}, "job": job},
    )


def _envelope(**changes: Any) -> protocol.CommandEnvelope:
    description = protocol.RunDescription.from_run_spec(_spec(), "vm")
    spec = description.model_dump(mode="json") | {"token": "deployment-token"}
    fields: dict[str, Any] = {
        "protocol_version": "v1",
        "command_id": protocol.command_id(DEPLOYMENT),
        "organization_id": "acme",
        "runner_id": "r1",
        "deployment_id": DEPLOYMENT,
        "type": "create-job",
        "created_at": NOW,
        "expires_at": NOW + timedelta(hours=24),
        "payload": {"job_id": DEPLOYMENT, "spec": spec},
    }
    fields.update(changes)
    return protocol.CommandEnvelope.model_validate(fields)


def _check(envelope: protocol.CommandEnvelope, now: datetime = NOW) -> protocol.CreateJobPayload:
    return protocol.check_envelope(envelope, org_id="acme", runner_id="r1", now=now)


def test_command_id__upstream_format() -> None:
    assert f"create-job:{DEPLOYMENT}:1" == protocol.command_id(DEPLOYMENT)
    assert f"create-job:{DEPLOYMENT}:3" == protocol.command_id(DEPLOYMENT, 3)


def test_check_envelope__valid_command_gives_its_payload() -> None:
    payload = _check(_envelope())

    assert DEPLOYMENT == payload.job_id
    assert payload.spec.token is not None
    assert "deployment-token" == payload.spec.token.get_secret_value()


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"protocol_version": "v2"}, "UNSUPPORTED_PROTOCOL_VERSION"),
        ({"organization_id": "globex"}, "WRONG_RUNNER"),
        ({"runner_id": "r2"}, "WRONG_RUNNER"),
        ({"expires_at": NOW}, "COMMAND_EXPIRED"),
        ({"expires_at": NOW - timedelta(seconds=1)}, "COMMAND_EXPIRED"),
        ({"type": "delete-job"}, "UNSUPPORTED_COMMAND_TYPE"),
        ({"payload": {"job_id": DEPLOYMENT}}, "INVALID_PAYLOAD"),
        ({"deployment_id": "6f1c1d2e-0000-4000-8000-000000000002"}, "INVALID_PAYLOAD"),
    ],
)
def test_check_envelope__refusals(changes: dict[str, Any], code: str) -> None:
    with pytest.raises(protocol.EnvelopeError) as refused:
        _check(_envelope(**changes))

    assert code == refused.value.code


def test_check_envelope__a_payload_without_token_is_invalid() -> None:
    envelope = _envelope()
    spec = {k: v for k, v in envelope.payload["spec"].items() if k != "token"}
    stripped = envelope.model_copy(update={"payload": {**envelope.payload, "spec": spec}})

    with pytest.raises(protocol.EnvelopeError, match="token"):
        _check(stripped)


def test_envelope__unknown_fields_of_newer_gateways_ignored() -> None:
    envelope = _envelope(priority=5)

    assert "priority" not in envelope.model_dump()
    assert DEPLOYMENT == _check(envelope).job_id


def test_run_description__keeps_no_token_and_no_job_secrets() -> None:
    spec = _spec(runtime="process", environment={"A": "1"}, secrets={"CLOUD_KEY": "s3cr3t"})

    description = protocol.RunDescription.from_run_spec(spec, "vm")
    stored = description.model_dump_json()

    assert description.token is None
    assert "s3cr3t" not in stored and "deployment-token" not in stored and "PEM" not in stored
    assert {"runtime": "process", "environment": {"A": "1"}} == description.job


def test_run_description__round_trip_to_a_run_spec_with_the_agents_additions() -> None:
    description = protocol.RunDescription.from_run_spec(_spec(environment={"A": "1"}), "vm")
    delivered = protocol.RunDescription.model_validate_json(
        description.model_copy(update={"token": SecretStr("t0k")}).model_dump_json()
    )

    spec = delivered.to_run_spec(
        "acme", "r1", gateway_url="https://gw.internal", environment={"RUNNER_GATEWAY_CA_FILE": "/ca.pem"}
    )
    env = spec.runner_environment()

    assert ("t0k", "https://gw.internal") == (env["TOKEN"], env["RUNNER_GATEWAY_URL"])
    assert (DEPLOYMENT, "deploy", "age1recipient") == (
        env["DEPLOYMENT_ID"],
        env["MODE"],
        env["ENCRYPTING_KEY"],
    )
    assert {"A": "1", "RUNNER_GATEWAY_CA_FILE": "/ca.pem"} == spec.runner_configuration["job"]["environment"]
    with pytest.raises(ValueError, match="token"):
        description.to_run_spec("acme", "r1")


def test_requests__retry_delay_and_reject_reason_bounds() -> None:
    protocol.RetryRequest(receipt="r", delay_seconds=60)
    protocol.RejectRequest(receipt="r", reason="é" * 2048)
    for bad in ({"delay_seconds": -1}, {"delay_seconds": 61}):
        with pytest.raises(ValueError):
            protocol.RetryRequest.model_validate({"receipt": "r", **bad})
    for reason in ("", "é" * 2049):
        with pytest.raises(ValueError):
            protocol.RejectRequest(receipt="r", reason=reason)


def test_with_deployment_token__into_the_spec_and_first_in_the_job_specs_main_container() -> None:
    stored = {
        "job_id": DEPLOYMENT,
        "spec": {"deployment_id": DEPLOYMENT},
        "configuration": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "sidecar", "env": [{"name": "A", "value": "1"}]},
                        {"name": "main", "env": [{"name": "MODE", "value": "deploy"}]},
                    ]
                }
            }
        },
    }

    delivered = protocol.with_deployment_token(stored, "t0k")

    sidecar, main = delivered["configuration"]["template"]["spec"]["containers"]
    assert "t0k" == delivered["spec"]["token"]
    assert [{"name": "TOKEN", "value": "t0k"}, {"name": "MODE", "value": "deploy"}] == main["env"]
    assert [{"name": "A", "value": "1"}] == sidecar["env"]
    # The stored payload is not changed (it is the database row's).
    assert "token" not in stored["spec"]
    assert "TOKEN" not in str(stored["configuration"])


def test_with_deployment_token__a_payload_stored_with_only_a_spec_is_delivered_as_before() -> None:
    delivered = protocol.with_deployment_token({"job_id": DEPLOYMENT, "spec": {"mode": "deploy"}}, "t0k")

    assert {"job_id": DEPLOYMENT, "spec": {"mode": "deploy", "token": "t0k"}} == delivered


def _event(**changes: Any) -> dict[str, Any]:
    return {
        "event_id": f"{protocol.command_id(DEPLOYMENT)}:job-created",
        "type": "job-created",
        "organization_id": "acme",
        "runner_id": "r1",
        "deployment_id": DEPLOYMENT,
        "payload": {"job_id": DEPLOYMENT},
        **changes,
    }


def test_event_envelope__upstream_envelope_with_protocol_version_and_created_at() -> None:
    event = protocol.EventEnvelope.model_validate(
        _event(protocol_version="v1", created_at="2026-05-01T12:00:00Z")
    )

    assert ("v1", NOW) == (event.protocol_version, event.created_at)
    assert protocol.EventEnvelope.model_validate(_event()).protocol_version is None


def test_event_envelope__unknown_protocol_version_refused_naming_the_supported_one() -> None:
    with pytest.raises(ValueError) as refused:
        protocol.EventEnvelope.model_validate(_event(protocol_version="v2"))

    [error] = refused.value.errors()  # type: ignore[attr-defined]
    assert ("protocol_version",) == error["loc"]
    assert "protocol version 'v2' is not supported: this gateway speaks 'v1'" == error["msg"]


def test_event_ids__upstream_suffixes() -> None:
    command = protocol.command_id(DEPLOYMENT)

    assert f"{command}:job-created" == protocol.event_id(command, protocol.EventType.JOB_CREATED)
    assert f"{command}:runner-error-terminal" == protocol.event_id(
        command, protocol.EventType.RUNNER_ERROR, retryable=False
    )
    assert f"{command}:runner-error-retryable" == protocol.event_id(
        command, protocol.EventType.RUNNER_ERROR, retryable=True
    )


def test_paths__command_id_is_one_escaped_segment() -> None:
    path = protocol.command_action_path("acme", "r1", "create-job:d:1", "ack")

    assert "/runner-gateway/v1/orgs/acme/runners/r1/commands/create-job%3Ad%3A1/ack" == path
    assert "/gw/v1/orgs/acme/runners/r1/commands/next" == protocol.next_command_path(
        "acme", "r1", base_path="/gw"
    )


# --- receipts -------------------------------------------------------------------------------------------

KEY = receipts.receipt_key(b"s" * 32)
RECEIPT = receipts.Receipt(
    org_id="acme", runner_id="r1", command_id="create-job:d:1", attempt=2, expires_at=NOW
)


def _open(text: str, key: bytes = KEY, **ids: str) -> receipts.Receipt:
    return receipts.open_receipt(
        key,
        text,
        org_id=ids.get("org", "acme"),
        runner_id=ids.get("runner", "r1"),
        command_id=ids.get("command", "create-job:d:1"),
    )


def test_receipts__round_trip_opaque_and_fresh_each_time() -> None:
    first, second = receipts.seal(KEY, RECEIPT), receipts.seal(KEY, RECEIPT)

    assert RECEIPT == _open(first)
    assert first != second
    assert "acme" not in first and "create-job" not in first


def test_receipts__other_key_tampering_other_command_refused() -> None:
    sealed = receipts.seal(KEY, RECEIPT)
    tampered = sealed[:-2] + ("A" if sealed[-2] != "A" else "B") + sealed[-1]

    attempts: list[Callable[[], object]] = [
        lambda: _open(sealed, receipts.receipt_key(b"t" * 32)),
        lambda: _open(tampered),
        lambda: _open(sealed, command="create-job:d:2"),
        lambda: _open(sealed, runner="r2"),
        lambda: _open(sealed, org="globex"),
        lambda: _open("garbage"),
        lambda: _open(""),
    ]
    for attempt in attempts:
        with pytest.raises(receipts.InvalidReceiptError):
            attempt()
