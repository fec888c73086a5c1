"""tests/support/kube_schema.py, the strict schema check every Kubernetes test uses, agrees with
``kubernetes_validate.validate(..., strict=True)`` itself: the same verdict for valid and invalid manifests,
for each Kubernetes version the tests check, with the same schema release."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from tests.support.kube_schema import KUBERNETES_VERSIONS, schema_problems, schema_release

JOB: dict[str, Any] = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "run", "namespace": "runners", "labels": {"a": "b"}},
    "spec": {
        "backoffLimit": 0,
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "runner:1",
                        "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "T"}}}],
                    }
                ],
            }
        },
    },
}


def with_container(**fields: Any) -> dict[str, Any]:
    container = {**JOB["spec"]["template"]["spec"]["containers"][0], **fields}
    pod = {**JOB["spec"]["template"]["spec"], "containers": [container]}
    return {**JOB, "spec": {**JOB["spec"], "template": {"spec": pod}}}


CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("job", JOB, True),
    ("job-unknown-container-field", with_container(imagePullPolcy="Always"), False),
    ("job-env-as-mapping", with_container(env={"name": "T", "value": "x"}), False),
    ("job-wrong-type", {**JOB, "spec": {**JOB["spec"], "backoffLimit": "none"}}, False),
    (
        "secret",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s"},
            "type": "Opaque",
            "data": {"T": "eA=="},
        },
        True,
    ),
    (
        "secret-number",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"T": 1}},
        False,
    ),
    (
        "lease",
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "lock"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
        },
        True,
    ),
    (
        "role-unknown-field",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "r"},
            "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"], "verb": ["get"]}],
        },
        False,
    ),
]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("manifest", "valid"), [(m, v) for _, m, v in CASES], ids=[c[0] for c in CASES])
def test_schema_problems__agree_with_kubernetes_validate(
    manifest: dict[str, Any], valid: bool, version: str
) -> None:
    ours = [p for p in schema_problems(manifest) if p.startswith(f"Kubernetes {version}:")]
    try:
        used = kubernetes_validate.validate(manifest, version, strict=True)
        theirs = True
    except kubernetes_validate.ValidationError:
        theirs = False

    assert (not ours, theirs) == (valid, valid), ours
    if theirs:
        assert kubernetes_validate.utils.major_minor(schema_release(version)) == used


def test_schema_problems__name_each_field_and_version() -> None:
    problems = schema_problems(with_container(imagePullPolcy="Always", image=3))

    assert len(problems) == 2 * len(KUBERNETES_VERSIONS)
    assert all("spec.template.spec.containers.0" in p for p in problems)
    assert any("'imagePullPolcy' was unexpected" in p for p in problems)
    assert schema_problems({"apiVersion": "v9", "kind": "Secret"}) == [
        f"Kubernetes {version}: no schema for Secret in v9" for version in KUBERNETES_VERSIONS
    ]
