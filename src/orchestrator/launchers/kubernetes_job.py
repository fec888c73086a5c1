"""The runner's Kubernetes Job, rendered as plain manifests: pure code, no I/O, no client library.

``render_job_manifest`` builds upstream's default Job (``DP:internal/kubernetes/{utils,client}.go``; see
upstream-notes §5) for one deployment and strategic-merges the runner's ``job.pod_template`` onto its pod
template. ``render_job_spec`` is the same Job's ``spec`` without ``TOKEN``: what a ``kubernetes-agent``
command carries for upstream's agent (the gateway adds ``TOKEN`` when it delivers the command, so the
stored command holds no token). ``render_token_secret`` builds the per-Job Secret that holds the
runner's ``TOKEN``: the Job's container reads it through ``secretKeyRef``, so the token never appears in
the Job or Pod objects (anyone allowed to read Jobs could otherwise read it). The Secret is owned by the
Job, so it goes when the Job goes.

Strategic merge (a subset of Kubernetes' ``strategicpatch``; the cluster would not do it for us, because the
Job is created, not patched):

- mappings merge recursively; ``null`` in the template removes a default key;
- lists that Kubernetes declares ``patchStrategy: merge`` on a PodTemplateSpec merge item by item on their
  ``patchMergeKey`` (see ``MERGE_KEYS``): ``containers``/``initContainers``/``ephemeralContainers``,
  ``volumes``, ``imagePullSecrets``, ``resourceClaims``, ``schedulingGates`` by ``name``; a container's
  ``env`` by ``name``, ``volumeMounts`` by ``mountPath``, ``volumeDevices`` by ``devicePath``, ``ports`` by
  ``containerPort``; ``hostAliases`` by ``ip``; ``topologySpreadConstraints`` by ``topologyKey``. Matching
  items merge recursively, new items are appended in the template's order;
- every other list (``args``, ``command``, ``tolerations``, ``envFrom``, ...) is replaced as a whole;
- the directives ``$patch: replace`` / ``$patch: delete`` (on a mapping or a list item) and ``$retainKeys``
  are honoured; other ``$`` keys are dropped.

A template container named ``platform-orchestrator-runner`` (the legacy name of the runner's container) is
merged into ``main``.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping
from typing import Any, Final

from orchestrator.domain.pod_template import RUNNER_CONTAINER_NAMES
from orchestrator.domain.runner_types import K8sRunnerJobConfig
from orchestrator.launchers import images
from orchestrator.protocol.commands import JOB_CONTAINER, TOKEN_ENV
from orchestrator.protocol.launch import RunSpec

__all__ = [
    "CODE_DIR",
    "CONTAINER_NAME",
    "DEFAULT_RUNNER_IMAGE",
    "MERGE_KEYS",
    "TOKEN_ENV",
    "job_labels",
    "job_name",
    "render_job_manifest",
    "render_job_spec",
    "render_token_secret",
    "strategic_merge",
    "token_secret_name",
]

#: Our runner image (``launchers/images.py``); a runner's pod template or the launcher may name another.
DEFAULT_RUNNER_IMAGE: Final = images.DEFAULT_RUNNER_IMAGE
CONTAINER_NAME: Final = JOB_CONTAINER
#: Where the runner unpacks the bundle (the image's default ``IAC_CODE_DIR``), an emptyDir named ``tofu``.
CODE_DIR: Final = "/opt/runner/tofu"
TTL_SECONDS_AFTER_FINISHED: Final = 3600

MANAGED_BY: Final = "platform-orchestrator"
DEPLOYMENT_LABEL: Final = "platform-orchestrator.io/deployment-id"
ORG_ANNOTATION: Final = "platform-orchestrator.io/org-id"
RUNNER_ANNOTATION: Final = "platform-orchestrator.io/runner-id"
ENV_ANNOTATION: Final = "platform-orchestrator.io/env-uuid"

#: ``patchMergeKey`` of the lists Kubernetes merges item by item, by their path inside a PodTemplateSpec
#: (``*`` stands for any item of the list before it). From ``k8s.io/api/core/v1/types.go``.
MERGE_KEYS: Final[Mapping[tuple[str, ...], str]] = {
    ("spec", "containers"): "name",
    ("spec", "initContainers"): "name",
    ("spec", "ephemeralContainers"): "name",
    ("spec", "volumes"): "name",
    ("spec", "imagePullSecrets"): "name",
    ("spec", "hostAliases"): "ip",
    ("spec", "topologySpreadConstraints"): "topologyKey",
    ("spec", "resourceClaims"): "name",
    ("spec", "schedulingGates"): "name",
    **{
        ("spec", containers, "*", field): key
        for containers in ("containers", "initContainers", "ephemeralContainers")
        for field, key in (
            ("env", "name"),
            ("volumeMounts", "mountPath"),
            ("volumeDevices", "devicePath"),
            ("ports", "containerPort"),
        )
    },
}

_PATCH: Final = "$patch"
_RETAIN_KEYS: Final = "$retainKeys"


def job_name(spec: RunSpec) -> str:
    """Upstream names the Job after the deployment (a UUID: a valid DNS label)."""
    return spec.deployment_id


def token_secret_name(spec: RunSpec) -> str:
    return f"{job_name(spec)}-token"


def job_labels(spec: RunSpec) -> dict[str, str]:
    """Labels of the Job, its pods and its Secret; ids longer than a label value allows go to annotations."""
    return {
        "app.kubernetes.io/name": "platform-orchestrator-runner",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        DEPLOYMENT_LABEL: spec.deployment_id,
    }


def _annotations(spec: RunSpec) -> dict[str, str]:
    return {ORG_ANNOTATION: spec.org_id, RUNNER_ANNOTATION: spec.runner_id, ENV_ANNOTATION: spec.env_uuid}


def _runner_env(spec: RunSpec, token_secret: str | None, *, token: bool) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    for name, value in spec.runner_environment().items():
        if name == TOKEN_ENV and not token:
            continue
        if name == TOKEN_ENV and token_secret is not None:
            env.append(
                {"name": name, "valueFrom": {"secretKeyRef": {"name": token_secret, "key": TOKEN_ENV}}}
            )
        else:
            env.append({"name": name, "value": value})
    return env


def _default_pod_template(
    spec: RunSpec, job: K8sRunnerJobConfig, image: str, token_secret: str | None, *, token: bool
) -> dict[str, Any]:
    return {
        "metadata": {"labels": job_labels(spec), "annotations": _annotations(spec)},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": job.service_account,
            "volumes": [{"name": "tofu", "emptyDir": {}}],
            "containers": [
                {
                    "name": CONTAINER_NAME,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["standard"],
                    "env": _runner_env(spec, token_secret, token=token),
                    "resources": {"requests": {"memory": "1Gi"}},
                    "volumeMounts": [{"name": "tofu", "mountPath": CODE_DIR}],
                    # Ours, not upstream's: a runner that fails before reporting leaves the tail of its
                    # output as the termination message, which the launcher quotes in the status.
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "runAsNonRoot": True,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                }
            ],
        },
    }


def _legacy_names_to_main(template: Mapping[str, Any]) -> dict[str, Any]:
    """A template written for the legacy container name patches ``main``."""
    result = copy.deepcopy(dict(template))
    spec = result.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("containers"), list):
        names = {c.get("name") for c in spec["containers"] if isinstance(c, Mapping)}
        if CONTAINER_NAME not in names:
            for container in spec["containers"]:
                if isinstance(container, dict) and container.get("name") in RUNNER_CONTAINER_NAMES:
                    container["name"] = CONTAINER_NAME
    return result


def render_job_manifest(
    spec: RunSpec,
    job_config: K8sRunnerJobConfig,
    image: str,
    *,
    token_secret: str | None = None,
    token: bool = True,
) -> dict[str, Any]:
    """The batch/v1 Job running ``spec``; ``token_secret``: the Secret holding ``TOKEN`` (else a value);
    ``token=False``: no ``TOKEN`` at all."""
    pod_template = _default_pod_template(spec, job_config, image, token_secret, token=token)
    if job_config.pod_template:
        pod_template = strategic_merge(pod_template, _legacy_names_to_main(job_config.pod_template))
    # The template must not move the pod: both are refused by validation, and enforced here again.
    pod_template.setdefault("metadata", {}).pop("namespace", None)
    pod_template.setdefault("spec", {})["serviceAccountName"] = job_config.service_account
    pod_template["spec"].pop("serviceAccount", None)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(spec),
            "namespace": job_config.namespace,
            "labels": job_labels(spec),
            "annotations": _annotations(spec),
        },
        "spec": {
            "ttlSecondsAfterFinished": TTL_SECONDS_AFTER_FINISHED,
            "backoffLimit": 0,
            "parallelism": 1,
            "template": pod_template,
        },
    }


def render_job_spec(spec: RunSpec, job_config: K8sRunnerJobConfig, image: str) -> dict[str, Any]:
    """The JobSpec (the Job's ``spec``) running ``spec``, without ``TOKEN``: the ``configuration`` of a
    ``kubernetes-agent`` command. Its pod template keeps the Job's labels and annotations."""
    spec_part: dict[str, Any] = render_job_manifest(spec, job_config, image, token=False)["spec"]
    return spec_part


def render_token_secret(spec: RunSpec, namespace: str, *, job_uid: str) -> dict[str, Any]:
    """The Secret holding the runner's ``TOKEN``, owned by its Job (garbage-collected with it)."""
    token = spec.token.get_secret_value().encode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": token_secret_name(spec),
            "namespace": namespace,
            "labels": job_labels(spec),
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": job_name(spec), "uid": job_uid}
            ],
        },
        "type": "Opaque",
        "data": {TOKEN_ENV: base64.b64encode(token).decode()},
    }


# --- strategic merge ------------------------------------------------------------------------------


def strategic_merge(original: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``patch`` (a PodTemplateSpec fragment) merged onto ``original``; neither is modified."""
    merged = _merge_map(original, patch, ())
    return merged if merged is not None else {}


def _merge_map(
    original: Mapping[str, Any], patch: Mapping[str, Any], path: tuple[str, ...]
) -> dict[str, Any] | None:
    directive = patch.get(_PATCH)
    if directive == "delete":
        return None
    if directive == "replace":
        replaced: dict[str, Any] = _strip(patch)
        return replaced
    result = copy.deepcopy(dict(original))
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            merged = _merge_map(result[key], value, (*path, key))
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, (*path, key))
        else:
            result[key] = _strip(value)
    retain = patch.get(_RETAIN_KEYS)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(original: list[Any], patch: list[Any], path: tuple[str, ...]) -> list[Any]:
    key = MERGE_KEYS.get(path)
    if key is None:
        return [_strip(item) for item in patch if not _is_directive(item)]
    result = copy.deepcopy(original)
    for item in patch:
        if not isinstance(item, Mapping):
            result.append(item)
            continue
        if item.get(_PATCH) == "replace" and len(item) == 1:
            # ``[{"$patch": "replace"}, ...]``: the list becomes the rest of the patch.
            return [_strip(i) for i in patch if not _is_directive(i)]
        index = next(
            (i for i, old in enumerate(result) if isinstance(old, Mapping) and old.get(key) == item.get(key)),
            None,
        )
        if index is None:
            if item.get(_PATCH) != "delete":
                result.append(_strip(item))
            continue
        merged = _merge_map(result[index], item, (*path, "*"))
        if merged is None:
            del result[index]
        else:
            result[index] = merged
    return result


def _is_directive(item: object) -> bool:
    return isinstance(item, Mapping) and set(item) == {_PATCH}


def _strip(value: Any) -> Any:
    """A copy of a patch value without its directives (new items are taken as they are)."""
    if isinstance(value, Mapping):
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip(v) for v in value if not _is_directive(v)]
    return value
