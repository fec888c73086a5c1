"""The provider itself: its schema (`api_url`, `auth_token`, `org_id`, `octl_config_file`) and `configure`."""

from __future__ import annotations

from typing import Any

from pyvider.exceptions import ProviderConfigurationError
from pyvider.providers import BaseProvider, ProviderMetadata
from pyvider.schema import PvsSchema, a_str, s_provider

from orchestrator.tfprovider import session
from orchestrator.tfprovider.values import attrs_class, native

NAME = "platform-orchestrator"


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("platform-orchestrator")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without metadata
        return "0.0.0"


def provider_schema() -> PvsSchema:
    return s_provider(
        {
            "api_url": a_str(optional=True, description="The orchestrator's API URL (PO_API_URL)."),
            "auth_token": a_str(optional=True, sensitive=True, description="An API token (PO_AUTH_TOKEN)."),
            "org_id": a_str(optional=True, description="The organization (PO_ORG_ID)."),
            "octl_config_file": a_str(
                optional=True, description="An octl config file to read unset settings from."
            ),
        }
    )


class PlatformOrchestratorProvider(BaseProvider):
    """Configures the one API session every resource and data source uses."""

    def __init__(self) -> None:
        super().__init__(metadata=ProviderMetadata(name=NAME, version=version()))

    async def setup(self) -> None:
        await super().setup()
        self._final_schema = provider_schema()
        self.config_class = attrs_class("ProviderConfig", self._final_schema.block.attributes)

    async def configure(self, config: Any) -> None:
        await super().configure(config)
        block = native(config) or {}
        try:
            session.configure(session.ProviderSettings.resolve(block, session.environ()))
        except session.ProviderConfigError as exc:
            # pyvider turns an exception here into an error diagnostic with this message.
            raise ProviderConfigurationError(f"platform-orchestrator provider: {exc}") from None
