"""Whether a test whose tool (PostgreSQL, Terraform, helm, a run user, ...) is missing fails or skips."""

from __future__ import annotations

import os


def tools_required() -> bool:
    """True in CI (``CI``) or with ``PO_TEST_REQUIRE_TOOLS``: a missing tool fails the test instead of
    skipping it."""
    return bool(os.environ.get("CI") or os.environ.get("PO_TEST_REQUIRE_TOOLS"))
