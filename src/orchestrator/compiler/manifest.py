"""The deployment manifest: workloads with their resources and outputs, and shared resources.

Upstream's ``DeploymentManifest`` (data-plane API) with its limits, parsed strictly: unknown fields are
errors, and every error names its field under ``manifest.``. Names that become parts of Terraform
identifiers are checked here, so that the compiler can derive module and output names from them:

- workload names and shared aliases: upstream's ``^[a-z0-9][a-z0-9-]{0,61}[a-z0-9]$``; a workload name
  also names the workload's Terraform output, so it must start with a letter (Terraform refuses an
  output ``9lives``; upstream accepts the name and fails the run), and it never clashes with the
  metadata output ``platform_orchestrator_metadata`` (no ``_``);
- resource aliases in a workload: letters, digits, ``-``, and single ``_`` between them (no ``__``);
- workload output names: Terraform identifiers.

The deprecated ``variables`` of a workload are read as its ``outputs`` (both at once is an error).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

import pydantic
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.domain.validation import invalid_input, nested_error

MAX_WORKLOADS: Final = 100
MAX_RESOURCES_PER_WORKLOAD: Final = 100
MAX_SHARED: Final = 100
MAX_OUTPUTS_PER_WORKLOAD: Final = 100
MAX_PARAMS: Final = 20

TYPE_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,61}[A-Za-z0-9]$")
CLASS_PATTERN: Final = TYPE_PATTERN
ID_PATTERN: Final = re.compile(r"^(?=.{1,63}$)[a-z0-9]+(?:-+[a-z0-9]+)*(?:\.[a-z0-9]+(?:-+[a-z0-9]+)*)*$")
SHARED_ALIAS_PATTERN: Final = re.compile(r"^[a-z0-9][a-z0-9-]{0,61}[a-z0-9]$")
#: Upstream's pattern, starting with a letter: the name is a Terraform output name too.
WORKLOAD_NAME_PATTERN: Final = re.compile(r"^[a-z][a-z0-9-]{0,61}[a-z0-9]$")
RESOURCE_ALIAS_PATTERN: Final = re.compile(r"^(?=.{1,63}$)[A-Za-z0-9]+(?:(?:_|-+)[A-Za-z0-9]+)*$")
OUTPUT_NAME_PATTERN: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,99}$")

_STRICT: Final = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


def _matching(pattern: re.Pattern[str], message: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(message)
        return value

    return AfterValidator(check)


ResourceTypeName = Annotated[
    str, _matching(TYPE_PATTERN, "type must be a valid resource type of 2 to 63 letters, digits and '-'")
]
ResourceClass = Annotated[
    str,
    _matching(CLASS_PATTERN, "resource class must be a valid identifier of 2 to 63 letters, digits and '-'"),
]
ResourceId = Annotated[
    str,
    _matching(
        ID_PATTERN,
        "resource id must be one or more dot-separated parts of lowercase letters, digits and '-', "
        "at most 63 characters",
    ),
]


def _check_keys(value: dict[str, Any], pattern: re.Pattern[str], noun: str, rule: str) -> None:
    bad = [((key,), f"invalid {noun} '{key}': {rule}") for key in value if not pattern.match(key)]
    if bad:
        raise nested_error(bad)


def _check_size(value: dict[str, Any], limit: int, noun: str) -> None:
    if len(value) > limit:
        raise ValueError(f"at most {limit} {noun} are allowed, got {len(value)}")


def _named(limit: int, what: str, pattern: re.Pattern[str], noun: str, rule: str) -> AfterValidator:
    """A mapping of at most ``limit`` entries (``what``) whose keys match ``pattern``; the error for a key
    that does not names it as an invalid ``noun`` and says the ``rule``."""

    def check(value: dict[str, Any]) -> dict[str, Any]:
        _check_size(value, limit, what)
        _check_keys(value, pattern, noun, rule)
        return value

    return AfterValidator(check)


_RESOURCE_ALIASES: Final = _named(
    MAX_RESOURCES_PER_WORKLOAD,
    "resources per workload",
    RESOURCE_ALIAS_PATTERN,
    "resource alias",
    "use letters, digits, '-' and single '_' between them, at most 63 characters",
)
_OUTPUT_NAMES: Final = _named(
    MAX_OUTPUTS_PER_WORKLOAD,
    "outputs per workload",
    OUTPUT_NAME_PATTERN,
    "output name",
    "must start with a letter or '_' and hold only letters, digits, '_' and '-'",
)
_WORKLOAD_NAMES: Final = _named(
    MAX_WORKLOADS,
    "workloads",
    WORKLOAD_NAME_PATTERN,
    "workload name",
    "use 2 to 63 lowercase letters, digits and '-', starting with a letter (it names the "
    "workload's Terraform output) and ending with a letter or digit",
)
_SHARED_ALIASES: Final = _named(
    MAX_SHARED,
    "shared resources",
    SHARED_ALIAS_PATTERN,
    "shared resource alias",
    "use 2 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit",
)


class ManifestResource(BaseModel):
    """A resource to provision: its type, optional class (``default``) and id, and module params."""

    model_config = ConfigDict(**_STRICT, populate_by_name=True, serialize_by_alias=True)

    type: ResourceTypeName
    resource_class: ResourceClass | None = Field(default=None, alias="class")
    id: ResourceId | None = None
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("params")
    @classmethod
    def _params_size(cls, value: dict[str, Any]) -> dict[str, Any]:
        _check_size(value, MAX_PARAMS, "params")
        return value


class ManifestWorkload(BaseModel):
    model_config = _STRICT

    resources: Annotated[dict[str, ManifestResource], _RESOURCE_ALIASES] = Field(default_factory=dict)
    outputs: Annotated[dict[str, str], _OUTPUT_NAMES] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _variables_are_outputs(cls, data: Any) -> Any:
        if isinstance(data, dict) and "variables" in data:
            if data.get("outputs") is not None:
                raise nested_error(
                    [(("variables",), "variables and outputs cannot be used together, use outputs")]
                )
            data = {**data, "outputs": data["variables"]}
            del data["variables"]
        return data


class Manifest(BaseModel):
    """What a deployment asks for. Build it with :func:`parse_manifest`."""

    model_config = _STRICT

    workloads: Annotated[dict[str, ManifestWorkload], _WORKLOAD_NAMES]
    shared: Annotated[dict[str, ManifestResource], _SHARED_ALIASES] = Field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON data (``class`` spelled as such, unset class and id left out)."""
        return self.model_dump(mode="json", exclude_none=True)


def parse_manifest(data: object) -> Manifest:
    """Validate a manifest; :class:`InvalidInputError` naming the field under ``manifest.`` otherwise."""
    try:
        return Manifest.model_validate(data)
    except pydantic.ValidationError as exc:
        raise invalid_input(exc, prefix="manifest") from exc
