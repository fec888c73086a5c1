"""The runner's Job manifest: upstream's default spec, the pod template's strategic merge, the token Secret.

Every manifest a test renders is also checked with ``kubernetes-validate --strict`` (the upstream OpenAPI
schemas, unknown fields refused) for the newest Kubernetes it ships and for 1.30.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version
from pydantic import SecretStr

from orchestrator.domain.runner_types import K8sRunnerJobConfig, RunnerType, parse_runner_configuration
from orchestrator.launchers.kubernetes_job import (
    CODE_DIR,
    DEFAULT_RUNNER_IMAGE,
    render_job_manifest,
    render_job_spec,
    render_token_secret,
    strategic_merge,
    token_secret_name,
)
from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.results import RunnerMode

DATA = Path(__file__).resolve().parent.parent / "data" / "runners"
K8S_TYPES = {t.value for t in RunnerType} - {"serverless-ecs", "vm"}
KUBERNETES_VERSIONS = (latest_version(), "1.30.0")
TOKEN = "po-deployment-token-secret-value"
IMAGE = "registry.example.com/runner:1.2.3"


def make_spec(**changes: Any) -> RunSpec:
    values: dict[str, Any] = {
        "org_id": "acme",
        "runner_id": "my-runner",
        "deployment_id": "8d2f3c9e-5b1a-4f7e-9c3d-2a1b0c9d8e7f",
        "env_uuid": "0b6c1a2e-3d4f-4a5b-8c6d-7e8f9a0b1c2d",
        "mode": RunnerMode.DEPLOY,
        "token": SecretStr(TOKEN),
        "gateway_url": "https://orchestrator.example.com",
        "encrypting_key": "age1examplerecipient",
        "runner_configuration": {},
        **changes,
    }
    return RunSpec(**values)


def job_config(pod_template: dict[str, Any] | None = None) -> K8sRunnerJobConfig:
    return K8sRunnerJobConfig(namespace="runners", service_account="runner-sa", pod_template=pod_template)


def assert_valid(manifest: dict[str, Any]) -> None:
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)


def render(pod_template: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    manifest = render_job_manifest(make_spec(), job_config(pod_template), IMAGE, **kwargs)
    assert_valid(manifest)
    return manifest


def pod(manifest: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return spec


def container(manifest: dict[str, Any], name: str = "main") -> dict[str, Any]:
    return next(c for c in pod(manifest)["containers"] if c["name"] == name)


def env(manifest: dict[str, Any], name: str = "main") -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container(manifest, name)["env"]}


def runner_examples() -> list[str]:
    names = []
    for path in sorted(DATA.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if data["runner_configuration"]["type"] in K8S_TYPES:
            names.append(path.name)
    return names


# --- the default Job ----------------------------------------------------------------------------------


def test_render_job_manifest__upstream_default_spec() -> None:
    """Without a pod template the Job is upstream's default (§5), named after the deployment."""
    manifest = render()

    assert manifest["apiVersion"] == "batch/v1" and manifest["kind"] == "Job"
    assert manifest["metadata"]["name"] == "8d2f3c9e-5b1a-4f7e-9c3d-2a1b0c9d8e7f"
    assert manifest["metadata"]["namespace"] == "runners"
    assert {k: manifest["spec"][k] for k in ("ttlSecondsAfterFinished", "backoffLimit", "parallelism")} == {
        "ttlSecondsAfterFinished": 3600,
        "backoffLimit": 0,
        "parallelism": 1,
    }
    assert pod(manifest)["restartPolicy"] == "Never"
    assert pod(manifest)["serviceAccountName"] == "runner-sa"
    assert pod(manifest)["volumes"] == [{"name": "tofu", "emptyDir": {}}]
    main = container(manifest)
    assert [c["name"] for c in pod(manifest)["containers"]] == ["main"]
    assert main["image"] == IMAGE
    assert main["args"] == ["standard"]
    assert main["imagePullPolicy"] == "IfNotPresent"
    assert main["resources"] == {"requests": {"memory": "1Gi"}}
    assert main["volumeMounts"] == [{"name": "tofu", "mountPath": CODE_DIR}]
    assert main["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_render_job_manifest__runner_environment() -> None:
    """The container gets exactly the runner's upstream environment, in ``runner_environment`` order."""
    manifest = render()

    assert [e["name"] for e in container(manifest)["env"]] == list(make_spec().runner_environment())
    assert env(manifest)["DEPLOYMENT_ID"] == {"name": "DEPLOYMENT_ID", "value": make_spec().deployment_id}
    assert env(manifest)["RUNNER_GATEWAY_URL"]["value"] == "https://orchestrator.example.com"
    assert env(manifest)["MODE"]["value"] == "deploy"


def test_render_job_manifest__token_from_secret() -> None:
    """With a token Secret, TOKEN is a ``secretKeyRef`` and its value appears nowhere in the Job."""
    manifest = render(token_secret="the-secret")

    assert env(manifest)["TOKEN"] == {
        "name": "TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "the-secret", "key": "TOKEN"}},
    }
    assert TOKEN not in json.dumps(manifest)


def test_render_job_manifest__token_as_value_without_secret() -> None:
    manifest = render()

    assert env(manifest)["TOKEN"] == {"name": "TOKEN", "value": TOKEN}


def test_render_job_manifest__ids_in_labels_and_annotations() -> None:
    """The deployment id labels Job and pods (selectable); org, runner and env ids are annotations."""
    manifest = render()

    for metadata in (manifest["metadata"], manifest["spec"]["template"]["metadata"]):
        assert metadata["labels"]["platform-orchestrator.io/deployment-id"] == make_spec().deployment_id
        assert metadata["labels"]["app.kubernetes.io/managed-by"] == "platform-orchestrator"
        assert metadata["annotations"]["platform-orchestrator.io/org-id"] == "acme"
        assert metadata["annotations"]["platform-orchestrator.io/runner-id"] == "my-runner"


def test_render_job_manifest__default_image() -> None:
    manifest = render_job_manifest(make_spec(), job_config(), DEFAULT_RUNNER_IMAGE)

    assert container(manifest)["image"] == DEFAULT_RUNNER_IMAGE


def test_render_token_secret__owned_by_the_job() -> None:
    """The Secret holds TOKEN (base64) and names the Job as owner, so it is garbage-collected with it."""
    secret = render_token_secret(make_spec(), "runners", job_uid="1234-uid")
    assert_valid(secret)

    assert secret["metadata"]["name"] == token_secret_name(make_spec())
    assert secret["metadata"]["namespace"] == "runners"
    assert base64.b64decode(secret["data"]["TOKEN"]).decode() == TOKEN
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": make_spec().deployment_id, "uid": "1234-uid"}
    ]


# --- the pod template -----------------------------------------------------------------------------


@pytest.mark.parametrize("example", runner_examples())
@pytest.mark.parametrize("token_secret", [None, "token"])
def test_render_job_manifest__runner_examples_are_valid(example: str, token_secret: str | None) -> None:
    """Every Kubernetes runner example renders a Job the upstream schemas accept (strict)."""
    data = yaml.safe_load((DATA / example).read_text())
    config = parse_runner_configuration(data["runner_configuration"])
    job = config.job
    assert isinstance(job, K8sRunnerJobConfig)

    manifest = render_job_manifest(make_spec(), job, IMAGE, token_secret=token_secret)

    assert_valid(manifest)
    assert manifest["metadata"]["namespace"] == job.namespace
    assert pod(manifest)["serviceAccountName"] == job.service_account


def test_render_job_manifest__seed000_custom_image() -> None:
    """Seed 000: the template pins the image and adds an image pull secret."""
    data = yaml.safe_load((DATA / "seed000-custom-image.yaml").read_text())
    manifest = render(data["runner_configuration"]["job"]["pod_template"])

    assert container(manifest)["image"].startswith("my-own-registry.com/platform-orchestrator/")
    assert pod(manifest)["imagePullSecrets"] == [{"name": "regcred"}]
    assert container(manifest)["args"] == ["standard"]
    assert [e["name"] for e in container(manifest)["env"]] == list(make_spec().runner_environment())


def test_render_job_manifest__seed001_secret_env_appended() -> None:
    """Seed 001: a variable from a secret is appended to the runner's environment, which stays whole."""
    data = yaml.safe_load((DATA / "seed001-pod-template.yaml").read_text())
    manifest = render(data["runner_configuration"]["job"]["pod_template"])

    names = [e["name"] for e in container(manifest)["env"]]
    assert names == [*make_spec().runner_environment(), "TF_EXAMPLE"]
    assert env(manifest)["TF_EXAMPLE"]["valueFrom"] == {"secretKeyRef": {"name": "my-secret", "key": "key"}}


def test_strategic_merge__containers_merge_by_name_and_new_ones_append() -> None:
    manifest = render(
        {
            "spec": {
                "containers": [
                    {"name": "proxy", "image": "envoy:1.30"},
                    {"name": "main", "resources": {"limits": {"memory": "2Gi"}}},
                ]
            }
        }
    )

    assert [c["name"] for c in pod(manifest)["containers"]] == ["main", "proxy"]
    assert container(manifest)["resources"] == {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    assert container(manifest)["image"] == IMAGE


def test_strategic_merge__env_merges_by_name() -> None:
    """A variable of the same name is merged in place; a new one is appended."""
    manifest = render(
        {
            "spec": {
                "containers": [
                    {"name": "main", "env": [{"name": "LOG_LEVEL", "value": "debug"}, {"name": "A"}]}
                ]
            }
        }
    )

    names = [e["name"] for e in container(manifest)["env"]]
    assert names == [*make_spec().runner_environment(), "A"]
    assert env(manifest)["LOG_LEVEL"] == {"name": "LOG_LEVEL", "value": "debug"}


def test_strategic_merge__volumes_by_name_and_mounts_by_mount_path() -> None:
    """``volumes`` merge on ``name``; ``volumeMounts`` on ``mountPath`` (Kubernetes' merge key), not name."""
    manifest = render(
        {
            "spec": {
                "volumes": [
                    {"name": "tofu", "emptyDir": {"medium": "Memory"}},
                    {"name": "ca", "configMap": {"name": "corp-ca"}},
                ],
                "containers": [
                    {
                        "name": "main",
                        "volumeMounts": [
                            {"name": "ca", "mountPath": "/etc/ssl/corp", "readOnly": True},
                            {"name": "tofu", "mountPath": CODE_DIR, "subPath": "code"},
                        ],
                    }
                ],
            }
        }
    )

    assert pod(manifest)["volumes"] == [
        {"name": "tofu", "emptyDir": {"medium": "Memory"}},
        {"name": "ca", "configMap": {"name": "corp-ca"}},
    ]
    assert container(manifest)["volumeMounts"] == [
        {"name": "tofu", "mountPath": CODE_DIR, "subPath": "code"},
        {"name": "ca", "mountPath": "/etc/ssl/corp", "readOnly": True},
    ]


def test_strategic_merge__image_pull_secrets_append_once() -> None:
    original = {"spec": {"imagePullSecrets": [{"name": "a"}]}}

    merged = strategic_merge(original, {"spec": {"imagePullSecrets": [{"name": "b"}, {"name": "a"}]}})

    assert merged["spec"]["imagePullSecrets"] == [{"name": "a"}, {"name": "b"}]


def test_strategic_merge__lists_without_merge_key_are_replaced() -> None:
    """``args``, ``tolerations`` (no ``patchStrategy`` in Kubernetes' types) are replaced as a whole."""
    manifest = render(
        {
            "spec": {
                "tolerations": [
                    {"key": "dedicated", "operator": "Equal", "value": "runners", "effect": "NoSchedule"}
                ],
                "containers": [{"name": "main", "args": ["standard", "--verbose"]}],
            }
        }
    )

    assert container(manifest)["args"] == ["standard", "--verbose"]
    assert pod(manifest)["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "runners", "effect": "NoSchedule"}
    ]


def test_strategic_merge__null_removes_a_default() -> None:
    manifest = render({"spec": {"containers": [{"name": "main", "securityContext": {"runAsNonRoot": None}}]}})

    assert "runAsNonRoot" not in container(manifest)["securityContext"]
    assert container(manifest)["securityContext"]["allowPrivilegeEscalation"] is False


def test_strategic_merge__patch_directives() -> None:
    """``$patch: delete`` drops a list item, ``$patch: replace`` a whole mapping; ``$retainKeys`` prunes."""
    original = {
        "spec": {
            "containers": [{"name": "main", "image": "a"}, {"name": "sidecar", "image": "b"}],
            "securityContext": {"runAsUser": 1, "fsGroup": 2},
            "volumes": [{"name": "tofu", "emptyDir": {}}],
        }
    }
    patch = {
        "spec": {
            "containers": [{"name": "sidecar", "$patch": "delete"}],
            "securityContext": {"$patch": "replace", "runAsUser": 3},
            "volumes": [{"name": "tofu", "$retainKeys": ["name", "ephemeral"], "ephemeral": {}}],
        }
    }

    merged = strategic_merge(original, patch)

    assert merged["spec"]["containers"] == [{"name": "main", "image": "a"}]
    assert merged["spec"]["securityContext"] == {"runAsUser": 3}
    assert merged["spec"]["volumes"] == [{"name": "tofu", "ephemeral": {}}]


def test_strategic_merge__inputs_unchanged() -> None:
    original = {"spec": {"containers": [{"name": "main", "env": [{"name": "A", "value": "1"}]}]}}
    patch = {"spec": {"containers": [{"name": "main", "env": [{"name": "A", "value": "2"}]}]}}
    before = copy.deepcopy((original, patch))

    strategic_merge(original, patch)

    assert (original, patch) == before


def test_render_job_manifest__legacy_container_name_patches_main() -> None:
    """A template for the legacy ``platform-orchestrator-runner`` container patches ``main``."""
    manifest = render({"spec": {"containers": [{"name": "platform-orchestrator-runner", "image": "old:1"}]}})

    assert [c["name"] for c in pod(manifest)["containers"]] == ["main"]
    assert container(manifest)["image"] == "old:1"


def test_render_job_manifest__template_cannot_move_the_pod() -> None:
    """Namespace and service account come from the job configuration, even past a bad template."""
    config = job_config().model_copy(
        update={
            "pod_template": {
                "metadata": {"namespace": "kube-system"},
                "spec": {"serviceAccountName": "admin"},
            }
        }
    )

    manifest = render_job_manifest(make_spec(), config, IMAGE)

    assert_valid(manifest)
    assert "namespace" not in manifest["spec"]["template"]["metadata"]
    assert pod(manifest)["serviceAccountName"] == "runner-sa"


def test_render_job_manifest__invalid_merge_result_is_caught_by_the_schema() -> None:
    """The validator used above is strict: an unknown container field is refused."""
    manifest = render_job_manifest(
        make_spec(),
        job_config({"spec": {"containers": [{"name": "main", "imagePullPolcy": "Always"}]}}),
        IMAGE,
    )

    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, latest_version(), strict=True)


def test_render_job_spec__the_jobs_spec_without_token() -> None:
    """What a kubernetes-agent command carries for upstream's agent: the Job's spec, every runner variable
    but TOKEN (the gateway adds it on delivery), valid as a Job's spec."""
    template = {"spec": {"containers": [{"name": "main", "image": IMAGE}]}}
    manifest = render(template)

    job_spec = render_job_spec(make_spec(), job_config(template), DEFAULT_RUNNER_IMAGE)

    expected = copy.deepcopy(manifest["spec"])
    main = expected["template"]["spec"]["containers"][0]
    main["env"] = [e for e in main["env"] if e["name"] != "TOKEN"]
    assert expected == job_spec
    assert TOKEN not in json.dumps(job_spec)
    assert ["standard"] == job_spec["template"]["spec"]["containers"][0]["args"]
    assert_valid({**manifest, "spec": job_spec})
