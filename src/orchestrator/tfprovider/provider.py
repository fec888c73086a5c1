"""The provider block: its schema (`api_url`, `auth_token`, `org_id`, `octl_config_file`) and `configure`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.tfprovider import session
from orchestrator.tfprovider.schema import Attribute, a_str

NAME = "platform-orchestrator"

ATTRIBUTES: Mapping[str, Attribute] = {
    "api_url": a_str(optional=True, description="The orchestrator's API URL (PO_API_URL)."),
    "auth_token": a_str(optional=True, sensitive=True, description="An API token (PO_AUTH_TOKEN)."),
    "org_id": a_str(optional=True, description="The organization (PO_ORG_ID)."),
    "octl_config_file": a_str(optional=True, description="An octl config file to read unset settings from."),
}


def configure(block: Mapping[str, Any]) -> None:
    """Make the API session from the provider block (values unknown until apply count as unset), the
    environment and the octl config file; `session.ProviderConfigError` says what is missing."""
    known = {name: value for name, value in block.items() if isinstance(value, str)}
    session.configure(session.ProviderSettings.resolve(known, session.environ()))
