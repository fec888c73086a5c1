"""Wire models of the runner results, the gateway limits and paths, and the age helpers."""

from __future__ import annotations

import base64
import json

import pytest

from orchestrator import errors
from orchestrator.protocol import age, results


def full_results() -> results.DeploymentResults:
    _, recipient = age.generate_identity()
    return results.DeploymentResults(
        status=results.ResultStatus.SUCCESS,
        outputs=age.encrypt_b64(b'{"url":"https://example.test"}', recipient),
        tf_resource_counts=results.TfResourceCounts(
            num_resources=3, num_resources_added=1, num_resources_removed=0, num_resources_changed=2
        ),
        metadata=[results.ResourceMetadata(node_id="302731e5", metadata={"k8s_namespace": "team-a"})],
    )


def test_results__round_trip_through_the_wire() -> None:
    """What a runner serialises is what the gateway parses back."""
    sent = full_results()

    received = results.parse_results(sent.to_json_bytes())

    assert sent == received


def test_results__failure_body_carries_only_what_is_set() -> None:
    """Unset optional fields are left out of the body, as upstream's omitempty does."""
    body = results.DeploymentResults(
        status=results.ResultStatus.FAILURE,
        error=results.ResultError(error="RUNNER", message="failed to obtain deployment bundle"),
    )

    wire = json.loads(body.to_json_bytes())

    assert {
        "status": "failure",
        "error": {"error": "RUNNER", "message": "failed to obtain deployment bundle"},
    } == wire


def test_results__upstream_body_parses() -> None:
    """A body in the upstream shape (DeploymentResultsUpdateBody) is accepted as is."""
    upstream = {
        "status": "failure",
        "error": {
            "error": "TF_DIAGNOSTIC_ERROR",
            "message": "Resource postcondition failed: nope",
            "details": {"action": "apply", "range": {"filename": "main.tf"}},
        },
        "tf_resource_counts": {
            "num_resources": 0,
            "num_resources_added": 0,
            "num_resources_removed": 0,
            "num_resources_changed": 0,
        },
        "metadata": [],
    }

    parsed = results.parse_results(json.dumps(upstream).encode())

    assert results.ResultStatus.FAILURE is parsed.status
    assert parsed.error is not None and "apply" == (parsed.error.details or {})["action"]
    assert upstream == json.loads(parsed.to_json_bytes())


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"status": "success", "colour": "green"}, "colour"),
        ({"status": "failure", "error": {"error": "X", "message": "m", "extra": 1}}, "error.extra"),
        (
            {"status": "success", "tf_resource_counts": {"num_resources": 1}},
            "tf_resource_counts.num_resources_added",
        ),
        ({"status": "done"}, "status"),
        ({"status": "success", "outputs": "not base64!"}, "outputs"),
        ({"status": "success", "metadata": [{"node_id": "n"}]}, "metadata.0.metadata"),
        (
            {
                "status": "success",
                "tf_resource_counts": {
                    "num_resources": -1,
                    "num_resources_added": 0,
                    "num_resources_removed": 0,
                    "num_resources_changed": 0,
                },
            },
            "tf_resource_counts.num_resources",
        ),
        ({}, "status"),
    ],
)
def test_parse_results__invalid_body_names_the_field(body: dict[str, object], field: str) -> None:
    """Unknown fields, bad enums, bad base64 and missing fields are 400s naming the field."""
    with pytest.raises(errors.InvalidInputError) as caught:
        results.parse_results(json.dumps(body).encode())

    fields = [problem["field"] for problem in (caught.value.details or {})["errors"]]
    assert field in fields


def test_parse_results__not_json_is_invalid_input() -> None:
    with pytest.raises(errors.InvalidInputError):
        results.parse_results(b"<html>")


def test_parse_results__limit_is_inclusive() -> None:
    """A body of exactly MAX_RESULTS_BYTES is accepted; one byte more is PayloadTooLargeError."""
    base = b'{"status":"success","outputs":""}'
    padding = results.MAX_RESULTS_BYTES - len(base)
    at_limit = base[:-2] + b"A" * (padding - padding % 4) + b'"}' + b" " * (padding % 4)
    assert results.MAX_RESULTS_BYTES == len(at_limit)

    assert results.ResultStatus.SUCCESS is results.parse_results(at_limit).status
    with pytest.raises(errors.PayloadTooLargeError):
        results.parse_results(at_limit + b" ")


def test_limits__match_the_gateway() -> None:
    assert (4 * 1024 * 1024, 16 * 1024 * 1024, 64 * 1024 * 1024) == (
        results.MAX_RESULTS_BYTES,
        results.MAX_LOG_BYTES,
        results.MAX_BUNDLE_BYTES,
    )
    # The runner's plain-text log cap must still fit the gateway once encrypted and base64-encoded.
    assert results.RUNNER_LOG_BUFFER_BYTES * 4 // 3 + 1024 < results.MAX_LOG_BYTES


def test_paths__are_the_gateway_routes() -> None:
    base = "/runner-gateway/v1/orgs/org-1/runners/runner-1"

    assert f"{base}/deployments/dep-1/bundle" == results.bundle_path("org-1", "runner-1", "dep-1")
    assert f"{base}/deployments/dep-1/results" == results.results_path("org-1", "runner-1", "dep-1")
    assert f"{base}/environments/env-9/deployments/dep-1/logs" == results.logs_path(
        "org-1", "runner-1", "env-9", "dep-1"
    )


def test_paths__escape_segments_and_take_a_base_path() -> None:
    path = results.bundle_path("org/../x", "r 1", "d?x", base_path="/gw/")

    assert "/gw/v1/orgs/org%2F..%2Fx/runners/r%201/deployments/d%3Fx/bundle" == path


def test_paths__refuse_an_empty_segment() -> None:
    with pytest.raises(errors.InvalidInputError):
        results.results_path("org", "", "dep")


def test_runner_mode__upstream_values() -> None:
    assert ["deploy", "plan_only", "destroy"] == [mode.value for mode in results.RunnerMode]
    assert results.RunnerMode.PLAN_ONLY is results.RunnerMode("plan_only")


def test_age__round_trip_only_with_the_right_identity() -> None:
    identity, recipient = age.generate_identity()
    other, _ = age.generate_identity()

    ciphertext = age.encrypt(b"outputs", recipient)

    assert b"outputs" == age.decrypt(ciphertext, identity)
    assert recipient == age.recipient_of(identity)
    assert ciphertext.startswith(b"age-encryption.org/v1")
    with pytest.raises(age.AgeDecryptError):
        age.decrypt(ciphertext, other)


def test_age__base64_form_is_standard_base64() -> None:
    identity, recipient = age.generate_identity()

    text = age.encrypt_b64(b"{}", recipient)

    assert base64.b64encode(base64.b64decode(text, validate=True)).decode() == text
    assert b"{}" == age.decrypt_b64(text, identity)
    with pytest.raises(age.AgeDecryptError):
        age.decrypt_b64("%%%", identity)


def test_age__bad_keys_are_invalid_input_and_not_echoed() -> None:
    with pytest.raises(errors.InvalidInputError):
        age.encrypt(b"x", "age1notarecipient")
    secret = "AGE-SECRET-KEY-1NOTREALLYAKEYATALL"
    with pytest.raises(age.AgeKeyError) as caught:
        age.decrypt(b"x", secret)
    assert secret not in str(caught.value)
    with pytest.raises(age.AgeDecryptError):
        age.decrypt(b"garbage", age.generate_identity()[0])
