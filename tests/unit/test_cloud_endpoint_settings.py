"""The cloud endpoint settings of the GKE and AKS launchers: the clouds' own by default, https only."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from orchestrator.launchers import cloud_endpoints
from orchestrator.settings import ServerSettings


def settings(tmp_path: Path, **values: str) -> ServerSettings:
    return ServerSettings(data_dir=tmp_path / "data", local_runs_dir=tmp_path / "runs", **values)  # type: ignore[arg-type]


def test_cloud_endpoints__default_to_the_clouds(tmp_path: Path) -> None:
    made = settings(tmp_path)

    assert made.google_endpoints == cloud_endpoints.GoogleEndpoints()
    assert made.azure_endpoints == cloud_endpoints.AzureEndpoints()
    assert made.google_endpoints.sts_url == "https://sts.googleapis.com/v1/token"


def test_cloud_endpoints__overrides_without_trailing_slash(tmp_path: Path) -> None:
    made = settings(
        tmp_path,
        gcp_container_api_url="https://gke.test:8443/",
        azure_authority_host="https://login.test/",
        azure_resource_manager_url="https://arm.test",
    )

    assert made.google_endpoints.container_api_url == "https://gke.test:8443"
    assert made.azure_endpoints.authority_host == "https://login.test"
    assert made.azure_endpoints.resource_manager_url == "https://arm.test"


@pytest.mark.parametrize("field", ["gcp_sts_url", "azure_authority_host"])
def test_cloud_endpoints__plain_http_refused(tmp_path: Path, field: str) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        settings(tmp_path, **{field: "http://sts.test/v1/token"})

    assert f"PO_{field.upper()} must be an https URL" in str(caught.value)
