"""Runners (one resource and data source per runner type) and runner rules.

A runner resource's type implies its ``runner_configuration.type``. Its Terraform shape differs from the
API's in two places, and the functions here map both ways:

- ``state_storage_configuration`` is nested (``{type, kubernetes_configuration = {namespace}}``, the other
  types' blocks null) where the API is flat (``{type, namespace}``);
- ``pod_template`` is a JSON string (``jsonencode(...)``) where the API has an object; the user's text is
  kept while it means what the API answers.

The API answers sensitive values as ``"SECRET"``: the state keeps the value the configuration gave (read,
apply), and an import, which has no configuration, leaves them null, so the next plan shows them as a
change to apply. Members with a server-side default (``internal_ip``, ECS ``security_groups``...) declare
it, so leaving them out plans the default instead of a perpetual change. Updates are a JSON Merge Patch
(RFC 7396) from the stored configuration to the configured one: keys the configuration dropped are sent as
null, so they are removed, also inside a pod template.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from orchestrator.tfprovider.resource import SourceSpec, Spec
from orchestrator.tfprovider.schema import Attribute, a_bool, a_list, a_map, a_num, a_obj, a_str
from orchestrator.tfprovider.session import ApiProblem, Session
from orchestrator.tfprovider.values import JsonDict, drop_nulls, has_unknown, json_text, parse_json

#: What the API answers in place of a sensitive value.
MASKED: Final = "SECRET"

#: Fields of each state storage type's block (True: required), as the API has them flat.
STORAGE_FIELDS: Final[Mapping[str, Mapping[str, bool]]] = {
    "kubernetes": {"namespace": True},
    "s3": {"bucket": True, "path_prefix": False},
    "gcs": {"bucket": True, "path_prefix": False},
    "azurerm": {
        "storage_account_name": True,
        "container_name": True,
        "resource_group_name": False,
        "path_prefix": False,
    },
}
#: ``orchestrator`` (ours) keeps state in the control plane and has no block.
_K8S_STORAGE: Final = ("kubernetes", "s3", "gcs", "azurerm", "orchestrator")

# --- schema pieces ---------------------------------------------------------------------------------


def _required(description: str) -> Attribute:
    return a_str(required=True, description=description)


def _optional(description: str, **kwargs: Any) -> Attribute:
    return a_str(optional=True, description=description, **kwargs)


def _k8s_job() -> Attribute:
    return a_obj(
        {
            "namespace": _required("The namespace of the runner's Kubernetes Job."),
            "service_account": _required("The service account of the runner's Kubernetes Job."),
            "pod_template": _optional(
                "A PodTemplateSpec fragment merged onto the runner's pod, JSON encoded: jsonencode({...})."
            ),
        },
        required=True,
        description="The Kubernetes Job that runs each deployment.",
    )


def _aws_auth(**kwargs: Any) -> Attribute:
    return a_obj(
        {
            "role_arn": _required("The ARN of the IAM role the orchestrator assumes."),
            "session_name": _optional("The role session's name; default '{org_id}-{runner_id}'."),
            "sts_region": _optional("The region of the STS endpoint; default the cluster's (job's) region."),
        },
        description="Temporary AWS credentials by assuming an IAM role.",
        **kwargs,
    )


def _storage(types: tuple[str, ...]) -> Attribute:
    members: dict[str, Attribute] = {
        "type": _required(f"The state storage type: {', '.join(types)}."),
    }
    for kind in types:
        fields = STORAGE_FIELDS.get(kind)
        if fields is None:
            continue
        members[f"{kind}_configuration"] = a_obj(
            {
                name: a_str(required=True) if required else a_str(optional=True)
                for name, required in fields.items()
            },
            optional=True,
            description=f'The fields of {kind} state storage (only with type = "{kind}").',
        )
    return a_obj(members, required=True, description="Where the runner keeps Terraform/OpenTofu state.")


@dataclass(frozen=True)
class RunnerKind:
    """One runner type: its Terraform name, API type, configuration schema and state storage types."""

    name: str
    api_type: str
    title: str
    configuration: Mapping[str, Attribute]
    storage_types: tuple[str, ...] = _K8S_STORAGE
    #: Dotted paths of members the API fills with a default that depends on another member (``vm``
    #: ``connection.port`` is 22 for ssh only): answered as that value, they stay null while unset.
    elided_defaults: Mapping[str, object] = field(default_factory=dict)

    def resource_attributes(self) -> dict[str, Attribute]:
        return {
            "id": a_str(required=True, requires_replace=True, description=f"The {self.title} runner's id."),
            "description": _optional("What the runner is for."),
            "runner_configuration": a_obj(
                dict(self.configuration),
                required=True,
                description=f"The {self.title} runner's configuration.",
            ),
            "state_storage_configuration": _storage(self.storage_types),
        }


KUBERNETES = RunnerKind(
    name="kubernetes_runner",
    api_type="kubernetes",
    title="Kubernetes",
    configuration={
        "cluster": a_obj(
            {
                "cluster_data": a_obj(
                    {
                        "certificate_authority_data": _required("The cluster's CA certificates, base64 PEM."),
                        "server": _required("The cluster's API server URL."),
                        "proxy_url": _optional("A proxy to reach the API server through."),
                    },
                    required=True,
                ),
                "auth": a_obj(
                    {
                        "client_certificate_data": _optional(
                            "A client certificate, base64 PEM.", sensitive=True
                        ),
                        "client_key_data": _optional(
                            "The client certificate's key, base64 PEM.", sensitive=True
                        ),
                        "service_account_token": _optional("A service account token.", sensitive=True),
                    },
                    required=True,
                    description="A client certificate and key, or a service account token.",
                ),
            },
            required=True,
        ),
        "job": _k8s_job(),
    },
)

KUBERNETES_GKE = RunnerKind(
    name="kubernetes_gke_runner",
    api_type="kubernetes-gke",
    title="Kubernetes GKE",
    configuration={
        "cluster": a_obj(
            {
                "name": _required("The GKE cluster's name."),
                "project_id": _required("The GCP project of the cluster."),
                "location": _required("The cluster's location (region or zone)."),
                "internal_ip": a_bool(optional=True, default=False, description="Use the internal endpoint."),
                "proxy_url": _optional("A proxy to reach the API server through."),
                "auth": a_obj(
                    {
                        "gcp_audience": _required("The workload identity provider's audience."),
                        "gcp_service_account": _required("The GCP service account to impersonate."),
                    },
                    required=True,
                    sensitive=True,
                    description="Workload identity federation with GCP.",
                ),
            },
            required=True,
        ),
        "job": _k8s_job(),
    },
)

KUBERNETES_EKS = RunnerKind(
    name="kubernetes_eks_runner",
    api_type="kubernetes-eks",
    title="Kubernetes EKS",
    configuration={
        "cluster": a_obj(
            {
                "name": _required("The EKS cluster's name."),
                "region": _required("The cluster's AWS region."),
                "auth": _aws_auth(required=True),
            },
            required=True,
        ),
        "job": _k8s_job(),
    },
)

KUBERNETES_AKS = RunnerKind(
    name="kubernetes_aks_runner",
    api_type="kubernetes-aks",
    title="Kubernetes AKS",
    configuration={
        "cluster": a_obj(
            {
                "name": _required("The AKS cluster's name."),
                "resource_group": _required("The cluster's resource group."),
                "subscription_id": _required("The cluster's Azure subscription (a GUID)."),
                "cluster_data": a_obj(
                    {
                        "server": _required("The cluster's API server URL."),
                        "certificate_authority_data": _required("The cluster's CA certificates, base64 PEM."),
                    },
                    optional=True,
                    description="The API server and CA, for private clusters; else looked up through Azure.",
                ),
                "proxy_url": _optional("A proxy to reach the API server through."),
            },
            required=True,
        ),
        "auth": a_obj(
            {
                "tenant_id": _required("The Azure tenant (a GUID)."),
                "client_id": _required("The app registration trusting the orchestrator's tokens (a GUID)."),
            },
            required=True,
            description="Azure workload identity federation.",
        ),
        "job": _k8s_job(),
    },
)

KUBERNETES_AGENT = RunnerKind(
    name="kubernetes_agent_runner",
    api_type="kubernetes-agent",
    title="Kubernetes agent",
    configuration={
        "key": _required("The agent's Ed25519 public key, PEM (a public key: not a secret)."),
        "job": _k8s_job(),
    },
)

SERVERLESS_ECS = RunnerKind(
    name="serverless_ecs_runner",
    api_type="serverless-ecs",
    title="serverless ECS",
    storage_types=("s3", "orchestrator"),
    configuration={
        "auth": _aws_auth(required=True),
        "job": a_obj(
            {
                "region": _required("The AWS region."),
                "cluster": _required("The ECS cluster's name."),
                "subnets": a_list(a_str(), required=True, description="The task's subnets (1 to 16)."),
                "execution_role_arn": _required("The IAM role that launches the task."),
                "security_groups": a_list(
                    a_str(), optional=True, default=[], description="The task's security groups (up to 5)."
                ),
                "is_public_ip_enabled": a_bool(
                    optional=True, default=False, description="Give the task a public IP."
                ),
                "image": _optional("The runner image; default the orchestrator's runner image."),
                "task_role_arn": _optional("The IAM role the task runs as."),
                "environment": a_map(
                    a_str(), optional=True, default={}, description="Plain environment variables of the task."
                ),
                "secrets": a_map(
                    a_str(),
                    optional=True,
                    default={},
                    description="Variables from Secrets Manager or SSM: name to ARN (ARNs, not secrets).",
                ),
            },
            required=True,
        ),
    },
)

VM = RunnerKind(
    name="vm_runner",
    api_type="vm",
    title="vm",
    storage_types=("s3", "gcs", "azurerm", "orchestrator"),
    elided_defaults={"connection.port": 22},
    configuration={
        "connection": a_obj(
            {
                "type": _required("ssh, agent or local."),
                "host": _optional("ssh: the machine's host name or address."),
                "port": a_num(optional=True, description="ssh: the port; default 22."),
                "username": _optional("ssh: the user to log in as."),
                "host_public_key": _optional("ssh: the machine's host key, OpenSSH format."),
                "private_key": _optional("ssh: the private key to log in with.", sensitive=True),
                "key": _optional("agent: the agent's Ed25519 public key, PEM."),
            },
            required=True,
            description="How the orchestrator reaches the machine.",
        ),
        "job": a_obj(
            {
                "work_dir": _optional("Where runs get their working directories."),
                "runtime": _optional("process, docker or podman.", default="process"),
                "image": _optional("The runner image (docker and podman)."),
                "environment": a_map(a_str(), optional=True, default={}, description="Plain variables."),
                "secrets": a_map(
                    a_str(), optional=True, default={}, sensitive=True, description="Sensitive variables."
                ),
            },
            optional=True,
            default={"work_dir": None, "runtime": "process", "image": None, "environment": {}, "secrets": {}},
            description="How runs are started on the machine.",
        ),
    },
)

KINDS: Final = (
    KUBERNETES,
    KUBERNETES_GKE,
    KUBERNETES_EKS,
    KUBERNETES_AKS,
    KUBERNETES_AGENT,
    SERVERLESS_ECS,
    VM,
)

# --- mapping: Terraform <-> API ---------------------------------------------------------------------


def pod_template_text(prior: object, value: object) -> str | None:
    """A pod template's JSON text: the prior text while it means ``value``, else the text Terraform's
    ``jsonencode`` gives (keys sorted, no spaces, ``<>&`` escaped), so an import plans no change."""
    text = json_text(prior, value)
    if text is None or text == prior:
        return text
    compact = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return compact.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def storage_to_api(value: Mapping[str, Any]) -> JsonDict:
    """The API's flat state storage configuration from the provider's nested one; `ValueError` naming
    the attribute when a block does not match ``type`` or the type's required block is missing."""
    kind = value.get("type")
    flat: JsonDict = {"type": kind}
    for key, block in value.items():
        if key == "type" or block is None:
            continue
        if key != f"{kind}_configuration":
            raise ValueError(
                f"state_storage_configuration.{key} does not match type {kind!r}: "
                f"give {kind}_configuration, or change type"
            )
        flat.update(drop_nulls(dict(block)))
    if kind in STORAGE_FIELDS and len(flat) == 1:
        raise ValueError(f"state_storage_configuration.{kind}_configuration is required with type {kind!r}")
    return flat


def storage_from_api(value: Mapping[str, Any], types: tuple[str, ...]) -> JsonDict:
    """The provider's nested state storage configuration from the API's flat one."""
    kind = value.get("type")
    nested: JsonDict = {"type": kind}
    for other in types:
        fields = STORAGE_FIELDS.get(other)
        if fields is None:
            continue
        nested[f"{other}_configuration"] = (
            {name: value.get(name) for name in fields} if other == kind else None
        )
    return nested


def configuration_to_api(kind: RunnerKind, value: Mapping[str, Any]) -> JsonDict:
    """The API's ``runner_configuration``: nulls left out, ``pod_template`` decoded, the type added."""
    body: JsonDict = {"type": kind.api_type, **drop_nulls(dict(value))}
    job = body.get("job")
    if isinstance(job, dict) and "pod_template" in job:
        job["pod_template"] = parse_json("runner_configuration.job.pod_template", job["pod_template"])
    return body


def _from_api(
    schema: Mapping[str, Attribute],
    answer: Mapping[str, Any] | None,
    prior: Mapping[str, Any] | None,
    *,
    path: str,
    elided: Mapping[str, object],
    sensitive: bool = False,
) -> JsonDict:
    state: JsonDict = {}
    for name, attribute in schema.items():
        value = answer.get(name) if answer is not None else None
        before = prior.get(name) if isinstance(prior, Mapping) else None
        secret = sensitive or attribute.sensitive
        where = f"{path}.{name}" if path else name
        if attribute.object_type is not None:
            state[name] = (
                None
                if value is None
                else _from_api(
                    attribute.object_type.attributes,
                    value,
                    before if isinstance(before, Mapping) else None,
                    path=where,
                    elided=elided,
                    sensitive=secret,
                )
            )
        elif name == "pod_template":
            state[name] = pod_template_text(before, value)
        elif secret and isinstance(value, Mapping):
            known = before if isinstance(before, Mapping) else {}
            entries = {key: known.get(key) if item == MASKED else item for key, item in value.items()}
            state[name] = {key: item for key, item in entries.items() if item is not None}
        elif secret and value == MASKED:
            state[name] = before  # the API never gives it back: the configured value, or null on import
        elif where in elided and value == elided[where] and before is None:
            state[name] = None
        else:
            state[name] = value
    return state


def configuration_from_api(
    kind: RunnerKind, answer: Mapping[str, Any], prior: Mapping[str, Any] | None
) -> JsonDict:
    """The Terraform ``runner_configuration`` of an API answer, given the prior one (configuration or state):
    masked secrets and JSON texts taken from it, defaults that depend on other members left null."""
    return _from_api(kind.configuration, answer, prior, path="", elided=kind.elided_defaults)


def runner_state(kind: RunnerKind, found: Mapping[str, Any], prior: Mapping[str, Any]) -> JsonDict:
    before = prior.get("runner_configuration")
    return {
        "id": found["id"],
        "description": found.get("description"),
        "runner_configuration": configuration_from_api(
            kind, found.get("runner_configuration") or {}, before if isinstance(before, Mapping) else None
        ),
        "state_storage_configuration": storage_from_api(
            found.get("state_storage_configuration") or {}, kind.storage_types
        ),
    }


def merge_patch_between(old: Any, new: Any) -> Any:
    """The JSON Merge Patch (RFC 7396) that turns ``old`` into ``new``: dropped keys are null."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    patch: JsonDict = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = merge_patch_between(old[key], value)
    return patch


def _body(kind: RunnerKind, config: Mapping[str, Any]) -> tuple[JsonDict, JsonDict]:
    try:
        return (
            configuration_to_api(kind, config.get("runner_configuration") or {}),
            storage_to_api(config.get("state_storage_configuration") or {}),
        )
    except ValueError as exc:
        raise ApiProblem(f"invalid {kind.name} {config.get('id')!r}", str(exc)) from None


def _validate(kind: RunnerKind) -> Any:
    def validate(config: JsonDict) -> list[str]:
        if has_unknown(config):
            return []  # a value known only at apply: checked then
        problems: list[str] = []
        try:
            _body(kind, config)
        except ApiProblem as problem:
            problems.append(problem.detail)
        return problems

    return validate


# --- runner resources -------------------------------------------------------------------------------


def _reader(kind: RunnerKind) -> Any:
    async def read(session: Session, keys: JsonDict) -> JsonDict | None:
        runner_id = keys["id"]
        found = await session.find(
            f"read {kind.name} {runner_id!r}", session.client.get_runner, session.org, runner_id
        )
        if found is None:
            return None
        actual = (found.get("runner_configuration") or {}).get("type")
        if actual != kind.api_type:
            owner = next((other.name for other in KINDS if other.api_type == actual), None)
            hint = f": use platform-orchestrator_{owner}" if owner else ""
            raise ApiProblem(
                f"read {kind.name} {runner_id!r}: wrong runner type",
                f"runner {runner_id!r} is a {actual!r} runner, not {kind.api_type!r}{hint}",
            )
        return found

    return read


def _creator(kind: RunnerKind) -> Any:
    async def create(session: Session, config: JsonDict) -> JsonDict:
        configuration, storage = _body(kind, config)
        body = {
            "id": config["id"],
            "description": config.get("description"),
            "runner_configuration": configuration,
            "state_storage_configuration": storage,
        }
        return await session.call(
            f"create {kind.name} {config['id']!r}", session.client.create_runner, session.org, body
        )

    return create


def _updater(kind: RunnerKind) -> Any:
    read = _reader(kind)

    async def update(session: Session, config: JsonDict, prior: JsonDict) -> JsonDict:
        configuration, storage = _body(kind, config)
        runner_id = config["id"]
        current = await read(session, {"id": runner_id})
        if current is None:
            raise ApiProblem(f"update {kind.name} {runner_id!r}", f"runner {runner_id!r} no longer exists")
        patch = merge_patch_between(current.get("runner_configuration") or {}, configuration)
        body = {
            "description": config.get("description"),
            "runner_configuration": {**patch, "type": kind.api_type},
            "state_storage_configuration": storage,
        }
        return await session.call(
            f"update {kind.name} {runner_id!r}", session.client.update_runner, session.org, runner_id, body
        )

    return update


def _deleter(kind: RunnerKind) -> Any:
    async def delete(session: Session, state: JsonDict) -> None:
        await session.call(
            f"delete {kind.name} {state['id']!r}", session.client.delete_runner, session.org, state["id"]
        )

    return delete


def runner_spec(kind: RunnerKind) -> Spec:
    return Spec(
        name=kind.name,
        description=f"A {kind.title} runner (runner_configuration.type {kind.api_type}).",
        attributes=kind.resource_attributes(),
        create=_creator(kind),
        read=_reader(kind),
        update=_updater(kind),
        delete=_deleter(kind),
        to_state=lambda found, prior: runner_state(kind, found, prior),
        validate=_validate(kind),
    )


def computed(attribute: Attribute) -> Attribute:
    """``attribute`` as a data source's read-only one: computed at every depth, keeping ``sensitive``."""
    if attribute.object_type is not None:
        members = {name: computed(member) for name, member in attribute.object_type.attributes.items()}
        return a_obj(members, computed=True, sensitive=attribute.sensitive, description=attribute.description)
    return attribute.evolve(
        required=False, optional=False, computed=True, default=None, requires_replace=False
    )


def runner_source(kind: RunnerKind) -> SourceSpec:
    attributes = {name: computed(attribute) for name, attribute in kind.resource_attributes().items()}
    attributes["id"] = a_str(required=True, description="The runner's id.")
    return SourceSpec(
        name=kind.name,
        description=f"A {kind.title} runner, by id; sensitive values are null (the API never answers them).",
        attributes=attributes,
        read=_reader(kind),
        to_state=lambda found, keys: runner_state(kind, found, {}),
    )


# --- runner rules -----------------------------------------------------------------------------------


async def _create_rule(session: Session, config: JsonDict) -> JsonDict:
    body = drop_nulls({name: config.get(name) for name in ("runner_id", "project_id", "env_type_id")})
    return await session.call(
        f"create runner_rule for runner {config.get('runner_id')!r}",
        session.client.create_runner_rule,
        session.org,
        body,
    )


async def _read_rule(session: Session, keys: JsonDict) -> JsonDict | None:
    return await session.find(
        f"read runner_rule {keys['id']!r}", session.client.get_runner_rule, session.org, keys["id"]
    )


async def _delete_rule(session: Session, state: JsonDict) -> None:
    await session.call(
        f"delete runner_rule {state['id']!r}", session.client.delete_runner_rule, session.org, state["id"]
    )


def rule_state(found: Mapping[str, Any], prior: Mapping[str, Any]) -> JsonDict:
    """The API answers a rule's missing project and environment type as ``""``: null here."""
    return {
        "id": str(found["id"]),
        "runner_id": found.get("runner_id"),
        "project_id": found.get("project_id") or None,
        "env_type_id": found.get("env_type_id") or None,
    }


RUNNER_RULE = Spec(
    name="runner_rule",
    description="A runner rule: which runner the matching environments use. Immutable: a change replaces it.",
    attributes={
        "id": a_str(computed=True, description="The rule's id (a UUID)."),
        "runner_id": a_str(required=True, requires_replace=True, description="The runner the rule links."),
        "project_id": a_str(optional=True, requires_replace=True, description="The project it matches."),
        "env_type_id": a_str(
            optional=True, requires_replace=True, description="The environment type it matches."
        ),
    },
    create=_create_rule,
    read=_read_rule,
    delete=_delete_rule,
    to_state=rule_state,
)

RUNNER_RULE_SOURCE = SourceSpec(
    name="runner_rule",
    description="A runner rule, by id.",
    attributes={
        "id": a_str(required=True, description="The rule's id (a UUID)."),
        "runner_id": a_str(computed=True),
        "project_id": a_str(computed=True),
        "env_type_id": a_str(computed=True),
    },
    read=_read_rule,
    to_state=rule_state,
)

RESOURCES = (*(runner_spec(kind) for kind in KINDS), RUNNER_RULE)
DATA_SOURCES = (*(runner_source(kind) for kind in KINDS), RUNNER_RULE_SOURCE)
