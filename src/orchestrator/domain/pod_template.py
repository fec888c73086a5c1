"""The pod template of a Kubernetes runner job: a PodTemplateSpec fragment merged onto the default job pod.

Upstream rules (``CP:internal/api/runners_utils.go``): the fragment must convert to a PodTemplateSpec, must
not set ``metadata.namespace`` or ``spec.serviceAccountName``, every container needs a ``name``, and the
runner's container (``main``, or the legacy ``platform-orchestrator-runner``) must not set the environment
variables the runner receives from the orchestrator; ``RUNNER_GIT_SSH_KEYS`` must come from ``valueFrom``.

The structure check covers the fields whose shape matters to these rules and the common list/mapping fields
of a pod spec and a container, so that a wrong shape (``env`` given as a mapping) is refused with its exact
location. Everything else is passed on unchanged: the cluster validates the full pod on job creation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from orchestrator.domain.validation import Loc, nested_error

__all__ = [
    "GIT_SSH_KEYS_ENV",
    "RESERVED_ENV_VARS",
    "RUNNER_CONTAINER_NAMES",
    "check_pod_template",
    "decode_pod_template",
    "env_mappings_as_lists",
    "pod_template_problems",
    "reserved_env_problem",
]

#: Set by the orchestrator for every runner; a pod template or job environment must not set them.
#: The first six are upstream's; the rest are used by our runner.
RESERVED_ENV_VARS: Final = frozenset(
    {
        "ORG_ID",
        "DEPLOYMENT_ID",
        "MODE",
        "TOKEN",
        "ENCRYPTING_KEY",
        "PLATFORM_ORCHESTRATOR_BASE_URL",
        "RUNNER_ID",
        "DEPLOYMENT_ENV_UUID",
        "ENCRYPTING_LOGS_KEY",
        "RUNNER_GATEWAY_URL",
    }
)
#: Holds SSH keys for private module sources; must come from a secret, never a literal value.
GIT_SSH_KEYS_ENV: Final = "RUNNER_GIT_SSH_KEYS"
#: The runner's own container in the default pod, and its legacy name.
RUNNER_CONTAINER_NAMES: Final = ("main", "platform-orchestrator-runner")

_TEMPLATE_FIELDS: Final = frozenset({"metadata", "spec"})
_POD_LISTS: Final = frozenset(
    {
        "containers",
        "initContainers",
        "ephemeralContainers",
        "volumes",
        "imagePullSecrets",
        "tolerations",
        "hostAliases",
        "topologySpreadConstraints",
        "readinessGates",
        "schedulingGates",
        "resourceClaims",
    }
)
_POD_MAPPINGS: Final = frozenset({"securityContext", "affinity", "dnsConfig", "overhead", "os"})
_CONTAINER_LISTS: Final = frozenset(
    {"env", "envFrom", "ports", "volumeMounts", "volumeDevices", "resizePolicy"}
)
_CONTAINER_STRING_LISTS: Final = frozenset({"command", "args"})
_CONTAINER_MAPPINGS: Final = frozenset(
    {"resources", "securityContext", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle"}
)
_CONTAINER_STRINGS: Final = frozenset({"image", "imagePullPolicy", "workingDir"})


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def reserved_env_problem(name: str, *, literal: bool) -> str | None:
    """Why an environment variable must not be set this way, or None. ``literal``: a value, not a secret."""
    if name in RESERVED_ENV_VARS:
        return f"environment variable {name} is reserved: the orchestrator sets it for the runner"
    if name == GIT_SSH_KEYS_ENV and literal:
        return f"environment variable {name} must come from a secret (valueFrom), not a literal value"
    return None


class _Checker:
    def __init__(self) -> None:
        self.problems: list[tuple[Loc, str]] = []

    def add(self, loc: Loc, message: str) -> None:
        self.problems.append((loc, message))

    def mapping(self, value: object, loc: Loc) -> Mapping[str, Any] | None:
        if isinstance(value, Mapping):
            return value
        self.add(loc, f"must be a mapping, not {_kind(value)}")
        return None

    def items(self, value: object, loc: Loc, *, what: str = "mappings") -> list[Any] | None:
        if isinstance(value, list):
            return value
        if isinstance(value, Mapping) and loc[-1] == "env":
            self.add(
                loc,
                "must be a list of environment variables (each with name, and value or valueFrom), "
                "not a mapping",
            )
        else:
            self.add(loc, f"must be a list of {what}, not {_kind(value)}")
        return None

    def string_map(self, value: object, loc: Loc) -> None:
        mapping = self.mapping(value, loc)
        for key, item in (mapping or {}).items():
            if not isinstance(item, str):
                self.add((*loc, key), f"must be a string, not {_kind(item)}")

    def template(self, template: Mapping[str, Any]) -> None:
        for key in template:
            if key not in _TEMPLATE_FIELDS:
                self.add((key,), "unknown field: a pod template has only metadata and spec")
        if "metadata" in template:
            self.metadata(template["metadata"])
        if "spec" in template:
            self.spec(template["spec"])

    def metadata(self, value: object) -> None:
        metadata = self.mapping(value, ("metadata",))
        if metadata is None:
            return
        if "namespace" in metadata:
            self.add(("metadata", "namespace"), "must not be set: the job runs in job.namespace")
        for key in ("labels", "annotations"):
            if key in metadata:
                self.string_map(metadata[key], ("metadata", key))

    def spec(self, value: object) -> None:
        spec = self.mapping(value, ("spec",))
        if spec is None:
            return
        for key in ("serviceAccountName", "serviceAccount"):
            if key in spec:
                self.add(("spec", key), "must not be set: use job.service_account")
        seen: set[str] = set()
        for key, item in spec.items():
            loc: Loc = ("spec", key)
            if key in _POD_LISTS:
                entries = self.items(item, loc)
                for index, entry in enumerate(entries or []):
                    if key in ("containers", "initContainers", "ephemeralContainers"):
                        self.container(entry, (*loc, index), seen, runner=key == "containers")
                    else:
                        self.mapping(entry, (*loc, index))
            elif key in _POD_MAPPINGS:
                self.mapping(item, loc)
            elif key == "nodeSelector":
                self.string_map(item, loc)

    def container(self, value: object, loc: Loc, seen: set[str], *, runner: bool) -> None:
        container = self.mapping(value, loc)
        if container is None:
            return
        name = container.get("name")
        self.container_name(name, (*loc, "name"), seen)
        runs_runner = runner and name in RUNNER_CONTAINER_NAMES
        for key, item in container.items():
            if key in _CONTAINER_LISTS:
                entries = self.items(item, (*loc, key))
                for index, entry in enumerate(entries or []):
                    if key == "env":
                        self.env_var(entry, (*loc, key, index), runner=runs_runner)
                    else:
                        self.mapping(entry, (*loc, key, index))
            elif key in _CONTAINER_STRING_LISTS:
                entries = self.items(item, (*loc, key), what="strings")
                for index, entry in enumerate(entries or []):
                    if not isinstance(entry, str):
                        self.add((*loc, key, index), f"must be a string, not {_kind(entry)}")
            elif key in _CONTAINER_MAPPINGS:
                self.mapping(item, (*loc, key))
            elif key in _CONTAINER_STRINGS and not isinstance(item, str):
                self.add((*loc, key), f"must be a string, not {_kind(item)}")

    def container_name(self, name: object, loc: Loc, seen: set[str]) -> None:
        if name is None:
            self.add(loc, "field required: every container needs a name")
        elif not isinstance(name, str) or not name:
            self.add(loc, "must be a non-empty string")
        elif name in seen:
            self.add(loc, f"duplicate container name '{name}'")
        else:
            seen.add(name)

    def env_var(self, value: object, loc: Loc, *, runner: bool) -> None:
        var = self.mapping(value, loc)
        if var is None:
            return
        name = var.get("name")
        if not isinstance(name, str) or not name:
            message = "field required" if name is None else "must be a non-empty string"
            self.add((*loc, "name"), message)
            return
        if "value" in var and var["value"] is not None and not isinstance(var["value"], str):
            self.add((*loc, "value"), f"must be a string, not {_kind(var['value'])}")
        if "valueFrom" in var:
            self.mapping(var["valueFrom"], (*loc, "valueFrom"))
            if var.get("value"):
                self.add((*loc, "value"), "must not be set together with valueFrom")
        if runner:
            problem = reserved_env_problem(name, literal=var.get("valueFrom") is None)
            if problem is not None:
                self.add((*loc, "name") if name in RESERVED_ENV_VARS else loc, problem)


def env_mappings_as_lists(template: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[Loc, str]]]:
    """The template with each container's ``env`` that is one mapping with a ``name`` (one variable, as
    seed 001 prints it) turned into a list of that variable, and a warning for each at its location.

    Any other wrong shape is left for :func:`check_pod_template` to refuse.
    """
    result = dict(template)
    warnings: list[tuple[Loc, str]] = []
    spec = template.get("spec")
    if not isinstance(spec, Mapping):
        return result, warnings
    new_spec = dict(spec)
    for key in ("containers", "initContainers", "ephemeralContainers"):
        containers = spec.get(key)
        if not isinstance(containers, list):
            continue
        new_containers: list[Any] = []
        for index, container in enumerate(containers):
            env = container.get("env") if isinstance(container, Mapping) else None
            if isinstance(env, Mapping) and "name" in env:
                container = {**container, "env": [dict(env)]}
                name = env["name"] if isinstance(env["name"], str) else "..."
                message = (
                    f"a single mapping, read as a list of this one variable; write env as a list "
                    f"('- name: {name}')"
                )
                warnings.append((("spec", key, index, "env"), message))
            new_containers.append(container)
        new_spec[key] = new_containers
    result["spec"] = new_spec
    return result, warnings


def pod_template_problems(template: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """Every problem of a pod template, as (location inside the template, message)."""
    checker = _Checker()
    checker.template(template)
    return checker.problems


def decode_pod_template(value: object) -> object:
    """Accept a mapping, or the JSON-encoded string the Terraform provider sends (``jsonencode``)."""
    if not isinstance(value, str):
        return value
    if not value.strip():
        return None
    try:
        decoded: object = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"must be a mapping or a JSON-encoded object: {exc.msg} at position {exc.pos}"
        ) from exc
    if not isinstance(decoded, dict):
        raise ValueError(f"must be a mapping or a JSON-encoded object; the JSON holds {_kind(decoded)}")
    return decoded


def check_pod_template(template: dict[str, Any]) -> dict[str, Any]:
    """Pydantic after-validator: raise every problem at its location inside the template."""
    problems = pod_template_problems(template)
    if problems:
        raise nested_error(problems, value=template)
    return template
