"""State storage configurations: where a runner keeps Terraform/OpenTofu state between runs.

The shape is the flat one of the API and the CLI (``{type: s3, bucket: ...}``). The Terraform provider's
nested shape (``{type: s3, s3_configuration: {bucket: ...}}``, the other types' blocks possibly null) is
accepted as well and read as the flat one, which is what is stored and answered. ``orchestrator`` keeps
state in the control plane itself and has no further fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter

from orchestrator.domain.validation import Loc, nested_error, register_discriminated_union

__all__ = [
    "STATE_STORAGE_CONFIGURATION_ADAPTER",
    "AzureRmStorageConfiguration",
    "GcsStorageConfiguration",
    "K8sStorageConfiguration",
    "OrchestratorStorageConfiguration",
    "S3StorageConfiguration",
    "StateStorageConfiguration",
    "StateStorageType",
    "flatten_state_storage",
]


class StateStorageType(StrEnum):
    """The Terraform backend: upstream's four, and ``orchestrator``, which is ours."""

    AZURERM = "azurerm"
    GCS = "gcs"
    KUBERNETES = "kubernetes"
    S3 = "s3"
    ORCHESTRATOR = "orchestrator"


_STRICT: Final = ConfigDict(extra="forbid")

#: DNS-1123 label: a Kubernetes namespace name.
DNS_LABEL_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: Upstream's bucket pattern for S3 and GCS (CPSPEC ``S3StorageConfiguration``).
BUCKET_PATTERN: Final = r"^[a-z0-9][a-z0-9-]*[a-z0-9]$"
PATH_PREFIX_PATTERN: Final = r"^[a-zA-Z0-9._-]+(?:/[a-zA-Z0-9._-]+)*/?$"

PathPrefix = Annotated[str, Field(pattern=PATH_PREFIX_PATTERN, max_length=1024)]


class K8sStorageConfiguration(BaseModel):
    """State in Kubernetes secrets of a namespace in the runner's cluster (in-cluster config)."""

    model_config = _STRICT
    type: Literal["kubernetes"] = "kubernetes"
    namespace: Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]


class S3StorageConfiguration(BaseModel):
    model_config = _STRICT
    type: Literal["s3"] = "s3"
    bucket: Annotated[str, Field(pattern=BUCKET_PATTERN, min_length=3, max_length=63)]
    path_prefix: PathPrefix | None = None


class GcsStorageConfiguration(BaseModel):
    model_config = _STRICT
    type: Literal["gcs"] = "gcs"
    bucket: Annotated[str, Field(pattern=BUCKET_PATTERN, min_length=3, max_length=63)]
    path_prefix: PathPrefix | None = None


class AzureRmStorageConfiguration(BaseModel):
    model_config = _STRICT
    type: Literal["azurerm"] = "azurerm"
    storage_account_name: Annotated[str, Field(pattern=r"^[a-z0-9]{3,24}$")]
    container_name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")]
    resource_group_name: Annotated[str, Field(min_length=1, max_length=90)] | None = None
    path_prefix: PathPrefix | None = None


class OrchestratorStorageConfiguration(BaseModel):
    """State kept by the orchestrator itself; works with every runner type (ours; upstream has no such
    type)."""

    model_config = _STRICT
    type: Literal["orchestrator"] = "orchestrator"


#: The Terraform provider's nested blocks, one per storage type.
_NESTED_KEYS: Final = {f"{kind.value}_configuration": kind.value for kind in StateStorageType}


def flatten_state_storage(value: object) -> object:
    """The flat shape of a state storage configuration given in the Terraform provider's nested shape
    (``{type: kubernetes, kubernetes_configuration: {namespace: ...}}``); anything else unchanged.

    The block must be the one of ``type``; the other types' blocks may be present as null, as the provider
    sends them. A field given both in the block and beside it is refused, naming it.
    """
    if not isinstance(value, Mapping) or not any(key in _NESTED_KEYS for key in value):
        return value
    kind = value.get("type")
    flat: dict[str, Any] = {key: item for key, item in value.items() if key not in _NESTED_KEYS}
    problems: list[tuple[Loc, str]] = []
    for key, block in value.items():
        if key not in _NESTED_KEYS or block is None:
            continue
        if _NESTED_KEYS[key] != kind:
            problems.append(((key,), f"does not match type '{kind}': give the block of that type, or none"))
        elif not isinstance(block, Mapping):
            problems.append(((key,), "must be a mapping of the storage's fields"))
        else:
            for name, item in block.items():
                if name in flat and flat[name] != item:
                    problems.append(
                        ((key, name), f"also given as state_storage_configuration.{name}; give one")
                    )
                flat[name] = item
    if problems:
        raise nested_error(problems)
    return flat


StateStorageConfiguration = Annotated[
    Annotated[
        K8sStorageConfiguration
        | S3StorageConfiguration
        | GcsStorageConfiguration
        | AzureRmStorageConfiguration
        | OrchestratorStorageConfiguration,
        Field(discriminator="type"),
    ],
    BeforeValidator(flatten_state_storage),
]

STATE_STORAGE_CONFIGURATION_ADAPTER: Final[TypeAdapter[StateStorageConfiguration]] = TypeAdapter(
    StateStorageConfiguration
)

register_discriminated_union(
    "state storage type", (t.value for t in StateStorageType), fields=("state_storage_configuration",)
)
