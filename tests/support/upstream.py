"""The upstream OpenAPI documents: PO_TEST_UPSTREAM_OPENAPI_DIR, else ../shared/reference/openapi."""

from __future__ import annotations

import os
from pathlib import Path

UPSTREAM = Path(
    os.environ.get("PO_TEST_UPSTREAM_OPENAPI_DIR")
    or Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "openapi"
)
