"""The module catalogue: resource types, module providers, modules, their versions and module rules.

A *resource type* names a kind of infrastructure (``postgres``, ``s3``). A *module* maps one resource type to
an OpenTofu module (a source address, or inline HCL) with its parameters, fixed inputs and providers. Every
change of a module's content is kept as an immutable *module version*. *Module rules* say which module
provisions a resource of a type in which environments (selection lives in ``module_rules``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import unquote, urlsplit
from uuid import UUID

from orchestrator.errors import InvalidInputError, PayloadTooLargeError

#: ``module_source`` of a module whose HCL is stored with it (``module_source_code``).
INLINE_SOURCE = "inline"
#: Upper bound of inline module code, in bytes of UTF-8 (upstream caps it at 10,000 characters).
MAX_INLINE_CODE_BYTES = 512 * 1024
#: The resource class of a resource or rule that names none.
DEFAULT_RESOURCE_CLASS = "default"
#: Parameter types a module may declare (upstream ModuleParamItem.type).
PARAM_TYPES = ("string", "number", "bool", "list", "map", "any")

# Input and parameter names become OpenTofu variable names (upstream validTerraformIdentifier).
_VARIABLE_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_-]*$")
#: Forced getters (``git::...``) a module source may name; ``file`` and any other are refused.
SOURCE_GETTERS = ("git", "hg", "s3", "gcs")
#: URL schemes a module source may use.
SOURCE_SCHEMES = ("https", "http", "ssh", "git", "oci")
_GETTER = re.compile(r"^([A-Za-z0-9+.-]+)::(.*)$", re.DOTALL)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# ``user@host:path``: git's scp-like address (what ``git@github.com:org/repo.git`` is).
_SCP_LIKE = re.compile(r"^[A-Za-z0-9._~-]+@[A-Za-z0-9.-]+:")


@dataclass(frozen=True, kw_only=True)
class ResourceType:
    org_id: str
    id: str
    description: str | None
    #: JSON schema of the outputs a module of this type provides.
    output_schema: dict[str, Any]
    #: False hides the type from developers' manifests (only modules' dependencies may use it).
    is_developer_accessible: bool
    built_in: bool
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, kw_only=True)
class ModuleProvider:
    """An OpenTofu provider configuration that modules map their provider names to."""

    org_id: str
    provider_type: str
    id: str
    description: str | None
    #: Registry coordinate, ``(hostname/)namespace/type``.
    source: str
    version_constraint: str
    #: As answered: ``"SECRET"`` for each credential (``domain.provider_secrets``); the compiler gets the
    #: whole configuration, opened from ``configuration_sealed``.
    configuration: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    #: The whole configuration, sealed with the server key; None in rows from before sealing.
    configuration_sealed: str | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        """``provider_type.id``, as a module's ``provider_mapping`` names it."""
        return f"{self.provider_type}.{self.id}"


@dataclass(frozen=True, kw_only=True)
class ModuleParam:
    type: str
    is_optional: bool = False
    description: str | None = None


@dataclass(frozen=True, kw_only=True)
class ResourceRequest:
    """A resource a module asks for: a dependency (provisioned first) or a co-provisioned resource."""

    type: str
    resource_class: str | None = None
    resource_id: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    #: Co-provisioned only: the resource waits for the current one.
    is_dependent_on_current: bool = False
    #: Co-provisioned only: whatever depends on the current resource also depends on this one.
    copy_dependents_from_current: bool = False


@dataclass(frozen=True, kw_only=True)
class ModuleContent:
    """Everything a module version snapshots."""

    description: str | None = None
    module_source: str
    module_source_code: str | None = None
    module_params: dict[str, ModuleParam] = field(default_factory=dict)
    module_inputs: dict[str, Any] = field(default_factory=dict)
    #: Provider name used inside the module -> ``provider_type.id`` of a module provider.
    provider_mapping: dict[str, str] = field(default_factory=dict)
    #: Alias -> resource provisioned before this one.
    dependencies: dict[str, ResourceRequest] = field(default_factory=dict)
    coprovisioned: tuple[ResourceRequest, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Module:
    org_id: str
    id: str
    uuid: UUID
    resource_type: str
    content: ModuleContent
    #: The version holding ``content``.
    version_id: UUID
    created_at: datetime
    #: When ``content`` became current (the version's creation).
    updated_at: datetime


@dataclass(frozen=True, kw_only=True)
class ModuleVersion:
    """An immutable snapshot of a module, written by each change of its content."""

    org_id: str
    module_id: str
    id: UUID
    resource_type: str
    content: ModuleContent
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class ModuleRule:
    """Use ``module_id`` for resources of its type and class (and id), in the matching environments.

    Immutable. Fields left None match anything; ``env_id`` needs ``project_id`` and excludes ``env_type_id``.
    """

    org_id: str
    id: UUID
    module_id: str
    #: The module's resource type, copied so that the match key is unique per type.
    resource_type: str
    resource_class: str
    resource_id: str | None
    project_id: str | None
    env_type_id: str | None
    env_id: str | None
    created_at: datetime


def check_module_source(source: str) -> None:
    """InvalidInputError naming ``module_source`` for a source that reads the disk of whatever runs the
    runner (a local runner runs on the server's host) instead of fetching a module.

    Allowed: ``inline``; registry addresses (``ns/name/system``, with a host, ``@version`` or ``//subdir``);
    scheme-less remote shorthands (``github.com/org/repo``, ``bucket.s3.amazonaws.com/key``); URLs of the
    schemes in :data:`SOURCE_SCHEMES`, with an optional forced getter of :data:`SOURCE_GETTERS`
    (``git::https://...``, ``s3::https://...``); git's ``git@host:path``; and ``./path`` inside the bundle.
    Refused: absolute paths, ``~``, any ``..`` segment (also percent-encoded), backslashes, ``file:`` anywhere
    (``file://``, ``git::file://``, a ``checksum=file:`` parameter), and any other getter or scheme.
    """
    if source == INLINE_SOURCE:
        return
    problem = _disk_problem(source) or _form_problem(source)
    if problem is not None:
        raise InvalidInputError(f"module_source: '{source}' {problem}")


def _disk_problem(source: str) -> str | None:
    """Why ``source`` would read local files, if it would (checked on the text and percent-decoded)."""
    if "\\" in source:
        return "contains a backslash"
    decoded = unquote(source)
    if "file:" in source.lower() or "file:" in decoded.lower():
        return "reads local files (file:); use a registry address, a git or https URL"
    if any(segment == ".." for segment in re.split(r"[/?&=]", decoded)):
        return "has a '..' path segment; module sources may not leave their directory"
    return None


def _form_problem(source: str) -> str | None:
    """Why ``source`` is none of the allowed forms, if it is not."""
    rest = source
    getter = _GETTER.match(source)
    if getter is not None:
        if getter[1].lower() not in SOURCE_GETTERS:
            return f"uses the getter '{getter[1]}::'; allowed: {', '.join(g + '::' for g in SOURCE_GETTERS)}"
        rest = getter[2]
        if not (_SCHEME.match(rest) or _SCP_LIKE.match(rest)):
            return f"needs a URL after '{getter[1]}::' (e.g. {getter[1]}::https://host/path)"
    if rest.startswith(("/", "~")) or re.match(r"^[A-Za-z]:[/\\]", rest):
        return "is an absolute local path; use a registry address, a git or https URL"
    if _SCP_LIKE.match(rest):
        return None
    scheme = _SCHEME.match(rest)
    if scheme is not None:
        name = scheme[1].lower()
        if name not in SOURCE_SCHEMES:
            return f"uses the scheme '{name}://'; allowed: {', '.join(SOURCE_SCHEMES)}"
        return None if urlsplit(rest).netloc else f"names no host after '{name}://'"
    if rest.startswith("."):
        return None if rest.startswith("./") else "is a relative path; a path in the bundle starts with './'"
    if not rest[:1].isalnum():
        return "is neither a registry address, a URL nor a path in the bundle"
    return None


def check_content(content: ModuleContent) -> None:
    """Raise InvalidInputError (naming the field) for content no version may hold.

    Field formats (identifier patterns, lengths) are the API schema's job; this checks what spans fields.
    """
    check_module_source(content.module_source)
    code = content.module_source_code
    if content.module_source == INLINE_SOURCE and code is None:
        raise InvalidInputError(f"module_source_code: required when module_source is '{INLINE_SOURCE}'")
    if content.module_source != INLINE_SOURCE and code is not None:
        raise InvalidInputError(f"module_source_code: only allowed when module_source is '{INLINE_SOURCE}'")
    if code is not None:
        if not code.strip():
            raise InvalidInputError("module_source_code: must not be empty")
        size = len(code.encode())
        if size > MAX_INLINE_CODE_BYTES:
            raise PayloadTooLargeError(
                f"module_source_code: {size} bytes of inline module code, over the limit of "
                f"{MAX_INLINE_CODE_BYTES}; use a git or registry module_source instead"
            )
    for name in content.module_params:
        if not _VARIABLE_NAME.match(name):
            raise InvalidInputError(f"module_params: '{name}' is not a valid variable name")
    for name in content.module_inputs:
        if not _VARIABLE_NAME.match(name):
            raise InvalidInputError(f"module_inputs: '{name}' is not a valid variable name")
    clashes = sorted(content.module_params.keys() & content.module_inputs.keys())
    if clashes:
        raise InvalidInputError(
            f"module_inputs: {', '.join(clashes)} also declared in module_params; a name is either "
            "a fixed input or a parameter"
        )


def referenced_types(resource_type: str, content: ModuleContent) -> list[str]:
    """Every resource type a module names: its own, its dependencies' and its co-provisioned resources'."""
    names = {resource_type}
    names.update(d.type for d in content.dependencies.values())
    names.update(c.type for c in content.coprovisioned)
    return sorted(names)


def referenced_providers(content: ModuleContent) -> list[tuple[str, str]]:
    """The ``(provider_type, id)`` pairs of a module's provider mapping."""
    pairs = set()
    for target in content.provider_mapping.values():
        provider_type, _, provider_id = target.partition(".")
        pairs.add((provider_type, provider_id))
    return sorted(pairs)


def mentions_type(content: ModuleContent, type_ids: Iterable[str]) -> bool:
    """True when a dependency or co-provisioned resource is of one of ``type_ids``."""
    wanted = set(type_ids)
    return any(d.type in wanted for d in content.dependencies.values()) or any(
        c.type in wanted for c in content.coprovisioned
    )
