"""Runners through the HTTP API: every type, secrets, PATCH semantics, compatibility, links."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml
from fastapi import FastAPI

from orchestrator.domain.runner_types import compatibility_matrix
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store.schema import runners
from tests.support.orgs import BOOTSTRAP_TOKEN, Org, api_client

DATA = Path(__file__).parent.parent / "data" / "runners"
EXAMPLES = sorted(p.name for p in DATA.glob("*.yaml"))
K8S_SECRET_FIELDS = ("client_certificate_data", "client_key_data")


def example(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DATA / name).read_text())
    return loaded


async def create(
    client: httpx.AsyncClient, org_id: str, runner_id: str, body: dict[str, Any]
) -> httpx.Response:
    return await client.post(f"/orgs/{org_id}/runners", json={"id": runner_id, **body})


def without_status(answer: dict[str, Any]) -> dict[str, Any]:
    """A GET answer of a runner the orchestrator launches, without what only GET answers."""
    return {key: value for key, value in answer.items() if key != "status"}


@pytest.mark.parametrize("name", EXAMPLES)
async def test_runners__every_example_is_accepted_and_read_back(org: Org, name: str) -> None:
    body = example(name)
    # A runner with a local connection is the platform admin's to create.
    created = await create(org.platform if name == "vm-local.yaml" else org.admin, org.id, "r1", body)
    got = await org.admin.get(f"/orgs/{org.id}/runners/r1")

    assert 201 == created.status_code, created.text
    read = got.json()
    # GET adds whether this orchestrator launches it (every extra is installed here, local runners are
    # allowed); create answers it for no runner, an agent's presence for every agent's runner.
    if read["launched_by"] == "agent":
        assert {"last_seen_at": None} == read["status"] == created.json()["status"]
    elif name == "vm-local.yaml":
        # runtime: docker, and no Docker daemon answers here (issue 26: said so, not "launchable").
        status = read.pop("status")
        assert status == {"launchable": True} or "no container engine answers at" in status["message"]
    else:
        assert {"launchable": True} == read.pop("status")
    assert {**read, "warnings": []} == created.json()
    assert body["runner_configuration"]["type"] == got.json()["runner_configuration"]["type"]
    assert body["state_storage_configuration"] == got.json()["state_storage_configuration"]


async def test_runners__kubernetes_credentials_answered_as_secret_and_sealed_at_rest(
    org: Org, app: FastAPI
) -> None:
    body = example("seed001-kubernetes.yaml")
    created = await create(org.admin, org.id, "k8s", body)
    async with app.state.services.engine.connect() as conn:
        row = (await conn.execute(sa.select(runners).where(runners.c.id == "k8s"))).one()._mapping

    auth = created.json()["runner_configuration"]["cluster"]["auth"]
    assert {"SECRET"} == {auth[f] for f in K8S_SECRET_FIELDS}
    for field in K8S_SECRET_FIELDS:
        secret = body["runner_configuration"]["cluster"]["auth"][field]
        assert secret not in created.text
        assert secret not in str(row["configuration"])
        assert secret not in row["config_secret"]
    assert row["config_secret"].startswith("v1.")


async def test_runners__patch_with_secret_placeholder_keeps_stored_value(org: Org, app: FastAPI) -> None:
    body = example("seed001-kubernetes.yaml")
    await create(org.admin, org.id, "k8s", body)
    returned = (await org.admin.get(f"/orgs/{org.id}/runners/k8s")).json()["runner_configuration"]
    returned["job"] = {"namespace": "other", "service_account": "sa"}

    patched = await org.admin.patch(f"/orgs/{org.id}/runners/k8s", json={"runner_configuration": returned})
    async with app.state.services.engine.connect() as conn:
        sealed = (
            await conn.execute(sa.select(runners.c.config_secret).where(runners.c.id == "k8s"))
        ).scalar_one()
    opened = app.state.services.box.open(sealed, context=f"runner:{org.id}/k8s").decode()

    assert 200 == patched.status_code, patched.text
    assert "other" == patched.json()["runner_configuration"]["job"]["namespace"]
    assert body["runner_configuration"]["cluster"]["auth"]["client_key_data"] in opened


async def test_runners__patch_merges_onto_the_stored_configuration(org: Org) -> None:
    """A PATCH runner_configuration is a JSON Merge Patch (RFC 7396): type may be left out, objects merge at
    every depth, null removes a key."""
    body = example("seed000-custom-image.yaml")
    await create(org.admin, org.id, "gke", body)

    patched = await org.admin.patch(
        f"/orgs/{org.id}/runners/gke",
        json={
            "runner_configuration": {
                "job": {"namespace": "n2", "pod_template": {"spec": {"imagePullSecrets": None}}}
            }
        },
    )
    got = await org.admin.get(f"/orgs/{org.id}/runners/gke")

    assert 200 == patched.status_code, patched.text
    config = patched.json()["runner_configuration"]
    assert {
        "namespace": "n2",
        "service_account": body["runner_configuration"]["job"]["service_account"],
        "pod_template": {
            "spec": {"containers": body["runner_configuration"]["job"]["pod_template"]["spec"]["containers"]}
        },
    } == config["job"]
    assert body["runner_configuration"]["cluster"]["name"] == config["cluster"]["name"]
    assert [] == patched.json()["warnings"]
    assert {"launchable": True} == got.json()["status"]  # GET only
    assert {**without_status(got.json()), "warnings": []} == patched.json()


async def test_runners__terraform_providers_nested_state_storage_is_stored_and_answered_flat(
    org: Org,
) -> None:
    """Seed 000's agent runner (TF tab) gives ``kubernetes_configuration = {namespace = ...}``; the other
    types' blocks come as null from the provider."""
    body = example("seed000-agent.yaml")
    nested = {"type": "kubernetes", "kubernetes_configuration": {"namespace": "platform-orchestrator"}}
    other = {"type": "s3", "s3_configuration": {"bucket": "tf-state"}, "kubernetes_configuration": None}

    created = await create(org.admin, org.id, "agent", {**body, "state_storage_configuration": nested})
    patched = await org.admin.patch(
        f"/orgs/{org.id}/runners/agent", json={"state_storage_configuration": other}
    )
    got = await org.admin.get(f"/orgs/{org.id}/runners/agent")
    mismatch = await org.admin.patch(
        f"/orgs/{org.id}/runners/agent",
        json={"state_storage_configuration": {"type": "gcs", "s3_configuration": {"bucket": "b-1"}}},
    )

    assert 201 == created.status_code, created.text
    assert {"type": "kubernetes", "namespace": "platform-orchestrator"} == created.json()[
        "state_storage_configuration"
    ]
    assert 200 == patched.status_code, patched.text
    assert {"type": "s3", "bucket": "tf-state"} == got.json()["state_storage_configuration"]
    assert 400 == mismatch.status_code
    assert mismatch.json()["message"] == (
        "state_storage_configuration.s3_configuration: does not match type 'gcs': give the block of that "
        "type, or none"
    )


async def test_runners__create_reads_env_as_one_mapping_as_a_list_with_a_warning(org: Org) -> None:
    """Seed 001's secret variable as its CLI tab prints it (env: one mapping), in a new runner's pod
    template: created with the list of that variable, and the answer says so naming the field."""
    body = example("seed001-pod-template.yaml")
    container = body["runner_configuration"]["job"]["pod_template"]["spec"]["containers"][0]
    variables = container["env"]
    container["env"] = variables[0]

    created = await create(org.admin, org.id, "k8s", body)
    got = await org.admin.get(f"/orgs/{org.id}/runners/k8s")

    assert 201 == created.status_code, created.text
    assert [
        "runner_configuration.job.pod_template.spec.containers[0].env: a single mapping, read as a list of "
        "this one variable; write env as a list ('- name: TF_EXAMPLE')"
    ] == created.json()["warnings"]
    stored = got.json()["runner_configuration"]["job"]["pod_template"]["spec"]["containers"][0]
    assert variables == stored["env"]
    assert {**without_status(got.json()), "warnings": created.json()["warnings"]} == created.json()


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"runner_configuration": {"type": "kubernetes"}}, "runner_configuration.type"),
        ({"runner_configuration": {"type": None}}, "runner_configuration.type"),
        ({"runner_configuration": None}, "runner_configuration"),
        ({"runner_configuration": {"job": {"namespace": None}}}, "runner_configuration.job.namespace"),
        (
            {"state_storage_configuration": {"type": "s3", "bucket": "Bad_Bucket"}},
            "state_storage_configuration",
        ),
        ({"colour": "red"}, "colour"),
    ],
)
async def test_runners__bad_patch_names_the_field(org: Org, patch: dict[str, Any], field: str) -> None:
    await create(org.admin, org.id, "gke", example("seed000-gke.yaml"))

    response = await org.admin.patch(f"/orgs/{org.id}/runners/gke", json=patch)

    assert 400 == response.status_code
    assert response.json()["message"].startswith(field)


async def test_runners__patch_state_storage_rechecks_compatibility(org: Org) -> None:
    await create(org.admin, org.id, "ecs", example("serverless-ecs.yaml"))

    response = await org.admin.patch(
        f"/orgs/{org.id}/runners/ecs",
        json={"state_storage_configuration": {"type": "kubernetes", "namespace": "x"}},
    )

    assert 400 == response.status_code
    assert (
        "state_storage_configuration.type: state storage type 'kubernetes' is not compatible with runner type"
        " 'serverless-ecs', it must be one of [orchestrator s3]"
    ) == response.json()["message"]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (
            lambda b: b["runner_configuration"]["cluster"].update(colour="red"),
            "runner_configuration.cluster.colour",
        ),
        (lambda b: b["runner_configuration"]["cluster"].pop("name"), "runner_configuration.cluster.name"),
        (lambda b: b["runner_configuration"].update(type="kubernetes-nope"), "runner_configuration.type"),
        (lambda b: b.update(extra=1), "extra"),
        (lambda b: b["state_storage_configuration"].update(type="s4"), "state_storage_configuration.type"),
    ],
)
async def test_runners__bad_create_names_the_field(org: Org, mutate: Any, field: str) -> None:
    body = example("seed000-gke.yaml")
    mutate(body)

    response = await create(org.admin, org.id, "gke", body)

    assert 400 == response.status_code
    assert response.json()["message"].startswith(f"{field}:"), response.json()["message"]


async def test_runners__bad_id_and_duplicate(org: Org) -> None:
    bad = await create(org.admin, org.id, "Bad.Id", example("seed000-gke.yaml"))
    first = await create(org.admin, org.id, "gke", example("seed000-gke.yaml"))
    again = await create(org.admin, org.id, "gke", example("seed000-gke.yaml"))

    assert 400 == bad.status_code
    assert bad.json()["message"].startswith("id:")
    assert 201 == first.status_code
    assert 409 == again.status_code


async def test_runners__local_vm_refused_unless_allowed(org: Org, app: FastAPI) -> None:
    settings = app.state.services.settings
    object.__setattr__(settings, "allow_local_runners", False)
    try:
        response = await create(org.admin, org.id, "local", example("vm-local.yaml"))
    finally:
        object.__setattr__(settings, "allow_local_runners", True)

    assert 400 == response.status_code
    assert "PO_ALLOW_LOCAL_RUNNERS" in response.json()["message"]


async def test_runners__local_vm_only_by_a_platform_admin(org: Org) -> None:
    """A local runner runs deployments on the orchestrator's host: an organization admin may not create
    one (403 saying why); the platform admin may."""
    refused = await create(org.admin, org.id, "local", example("vm-local.yaml"))
    created = await create(org.platform, org.id, "local", example("vm-local.yaml"))

    assert 403 == refused.status_code
    assert refused.json()["message"] == (
        "runner_configuration.connection.type: only a platform admin may create or change a runner with a "
        "local connection: its deployments run on the orchestrator's own host"
    )
    assert 201 == created.status_code, created.text


async def test_runners__changing_a_runner_to_local_only_by_a_platform_admin(org: Org) -> None:
    await create(org.admin, org.id, "vm1", example("vm-agent.yaml"))
    # Merged onto the stored agent connection: its key has to be removed (null) for a local one.
    patch = {"runner_configuration": {"type": "vm", "connection": {"type": "local", "key": None}}}

    refused = await org.admin.patch(f"/orgs/{org.id}/runners/vm1", json=patch)
    unchanged = (await org.admin.get(f"/orgs/{org.id}/runners/vm1")).json()
    changed = await org.platform.patch(f"/orgs/{org.id}/runners/vm1", json=patch)

    assert 403 == refused.status_code
    assert "only a platform admin" in refused.json()["message"]
    assert "agent" == unchanged["runner_configuration"]["connection"]["type"]
    assert 200 == changed.status_code, changed.text
    assert "local" == changed.json()["runner_configuration"]["connection"]["type"]


@pytest.mark.parametrize(
    "patch",
    [
        {
            "runner_configuration": {
                "type": "vm",
                "job": {"runtime": "process", "image": None, "work_dir": "/root"},
            }
        },
        {"description": "mine now"},
    ],
    ids=["job", "description"],
)
async def test_runners__an_existing_local_runner_is_changed_only_by_a_platform_admin(
    org: Org, patch: dict[str, Any]
) -> None:
    await create(org.platform, org.id, "local", example("vm-local.yaml"))

    refused = await org.admin.patch(f"/orgs/{org.id}/runners/local", json=patch)
    changed = await org.platform.patch(f"/orgs/{org.id}/runners/local", json=patch)

    assert 403 == refused.status_code
    assert "only a platform admin" in refused.json()["message"]
    assert 200 == changed.status_code, changed.text


async def test_runners__list_is_a_summary_with_paging(org: Org) -> None:
    for i in range(5):
        await create(org.admin, org.id, f"r{i}", example("seed000-agent.yaml"))

    first = (await org.admin.get(f"/orgs/{org.id}/runners", params={"per_page": 3})).json()
    second = (
        await org.admin.get(f"/orgs/{org.id}/runners", params={"page": first["next_page_token"]})
    ).json()
    by_type = (await org.admin.get(f"/orgs/{org.id}/runners", params={"byRunnerType": "vm"})).json()

    assert ["r0", "r1", "r2"] == [r["id"] for r in first["items"]]
    assert ["r3", "r4"] == [r["id"] for r in second["items"]]
    assert {"type": "kubernetes-agent"} == first["items"][0]["runner_configuration"]
    assert "next_page_token" not in second or second["next_page_token"] is None
    assert [] == by_type["items"]


async def test_runners__delete_refused_while_an_environment_is_linked(org: Org) -> None:
    await create(org.platform, org.id, "vm1", example("vm-local.yaml"))
    await org.admin.post(f"/orgs/{org.id}/env-types", json={"id": "development"})
    await org.admin.post(f"/orgs/{org.id}/projects", json={"id": "shop"})
    await org.admin.post(
        f"/orgs/{org.id}/projects/shop/envs", json={"id": "dev", "env_type_id": "development"}
    )
    await org.admin.post(f"/orgs/{org.id}/runner-rules", json={"runner_id": "vm1"})
    await org.admin.post(f"/orgs/{org.id}/projects/shop/envs/dev/actions/refresh_runner")

    refused = await org.admin.delete(f"/orgs/{org.id}/runners/vm1")
    await org.admin.delete(f"/orgs/{org.id}/projects/shop/envs/dev")
    deleted = await org.admin.delete(f"/orgs/{org.id}/runners/vm1")
    rules = (await org.admin.get(f"/orgs/{org.id}/runner-rules")).json()["items"]

    assert 409 == refused.status_code
    assert "runner vm1 is in use by the environments: shop/dev" == refused.json()["message"]
    assert 204 == deleted.status_code
    assert [] == rules


async def test_compatibility__published(admin: httpx.AsyncClient) -> None:
    response = await admin.get("/runner-compatibility")

    assert compatibility_matrix() == response.json()["matrix"]
    assert ["azurerm", "gcs", "orchestrator", "s3"] == response.json()["matrix"]["vm"]


async def test_runners__get_says_a_local_runner_is_not_launchable_where_local_runners_are_off(
    org: Org, settings: ServerSettings
) -> None:
    """The runner was created where local runners were allowed; a server on the same database without
    PO_ALLOW_LOCAL_RUNNERS answers it as before, and says on GET that it cannot launch it."""
    local = example("vm-local.yaml")
    # A process run: runtime docker is launchable only where a Docker daemon answers.
    local["runner_configuration"]["job"] = {"runtime": "process"}
    created = await create(org.platform, org.id, "here", local)
    strict = create_app(settings.model_copy(update={"allow_local_runners": False}), run_dispatcher=False)

    async with strict.router.lifespan_context(strict), api_client(strict, BOOTSTRAP_TOKEN) as platform:
        got = await platform.get(f"/orgs/{org.id}/runners/here")
    allowed = await org.admin.get(f"/orgs/{org.id}/runners/here")

    assert 201 == created.status_code, created.text
    assert {"launchable": True} == allowed.json()["status"]
    assert {
        "launchable": False,
        "message": "this orchestrator cannot launch vm runners with a local connection: local runners are "
        "off on this server (start it with PO_ALLOW_LOCAL_RUNNERS=true)",
    } == got.json()["status"]
    assert without_status(allowed.json()) == without_status(got.json())
