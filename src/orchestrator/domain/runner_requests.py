"""Request bodies for creating and updating runners, and the update's PATCH semantics.

Create validates the whole runner, including the state storage's compatibility with the runner type. Update
is a PATCH whose ``runner_configuration`` is a JSON Merge Patch (RFC 7396) of the stored configuration:
objects merge key by key at every depth, ``null`` removes a key, lists and other values replace; ``type``
may be left out and, when given, must equal the runner's. A sensitive value the patch leaves out, or sends
back as ``"SECRET"``, keeps the stored value. The merged result is validated whole. (Upstream requires
``type`` and replaces top-level keys only, so a seed 000 snippet that sets only ``job.pod_template`` fails
there.) A ``state_storage_configuration`` replaces the stored one whole; the caller re-checks it with
:func:`check_compatibility`, knowing the stored storage.

Both read a configuration as users write it (:func:`read_runner_configuration`) and carry the warnings of
what was read leniently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final

import pydantic
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from orchestrator.domain.merge_patch import kept_from_target, merge_patch
from orchestrator.domain.runner_secrets import keep_existing_secrets
from orchestrator.domain.runner_types import (
    RunnerConfiguration,
    RunnerType,
    check_compatibility,
    parse_runner_configuration,
    read_runner_configuration,
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
    _warnings: list[str] = PrivateAttr(default_factory=list)

    @pydantic.model_validator(mode="wrap")
    @classmethod
    def _read_leniently(cls, data: Any, handler: pydantic.ModelWrapValidatorHandler[RunnerCreateBody]) -> Any:
        warnings: list[str] = []
        if isinstance(data, Mapping) and "runner_configuration" in data:
            configuration, warnings = read_runner_configuration(data["runner_configuration"])
            data = {**data, "runner_configuration": configuration}
        body = handler(data)
        body._warnings = warnings
        return body

    @property
    def warnings(self) -> list[str]:
        """What was read leniently, each naming its field (an ``env`` mapping read as a list)."""
        return list(self._warnings)

    @pydantic.model_validator(mode="after")
    def _compatible(self) -> RunnerCreateBody:
        try:
            check_compatibility(self.runner_configuration.type, self.state_storage_configuration.type)
        except InvalidInputError as exc:
            raise nested_error([(("state_storage_configuration", "type"), exc.message)]) from exc
        return self


class RunnerUpdateBody(BaseModel):
    """``PATCH /orgs/{org}/runners/{runner}``; absent fields stay as they are.

    ``runner_configuration`` is the raw merge patch, checked only for its ``type`` here;
    :func:`apply_runner_patch` merges and validates it.
    """

    model_config = _STRICT
    description: str | None = None
    runner_configuration: dict[str, Any] | None = None
    state_storage_configuration: StateStorageConfiguration | None = None

    @field_validator("runner_configuration")
    @classmethod
    def _known_type(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        kind = None if value is None else value.get("type")
        if kind is not None and (not isinstance(kind, str) or kind not in set(RunnerType)):
            message = f"unknown runner type '{kind}', must be one of {go_list(RunnerType)}"
            raise nested_error([(("type",), message)], value=kind)
        return value

    @pydantic.model_validator(mode="after")
    def _not_removed(self) -> RunnerUpdateBody:
        for name in ("runner_configuration", "state_storage_configuration"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise nested_error(
                    [((name,), "must not be null: a runner always has one; send the fields to change")]
                )
        return self


def _type_error(message: str) -> InvalidInputError:
    field = "runner_configuration.type"
    return InvalidInputError(
        f"{field}: {message}", details={"errors": [{"field": field, "message": message}]}
    )


#: Added to an error at a value the patch did not send: it comes from the stored configuration.
_KEPT_HINT: Final = (
    "kept from the stored configuration, which an update is merged onto (JSON Merge Patch, RFC 7396): "
    "send {name}: null to remove it"
)


def _with_kept_hints(
    exc: InvalidInputError, patch: Mapping[str, Any], merged: Mapping[str, Any], prefix: str
) -> InvalidInputError:
    """``exc`` with a hint at each error about a value the patch did not send: it was merged in from the
    stored configuration, and null removes it (switching ``connection.type`` leaves the old type's fields)."""
    errors = (exc.details or {}).get("errors")
    if not isinstance(errors, list) or not errors:
        return exc
    head = f"{prefix}."
    hinted: list[dict[str, str]] = []
    for error in errors:
        field, message = error.get("field", ""), error.get("message", "")
        path = _dotted_path(field[len(head) :]) if field.startswith(head) else None
        if path is not None and _present(merged, path) and kept_from_target(patch, path):
            message = f"{message}; {_KEPT_HINT.format(name=path[-1])}"
        hinted.append({"field": field, "message": message})
    first = hinted[0]
    line = f"{first['field']}: {first['message']}"
    if len(hinted) > 1:
        more = len(hinted) - 1
        line += f" (and {more} more error{'s' if more > 1 else ''})"
    return InvalidInputError(line, details={**(exc.details or {}), "errors": hinted})


def _present(data: Any, path: tuple[str | int, ...]) -> bool:
    for step in path:
        if isinstance(step, int) and isinstance(data, list) and step < len(data):
            data = data[step]
        elif isinstance(step, str) and isinstance(data, Mapping) and step in data:
            data = data[step]
        else:
            return False
    return True


def _dotted_path(field: str) -> tuple[str | int, ...] | None:
    """``job.pod_template.spec.containers[0].env`` as keys and indices; None for quoted keys."""
    path: list[str | int] = []
    for part in field.split("."):
        name, _, rest = part.partition("[")
        if '"' in part or not name:
            return None
        path.append(name)
        for index in filter(None, rest.replace("]", "").split("[")):
            if not index.isdigit():
                return None
            path.append(int(index))
    return tuple(path)


def apply_runner_patch(
    existing_type: str,
    existing_config: Mapping[str, Any],
    patch: Mapping[str, Any],
    *,
    stored_secrets: Mapping[str, str] | None = None,
    prefix: str = "runner_configuration",
) -> tuple[RunnerConfiguration, list[str]]:
    """Merge a PATCH ``runner_configuration`` onto the stored one (RFC 7396) and validate the result.

    ``existing_config`` may be the stored public form (with ``"SECRET"`` placeholders) when
    ``stored_secrets`` holds the values: a sensitive value the patch leaves out keeps the stored one, as
    does ``"SECRET"`` sent back. Answers the configuration and the warnings of what was read leniently;
    raises :class:`InvalidInputError` naming the field.
    """
    if "type" in patch and patch["type"] != existing_type:
        kind = patch["type"]
        if kind is None:
            raise _type_error(f"cannot be removed: leave it out, or give the runner's type '{existing_type}'")
        raise _type_error(f"the runner type cannot be changed from '{existing_type}' to '{kind}'")
    merged = merge_patch(existing_config, patch)
    merged["type"] = existing_type
    merged = keep_existing_secrets(merged, stored_secrets or {}, prefix=prefix)
    read, warnings = read_runner_configuration(merged, prefix=prefix)
    try:
        return parse_runner_configuration(read, prefix=prefix), warnings
    except InvalidInputError as exc:
        raise _with_kept_hints(exc, patch, read if isinstance(read, Mapping) else {}, prefix) from exc
