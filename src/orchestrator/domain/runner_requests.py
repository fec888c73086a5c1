"""Request bodies for creating and updating runners, and the update's PATCH semantics (upstream
``runners.go``).

Create validates the whole runner, including the state storage's compatibility with the runner type. Update
is a PATCH: ``runner_configuration`` must name its ``type``, which must equal the runner's; top-level keys
of the configuration are replaced, not merged (a patch ``job`` replaces the whole ``job``); the result is
validated again. A changed ``state_storage_configuration`` is re-checked with :func:`check_compatibility` by
the caller, which knows the stored storage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.domain.runner_secrets import keep_existing_secrets
from orchestrator.domain.runner_types import (
    RunnerConfiguration,
    RunnerType,
    check_compatibility,
    parse_runner_configuration,
)
from orchestrator.domain.state_storage import StateStorageConfiguration
from orchestrator.domain.validation import go_list, nested_error
from orchestrator.errors import InvalidInputError

__all__ = ["RUNNER_ID_PATTERN", "RunnerCreateBody", "RunnerUpdateBody", "apply_runner_patch"]

RUNNER_ID_PATTERN: Final = r"^[a-z][a-z0-9_-]+$"

#: Errors do not repeat the input in ``str(exc)``: configurations hold keys and tokens.
_STRICT: Final = ConfigDict(extra="forbid", hide_input_in_errors=True)


class RunnerCreateBody(BaseModel):
    """``POST /orgs/{org}/runners``."""

    model_config = _STRICT
    id: Annotated[str, Field(pattern=RUNNER_ID_PATTERN)]
    description: str | None = None
    runner_configuration: RunnerConfiguration
    state_storage_configuration: StateStorageConfiguration

    @pydantic.model_validator(mode="after")
    def _compatible(self) -> RunnerCreateBody:
        try:
            check_compatibility(self.runner_configuration.type, self.state_storage_configuration.type)
        except InvalidInputError as exc:
            raise nested_error([(("state_storage_configuration", "type"), exc.message)]) from exc
        return self


class RunnerUpdateBody(BaseModel):
    """``PATCH /orgs/{org}/runners/{runner}``; absent fields stay as they are.

    ``runner_configuration`` is the raw patch, checked only for its ``type`` here; :func:`apply_runner_patch`
    merges and validates it.
    """

    model_config = _STRICT
    description: str | None = None
    runner_configuration: dict[str, Any] | None = None
    state_storage_configuration: StateStorageConfiguration | None = None

    @field_validator("runner_configuration")
    @classmethod
    def _names_type(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        if "type" not in value:
            raise nested_error([(("type",), f"field required, must be one of {go_list(RunnerType)}")])
        kind = value["type"]
        if not isinstance(kind, str) or kind not in set(RunnerType):
            message = f"unknown runner type '{kind}', must be one of {go_list(RunnerType)}"
            raise nested_error([(("type",), message)], value=kind)
        return value


def _type_error(message: str) -> InvalidInputError:
    field = "runner_configuration.type"
    return InvalidInputError(
        f"{field}: {message}", details={"errors": [{"field": field, "message": message}]}
    )


def apply_runner_patch(
    existing_type: str,
    existing_config: Mapping[str, Any],
    patch: Mapping[str, Any],
    *,
    stored_secrets: Mapping[str, str] | None = None,
) -> RunnerConfiguration:
    """Merge a PATCH ``runner_configuration`` onto the stored one and validate the result.

    ``existing_config`` may be the stored public form (with ``"SECRET"`` placeholders) when
    ``stored_secrets`` holds the values; ``"SECRET"`` in the patch keeps a stored value as well. Raises
    :class:`InvalidInputError` naming the field.
    """
    if "type" not in patch:
        raise _type_error(f"field required, must be one of {go_list(RunnerType)}")
    if patch["type"] != existing_type:
        raise _type_error(f"the runner type cannot be changed from '{existing_type}' to '{patch['type']}'")
    merged = {**existing_config, **patch}
    merged = keep_existing_secrets(merged, stored_secrets or {})
    return parse_runner_configuration(merged)
