"""Where the cloud Kubernetes launchers send their token exchanges and cluster look-ups: the clouds' real
endpoints by default; the server's settings override them (tests, sovereign clouds).

Stdlib only, so the settings can name the defaults without the ``cloud`` extra installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "AKS_AAD_SERVER_APPLICATION",
    "AZURE_AUTHORITY_HOST",
    "AZURE_RESOURCE_MANAGER_URL",
    "GOOGLE_CONTAINER_API_URL",
    "GOOGLE_IAM_CREDENTIALS_URL",
    "GOOGLE_STS_URL",
    "AzureEndpoints",
    "GoogleEndpoints",
]

#: Google Security Token Service, its token exchange endpoint.
GOOGLE_STS_URL: Final = "https://sts.googleapis.com/v1/token"
#: The IAM Service Account Credentials API (``generateAccessToken``).
GOOGLE_IAM_CREDENTIALS_URL: Final = "https://iamcredentials.googleapis.com"
#: The GKE API (``projects.locations.clusters.get``).
GOOGLE_CONTAINER_API_URL: Final = "https://container.googleapis.com"
#: Microsoft Entra ID (Azure AD) of the public cloud.
AZURE_AUTHORITY_HOST: Final = "https://login.microsoftonline.com"
#: Azure Resource Manager of the public cloud.
AZURE_RESOURCE_MANAGER_URL: Final = "https://management.azure.com"
#: The application id of the AKS AAD server application, the audience of tokens AKS clusters accept (the
#: same in every Azure cloud).
AKS_AAD_SERVER_APPLICATION: Final = "6dae42f8-4368-4678-94ff-3960e28e3630"


@dataclass(frozen=True, kw_only=True)
class GoogleEndpoints:
    sts_url: str = GOOGLE_STS_URL
    iam_credentials_url: str = GOOGLE_IAM_CREDENTIALS_URL
    container_api_url: str = GOOGLE_CONTAINER_API_URL
    #: Per request to any of them.
    timeout_seconds: float = 30.0


@dataclass(frozen=True, kw_only=True)
class AzureEndpoints:
    authority_host: str = AZURE_AUTHORITY_HOST
    resource_manager_url: str = AZURE_RESOURCE_MANAGER_URL
    #: Per request to any of them.
    timeout_seconds: float = 30.0
