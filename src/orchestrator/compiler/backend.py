"""The ``backend`` block of the root module: where the runner keeps the environment's state.

The state is keyed by the environment's UUID (``E``), not its id, so a deleted and re-created environment
starts afresh (upstream ``DP:internal/graphs/tofu.go:writeStateStorageBlock``):

==============  ==========================================================================================
``kubernetes``  ``secret_suffix = E``, ``namespace``, ``in_cluster_config = true`` (the Job's account)
``s3``          ``bucket``, ``key = "[prefix/]E.tfstate"``
``gcs``         ``bucket``, ``prefix = "[prefix/]E"``
``azurerm``     ``resource_group_name`` (if set), ``storage_account_name``, ``container_name``,
                ``key = "[prefix/]E/terraform.tfstate"``
``orchestrator`` Terraform's ``http`` backend at the orchestrator's state URL for the environment, locking
                with ``LOCK``/``UNLOCK`` on ``<url>/lock``
==============  ==========================================================================================

No credentials are ever written: the cloud backends take theirs from the runner's environment, and the
``http`` backend from ``TF_HTTP_USERNAME``/``TF_HTTP_PASSWORD``, which the runner sets.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any, assert_never
from urllib.parse import urlsplit
from uuid import UUID

import pydantic

from orchestrator.compiler import hcl
from orchestrator.domain.state_storage import (
    STATE_STORAGE_CONFIGURATION_ADAPTER,
    AzureRmStorageConfiguration,
    GcsStorageConfiguration,
    K8sStorageConfiguration,
    OrchestratorStorageConfiguration,
    S3StorageConfiguration,
    StateStorageType,
)
from orchestrator.domain.validation import invalid_input
from orchestrator.errors import InvalidInputError


def _join(prefix: str | None, name: str) -> str:
    # As Go's path.Join: a trailing "/" or "./" in the prefix does not double up.
    return posixpath.normpath(posixpath.join(prefix, name)) if prefix else name


def _string(name: str, value: str) -> hcl.Attr:
    return hcl.Attr(name, hcl.Raw(hcl.quote(value)))


def _check_url(url: str | None) -> str:
    if not url:
        raise InvalidInputError("the orchestrator state storage needs the orchestrator's state URL")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidInputError(f"orchestrator state URL {url!r} is not an http(s) URL")
    if parts.username is not None or parts.password is not None:
        raise InvalidInputError("the orchestrator state URL must not hold credentials")
    return url.rstrip("/")


def render_backend(
    state_type: str,
    state_configuration: Mapping[str, Any],
    *,
    env_uuid: UUID | str,
    orchestrator_state_url: str | None = None,
) -> str:
    """The ``backend "<type>" { ... }`` block for a runner's state storage, keyed by ``env_uuid``.

    ``state_configuration`` is the flat API shape, with or without its ``type``. ``orchestrator_state_url``
    is needed for the ``orchestrator`` type only: the environment's state endpoint, without credentials.
    """
    try:
        config = STATE_STORAGE_CONFIGURATION_ADAPTER.validate_python(
            {**state_configuration, "type": state_type}
        )
    except pydantic.ValidationError as exc:
        raise invalid_input(exc, prefix="state_storage_configuration") from exc
    env = str(UUID(str(env_uuid)))
    match config:
        case K8sStorageConfiguration():
            block = hcl.Block(
                "backend",
                (StateStorageType.KUBERNETES.value,),
                (
                    _string("secret_suffix", env),
                    _string("namespace", config.namespace),
                    hcl.Attr("in_cluster_config", hcl.Raw("true")),
                ),
            )
        case S3StorageConfiguration():
            block = hcl.Block(
                "backend",
                (StateStorageType.S3.value,),
                (
                    _string("bucket", config.bucket),
                    _string("key", _join(config.path_prefix, f"{env}.tfstate")),
                ),
            )
        case GcsStorageConfiguration():
            block = hcl.Block(
                "backend",
                (StateStorageType.GCS.value,),
                (_string("bucket", config.bucket), _string("prefix", _join(config.path_prefix, env))),
            )
        case AzureRmStorageConfiguration():
            attributes = (
                [_string("resource_group_name", config.resource_group_name)]
                if config.resource_group_name
                else []
            )
            attributes += [
                _string("storage_account_name", config.storage_account_name),
                _string("container_name", config.container_name),
                _string("key", _join(_join(config.path_prefix, env), "terraform.tfstate")),
            ]
            block = hcl.Block("backend", (StateStorageType.AZURERM.value,), tuple(attributes))
        case OrchestratorStorageConfiguration():
            url = _check_url(orchestrator_state_url)
            block = hcl.Block(
                "backend",
                ("http",),
                (
                    _string("address", url),
                    _string("lock_address", f"{url}/lock"),
                    _string("unlock_address", f"{url}/lock"),
                    _string("lock_method", "LOCK"),
                    _string("unlock_method", "UNLOCK"),
                ),
            )
        case _:  # pragma: no cover - the adapter only yields the types above
            assert_never(config)
    return hcl.render([block])
