"""The databases the tests run on (``PO_TEST_DATABASES``: sqlite, postgresql or both) and the migrated
PostgreSQL template each test's database is copied from (tests/conftest.py's ``postgres_server``)."""

from __future__ import annotations

import os

DATABASES = [d.strip() for d in os.environ.get("PO_TEST_DATABASES", "sqlite").split(",") if d.strip()]
TEMPLATE_DB = "po_template"
