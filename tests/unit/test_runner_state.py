"""Reading Terraform's "Error acquiring the state lock" output: whose lock it is, and when it was taken."""

from __future__ import annotations

from datetime import UTC, datetime

from orchestrator.runner import state

PLAIN = """
Error: Error acquiring the state lock

Error message: operation error S3: PutObject, https response error
StatusCode: 412, api error PreconditionFailed
Lock Info:
  ID:        7f3c1e5a-1b2c-4d5e-8f90-123456789abc
  Path:      bucket/env.tfstate
  Operation: OperationTypeApply
  Who:       runner@host-1
  Version:   1.15.5
  Created:   2026-12-01 07:50:35.875071436 +0000 UTC
  Info:
"""

# The same, as Terraform prints it with colour: escape codes and a box before each line.
COLOURED = "\n".join(f"\x1b[31m│\x1b[0m \x1b[0m{line}" for line in PLAIN.splitlines())


def test_parse_lock_info__plain_and_coloured_output() -> None:
    expected = state.LockInfo(
        id="7f3c1e5a-1b2c-4d5e-8f90-123456789abc",
        who="runner@host-1",
        operation="OperationTypeApply",
        created=datetime(2026, 12, 1, 7, 50, 35, 875071, tzinfo=UTC),
    )

    assert expected == state.parse_lock_info(PLAIN.splitlines())
    assert expected == state.parse_lock_info(COLOURED.splitlines())


def test_parse_lock_info__none_without_a_lock_info_block() -> None:
    assert state.parse_lock_info(["Error: Failed to save state", "  ID: not-in-a-lock-block"]) is None


def test_http_retry_environment__no_retries_for_zero_seconds() -> None:
    assert "0" == state.http_retry_environment(0)["TF_HTTP_RETRY_MAX"]
