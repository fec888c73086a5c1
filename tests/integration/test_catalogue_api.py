"""The module catalogue through the HTTP API: resource types, module providers, modules and their versions,
module rules, and the resource types available in an environment."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml
from fastapi import FastAPI

from orchestrator.dispatch import env_catalogue
from orchestrator.domain import provider_secrets
from orchestrator.domain.module_rules import Placement
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store import module_providers as provider_store
from orchestrator.store.schema import module_providers
from tests.support.orgs import Org, walk_pages

GIT_SOURCE = "git::https://github.com/acme/modules.git//postgres?ref=v1"


async def _ok(response: httpx.Response, status: int = 201) -> dict[str, Any]:
    assert status == response.status_code, response.text
    body: dict[str, Any] = response.json() if response.content else {}
    return body


async def _type(org: Org, type_id: str = "postgres", **fields: Any) -> dict[str, Any]:
    body = {"id": type_id, "output_schema": {"type": "object"}, **fields}
    return await _ok(await org.admin.post(f"/orgs/{org.id}/resource-types", json=body))


async def _provider(org: Org, provider_type: str = "aws", provider_id: str = "default") -> dict[str, Any]:
    body = {
        "provider_type": provider_type,
        "id": provider_id,
        "source": "hashicorp/aws",
        "version_constraint": "~> 5.0",
        "configuration": {"region": "eu-west-1"},
    }
    return await _ok(await org.admin.post(f"/orgs/{org.id}/module-providers", json=body))


async def _module(
    org: Org, module_id: str = "pg", resource_type: str = "postgres", **fields: Any
) -> dict[str, Any]:
    body = {"id": module_id, "resource_type": resource_type, "module_source": GIT_SOURCE, **fields}
    return await _ok(await org.admin.post(f"/orgs/{org.id}/modules", json=body))


async def _rule(org: Org, module_id: str = "pg", **fields: Any) -> dict[str, Any]:
    return await _ok(
        await org.admin.post(f"/orgs/{org.id}/module-rules", json={"module_id": module_id, **fields})
    )


async def _env(
    org: Org, project_id: str = "shop", env_id: str = "dev", env_type_id: str = "development"
) -> None:
    if (await org.admin.get(f"/orgs/{org.id}/env-types/{env_type_id}")).status_code == 404:
        await _ok(await org.admin.post(f"/orgs/{org.id}/env-types", json={"id": env_type_id}))
    if (await org.admin.get(f"/orgs/{org.id}/projects/{project_id}")).status_code == 404:
        await _ok(await org.admin.post(f"/orgs/{org.id}/projects", json={"id": project_id}))
    await _ok(
        await org.admin.post(
            f"/orgs/{org.id}/projects/{project_id}/envs", json={"id": env_id, "env_type_id": env_type_id}
        )
    )


# --- resource types ---


async def test_resource_types__crud(org: Org) -> None:
    base = f"/orgs/{org.id}/resource-types"
    created = await _type(org, description="A database", is_developer_accessible=False)
    got = await org.admin.get(f"{base}/postgres")
    patched = await org.admin.patch(
        f"{base}/postgres", json={"description": "Postgres", "is_developer_accessible": True}
    )
    listed = await org.admin.get(base)
    deleted = await org.admin.delete(f"{base}/postgres")

    assert {
        "id": "postgres",
        "description": "A database",
        "output_schema": {"type": "object"},
        "built_in": False,
        "is_developer_accessible": False,
    }.items() <= created.items()
    assert created == got.json()
    assert {"description": "Postgres", "is_developer_accessible": True}.items() <= patched.json().items()
    assert {"type": "object"} == patched.json()["output_schema"]
    assert ["postgres"] == [t["id"] for t in listed.json()["items"]]
    assert 204 == deleted.status_code
    assert 404 == (await org.admin.get(f"{base}/postgres")).status_code
    assert 404 == (await org.admin.delete(f"{base}/postgres")).status_code


async def test_resource_types__bad_input_and_duplicate(org: Org) -> None:
    base = f"/orgs/{org.id}/resource-types"
    await _type(org)

    duplicate = await org.admin.post(base, json={"id": "postgres", "output_schema": {}})
    bad_id = await org.admin.post(base, json={"id": "Postgres_DB", "output_schema": {}})
    no_schema = await org.admin.post(base, json={"id": "redis"})
    unknown = await org.admin.patch(f"{base}/postgres", json={"built_in": True})

    assert 409 == duplicate.status_code
    assert "resource type 'postgres' already exists" == duplicate.json()["message"]
    assert 400 == bad_id.status_code
    assert bad_id.json()["message"].startswith("id:")
    assert 400 == no_schema.status_code
    assert no_schema.json()["message"].startswith("output_schema:")
    assert "built_in: unknown field" == unknown.json()["message"]


async def test_resource_types__in_use_by_a_module_cannot_be_deleted(org: Org) -> None:
    await _type(org)
    await _type(org, "vpc")
    await _module(org, dependencies={"network": {"type": "vpc"}})

    provisioned = await org.admin.delete(f"/orgs/{org.id}/resource-types/postgres")
    requested = await org.admin.delete(f"/orgs/{org.id}/resource-types/vpc")

    assert 409 == provisioned.status_code
    assert "resource type 'postgres' is provisioned by the modules: pg" == provisioned.json()["message"]
    assert 409 == requested.status_code
    assert requested.json()["message"].endswith("co-provisioned resource of the modules: pg")


# --- module providers ---


async def test_module_providers__crud(org: Org) -> None:
    base = f"/orgs/{org.id}/module-providers"
    created = await _provider(org)
    await _provider(org, "google", "main")
    got = await org.admin.get(f"{base}/aws/default")
    patched = await org.admin.patch(
        f"{base}/aws/default",
        json={"version_constraint": ">= 5.1, < 6.0", "configuration": {"region": "us-east-1"}},
    )
    listed = await org.admin.get(base)
    by_type = await org.admin.get(base, params={"byProviderType": "google"})
    deleted = await org.admin.delete(f"{base}/aws/default")

    assert {
        "org_id": org.id,
        "provider_type": "aws",
        "id": "default",
        "source": "hashicorp/aws",
        "version_constraint": "~> 5.0",
        "configuration": {"region": "eu-west-1"},
    }.items() <= created.items()
    assert created == got.json()
    assert {"version_constraint": ">= 5.1, < 6.0", "configuration": {"region": "us-east-1"}}.items() <= (
        patched.json().items()
    )
    assert [("aws", "default"), ("google", "main")] == [
        (p["provider_type"], p["id"]) for p in listed.json()["items"]
    ]
    assert all("configuration" not in p for p in listed.json()["items"])
    assert ["main"] == [p["id"] for p in by_type.json()["items"]]
    assert 204 == deleted.status_code
    assert 404 == (await org.admin.get(f"{base}/aws/default")).status_code
    assert 404 == (await org.admin.patch(f"{base}/aws/default", json={})).status_code


CREDENTIALS = {
    "region": "eu-west-1",
    "access_key": "AKIA-CANARY-ACCESS",
    "secret_key": "canary-secret-value",
    "token": "${var.session_token}",
    "assume_role[0]": {"role_arn": "arn:aws:iam::1:role/deploy", "session_name": "po"},
    "skip_credentials_validation": True,
}
MASKED = {
    **CREDENTIALS,
    "access_key": "SECRET",
    "secret_key": "SECRET",
}


async def test_module_providers__credentials_answered_as_secret_to_every_role(app: FastAPI, org: Org) -> None:
    """Literal credentials are never answered in clear, to a viewer or an admin; references and other
    values are. At rest the configuration is sealed (no credential in any column)."""
    body = {"provider_type": "aws", "id": "main", "source": "hashicorp/aws", "version_constraint": "~> 5.0"}
    created = await org.admin.post(
        f"/orgs/{org.id}/module-providers", json={**body, "configuration": CREDENTIALS}
    )
    path = f"/orgs/{org.id}/module-providers/aws/main"
    as_viewer = await org.clients["viewer"].get(path)
    as_admin = await org.admin.get(path)
    async with app.state.services.engine.connect() as conn:
        row = (await conn.execute(sa.select(module_providers))).one()

    assert 201 == created.status_code, created.text
    assert MASKED == created.json()["configuration"]
    assert (MASKED, MASKED) == (as_viewer.json()["configuration"], as_admin.json()["configuration"])
    assert "canary" not in as_viewer.text.lower() and "canary" not in as_admin.text.lower()
    assert "canary" not in json.dumps(row.configuration).lower()
    assert "canary" not in row.configuration_sealed.lower()
    assert MASKED == row.configuration


async def test_module_providers__secret_keeps_the_stored_value_and_deploys_it(app: FastAPI, org: Org) -> None:
    """An admin edits the configuration as answered ("SECRET" kept): the deployment's bundle still gets
    the real credentials, in its variables file; main.tf, which a viewer reads, does not."""
    body = {"provider_type": "aws", "id": "main", "source": "hashicorp/aws", "version_constraint": "~> 5.0"}
    await org.admin.post(f"/orgs/{org.id}/module-providers", json={**body, "configuration": CREDENTIALS})
    path = f"/orgs/{org.id}/module-providers/aws/main"
    answered = (await org.admin.get(path)).json()["configuration"]
    patched = await org.admin.patch(path, json={"configuration": {**answered, "region": "us-east-1"}})
    unknown = await org.admin.patch(path, json={"configuration": {**answered, "password": "SECRET"}})
    created_with_placeholder = await org.admin.post(
        f"/orgs/{org.id}/module-providers",
        json={**body, "id": "other", "configuration": {"secret_key": "SECRET"}},
    )
    await _type(org)
    await _module(org, provider_mapping={"aws": "aws.main"})
    await _rule(org)
    await _env(org)
    runner = yaml.safe_load((Path(__file__).parent.parent / "data" / "runners" / "vm-local.yaml").read_text())
    await _ok(await org.platform.post(f"/orgs/{org.id}/runners", json={"id": "local", **runner}))
    await _ok(await org.admin.post(f"/orgs/{org.id}/runner-rules", json={"runner_id": "local"}))
    dry_run = await org.clients["deployer"].post(
        f"/orgs/{org.id}/deployments",
        json={
            "project_id": "shop",
            "env_id": "dev",
            "mode": "deploy",
            "is_dry_run": True,
            "manifest": {"workloads": {"api": {"resources": {"db": {"type": "postgres"}}}}},
        },
    )
    async with app.state.services.engine.connect() as conn:
        catalogue = await env_catalogue.load_env_catalogue(
            conn, org.id, Placement(project_id="shop", env_type_id="development", env_id="dev")
        )
    opened = provider_secrets.open_configuration(app.state.services.box, catalogue.providers["aws.main"])

    assert 200 == patched.status_code, patched.text
    assert {**MASKED, "region": "us-east-1"} == patched.json()["configuration"]
    assert {**CREDENTIALS, "region": "us-east-1"} == opened
    assert 400 == unknown.status_code
    assert unknown.json()["message"].startswith(
        "configuration.password: the placeholder 'SECRET' keeps a stored"
    )
    assert 400 == created_with_placeholder.status_code
    assert created_with_placeholder.json()["message"].startswith("configuration.secret_key:")
    assert 200 == dry_run.status_code, dry_run.text
    assert "canary" not in dry_run.json()["tf"].lower()
    assert re.search(r"\n  secret_key +\= var\.po_aws_main_secret_key\n", dry_run.json()["tf"])


async def test_module_providers__clear_rows_from_before_are_sealed_at_start(
    app: FastAPI, org: Org, settings: ServerSettings
) -> None:
    """A configuration stored in clear (before sealing) is answered masked, and sealed when a server
    starts on the database."""
    now = datetime.now(UTC)
    async with app.state.services.engine.begin() as conn:
        await conn.execute(
            sa.insert(module_providers).values(
                org_id=org.id,
                provider_type="aws",
                id="old",
                description=None,
                source="hashicorp/aws",
                version_constraint="",
                configuration=CREDENTIALS,
                configuration_sealed=None,
                created_at=now,
                updated_at=now,
            )
        )
    answered_before = (await org.clients["viewer"].get(f"/orgs/{org.id}/module-providers/aws/old")).json()
    restarted = create_app(settings)
    async with restarted.router.lifespan_context(restarted):
        async with restarted.state.services.engine.connect() as conn:
            row = (await conn.execute(sa.select(module_providers))).one()
            left_in_clear = await provider_store.unsealed(conn)
        opened = provider_secrets.open_configuration(
            restarted.state.services.box,
            (await _load_provider(restarted, org.id, "aws", "old")),
        )

    assert MASKED == answered_before["configuration"]
    assert MASKED == row.configuration
    assert row.configuration_sealed is not None and "canary" not in row.configuration_sealed.lower()
    assert [] == left_in_clear
    assert CREDENTIALS == opened


async def _load_provider(app: FastAPI, org_id: str, provider_type: str, provider_id: str) -> Any:
    async with app.state.services.engine.connect() as conn:
        return await provider_store.get_provider(conn, org_id, provider_type, provider_id)


async def test_module_providers__bad_input_and_duplicate(org: Org) -> None:
    base = f"/orgs/{org.id}/module-providers"
    await _provider(org)
    good = {"provider_type": "aws", "id": "other", "source": "hashicorp/aws", "version_constraint": "~> 5.0"}

    duplicate = await org.admin.post(base, json={**good, "id": "default"})
    bad_constraint = await org.admin.post(base, json={**good, "version_constraint": "latest"})
    bad_source = await org.admin.post(base, json={**good, "source": "https://registry/aws"})
    source_is_fixed = await org.admin.patch(f"{base}/aws/default", json={"source": "hashicorp/google"})

    assert 409 == duplicate.status_code
    assert "module provider 'aws.default' already exists" == duplicate.json()["message"]
    assert bad_constraint.json()["message"].startswith("version_constraint:")
    assert bad_source.json()["message"].startswith("source:")
    assert "source: unknown field" == source_is_fixed.json()["message"]


async def test_module_providers__mapped_by_a_module_cannot_be_deleted(org: Org) -> None:
    await _type(org)
    await _provider(org)
    await _module(org, provider_mapping={"aws": "aws.default"})

    response = await org.admin.delete(f"/orgs/{org.id}/module-providers/aws/default")

    assert 409 == response.status_code
    assert "module provider 'aws.default' is mapped by the modules: pg" == response.json()["message"]


# --- modules and versions ---


async def test_modules__create_get_list_and_patch_write_versions(org: Org) -> None:
    await _type(org)
    await _type(org, "vpc")
    await _provider(org)
    base = f"/orgs/{org.id}/modules"
    created = await _module(
        org,
        description="Postgres on RDS",
        module_params={"size": {"type": "string", "is_optional": True, "description": "Instance size"}},
        module_inputs={"engine": "postgres"},
        provider_mapping={"aws": "aws.default"},
        dependencies={"network": {"type": "vpc", "class": "private", "params": {"cidr": "10.0.0.0/16"}}},
        coprovisioned=[{"type": "vpc", "id": "peering", "is_dependent_on_current": True}],
    )
    got = await org.admin.get(f"{base}/pg")
    patched = await _ok(await org.admin.patch(f"{base}/pg", json={"description": "Postgres 16"}), 200)
    unchanged = await _ok(await org.admin.patch(f"{base}/pg", json={"description": "Postgres 16"}), 200)
    listed = await org.admin.get(base, params={"byResourceType": "postgres"})
    other_type = await org.admin.get(base, params={"byResourceType": "vpc"})
    versions = (await org.admin.get(f"{base}/pg/versions")).json()["items"]
    first = await org.admin.get(f"{base}/pg/versions/{created['version_id']}")

    assert {
        "org_id": org.id,
        "id": "pg",
        "resource_type": "postgres",
        "module_source": GIT_SOURCE,
        "module_params": {"size": {"type": "string", "is_optional": True, "description": "Instance size"}},
        "module_inputs": {"engine": "postgres"},
        "provider_mapping": {"aws": "aws.default"},
        "dependencies": {"network": {"type": "vpc", "class": "private", "params": {"cidr": "10.0.0.0/16"}}},
        "coprovisioned": [
            {
                "type": "vpc",
                "id": "peering",
                "params": {},
                "is_dependent_on_current": True,
                "copy_dependents_from_current": False,
            }
        ],
    }.items() <= created.items()
    assert created == got.json()
    assert patched["version_id"] != created["version_id"]
    assert "Postgres 16" == patched["description"]
    assert datetime.fromisoformat(patched["updated_at"]) > datetime.fromisoformat(created["updated_at"])
    assert patched["version_id"] == unchanged["version_id"]
    assert ["pg"] == [m["id"] for m in listed.json()["items"]]
    assert "module_params" not in listed.json()["items"][0]
    assert [] == other_type.json()["items"]
    assert [patched["version_id"], created["version_id"]] == [v["version_id"] for v in versions]
    assert "Postgres on RDS" == first.json()["description"]
    assert created["dependencies"] == first.json()["dependencies"]


async def test_modules__versions_page_newest_first(org: Org) -> None:
    await _type(org)
    await _module(org)
    for i in range(4):
        await _ok(await org.admin.patch(f"/orgs/{org.id}/modules/pg", json={"description": f"v{i + 2}"}), 200)
    seen = [
        v.get("description") for v in await walk_pages(org.admin, f"/orgs/{org.id}/modules/pg/versions", 2)
    ]

    assert ["v5", "v4", "v3", "v2", None] == seen


async def test_paging__composite_keys_walk_every_item_once(org: Org) -> None:
    """Providers (type, id) and module rules (resource type, module, class, UUID) page by their whole key:
    small pages give every item once, in the order of one large page."""
    await _type(org)
    await _type(org, "redis")
    for provider_type, provider_id in [("aws", "pb"), ("google", "pa"), ("aws", "pa"), ("azurerm", "pa")]:
        await _provider(org, provider_type, provider_id)
    await _module(org)
    await _module(org, "cache", "redis")
    for resource_class in ["large", "small", "medium"]:
        await _rule(org, resource_class=resource_class)
        await _rule(org, "cache", resource_class=resource_class)
    providers = f"/orgs/{org.id}/module-providers"
    rules = f"/orgs/{org.id}/module-rules"

    provider_keys = [(p["provider_type"], p["id"]) for p in await walk_pages(org.admin, providers, 3)]
    rule_ids = [r["id"] for r in await walk_pages(org.admin, rules, 2)]

    assert provider_keys == [("aws", "pa"), ("aws", "pb"), ("azurerm", "pa"), ("google", "pa")]
    assert len(rule_ids) >= 6
    assert rule_ids == [r["id"] for r in await walk_pages(org.admin, rules, 100)]


async def test_modules__inline_source_needs_code_and_only_it_may_have_code(org: Org) -> None:
    await _type(org)
    base = f"/orgs/{org.id}/modules"
    body = {"id": "pg", "resource_type": "postgres"}

    missing_code = await org.admin.post(base, json={**body, "module_source": "inline"})
    code_with_git = await org.admin.post(
        base, json={**body, "module_source": GIT_SOURCE, "module_source_code": 'output "x" { value = 1 }'}
    )
    inline = await _module(org, module_source="inline", module_source_code='output "x" { value = 1 }')
    new_code = await org.admin.patch(f"{base}/pg", json={"module_source_code": 'output "y" { value = 2 }'})
    to_git = await org.admin.patch(f"{base}/pg", json={"module_source": GIT_SOURCE})
    code_on_git = await org.admin.patch(f"{base}/pg", json={"module_source_code": "# nothing"})
    whitespace = await org.admin.patch(f"{base}/pg", json={"module_source": "git::https://x y"})

    assert 400 == missing_code.status_code
    assert "module_source_code: required when module_source is 'inline'" == missing_code.json()["message"]
    assert code_with_git.json()["message"].startswith("module_source_code:")
    assert 'output "x" { value = 1 }' == inline["module_source_code"]
    assert 'output "y" { value = 2 }' == new_code.json()["module_source_code"]
    assert GIT_SOURCE == to_git.json()["module_source"]
    assert "module_source_code" not in to_git.json()
    assert 400 == code_on_git.status_code
    assert code_on_git.json()["message"].startswith("module_source_code: cannot be set without module_source")
    assert whitespace.json()["message"].startswith("module_source:")


async def test_modules__inline_code_that_does_not_parse_is_refused_naming_the_line(org: Org) -> None:
    """Terraform's own parser reads inline code at create and update: a syntax error is a 400 naming the
    field, the line and Terraform's words; nothing is stored."""
    await _type(org)
    base = f"/orgs/{org.id}/modules"
    body = {"id": "pg", "resource_type": "postgres", "module_source": "inline"}
    broken = (
        'variable "name" {\n  type = string\n}\n\n'
        + 'resource "terraform_data" "x" {\n  input = "${var.name"\n}\n'
    )

    created = await org.admin.post(base, json={**body, "module_source_code": broken})
    missing = await org.admin.get(f"{base}/pg")
    good = await _module(org, module_source="inline", module_source_code='output "x" { value = 1 }')
    patched = await org.admin.patch(
        f"{base}/pg", json={"module_source_code": 'output "x" {\n  value = \n}\n'}
    )
    kept = await org.admin.get(f"{base}/pg")

    assert 400 == created.status_code, created.text
    assert created.json()["message"].startswith(
        "module_source_code: does not parse as Terraform code: "
        "line 6: Unclosed template interpolation sequence"
    )
    assert 404 == missing.status_code
    assert 'output "x" { value = 1 }' == good["module_source_code"]
    assert 400 == patched.status_code, patched.text
    assert "line 2: Invalid expression: Expected the start of an expression" in patched.json()["message"]
    assert 'output "x" { value = 1 }' == kept.json()["module_source_code"]


@pytest.mark.parametrize(
    "source", ["../../..", "/etc", "git::file:///etc", "file:///var/lib", "./modules/%2e%2e/%2e%2e/x"]
)
async def test_modules__sources_reading_the_disk_are_refused(org: Org, source: str) -> None:
    """Create and update name ``module_source``; nothing is stored (the module keeps its git source)."""
    await _type(org)
    base = f"/orgs/{org.id}/modules"

    created = await org.admin.post(
        base, json={"id": "bad", "resource_type": "postgres", "module_source": source}
    )
    await _module(org)
    updated = await org.admin.patch(f"{base}/pg", json={"module_source": source})
    stored = (await org.admin.get(f"{base}/pg")).json()

    assert (400, 400) == (created.status_code, updated.status_code)
    assert created.json()["message"].startswith(f"module_source: '{source}' ")
    assert updated.json()["message"].startswith(f"module_source: '{source}' ")
    assert 404 == (await org.admin.get(f"{base}/bad")).status_code
    assert GIT_SOURCE == stored["module_source"]


async def test_modules__inline_code_over_512_kib_is_refused(org: Org) -> None:
    await _type(org)
    code = "# " + "x" * (512 * 1024)

    response = await org.admin.post(
        f"/orgs/{org.id}/modules",
        json={"id": "pg", "resource_type": "postgres", "module_source": "inline", "module_source_code": code},
    )

    assert 413 == response.status_code
    assert response.json()["message"].startswith("module_source_code:")


async def test_modules__params_and_inputs_are_checked(org: Org) -> None:
    await _type(org)
    base = f"/orgs/{org.id}/modules"
    body = {"id": "pg", "resource_type": "postgres", "module_source": GIT_SOURCE}

    bad_type = await org.admin.post(base, json={**body, "module_params": {"size": {"type": "text"}}})
    clash = await org.admin.post(
        base, json={**body, "module_params": {"size": {"type": "string"}}, "module_inputs": {"size": "small"}}
    )
    bad_name = await org.admin.post(base, json={**body, "module_inputs": {"1st": "x"}})
    too_many = await org.admin.post(base, json={**body, "module_inputs": {f"i{n}": n for n in range(21)}})
    extra = await org.admin.post(
        base, json={**body, "module_params": {"size": {"type": "string", "default": 1}}}
    )

    assert 400 == bad_type.status_code
    assert bad_type.json()["message"].startswith("module_params.size.type:")
    assert 400 == clash.status_code
    assert clash.json()["message"].startswith("module_inputs: size also declared in module_params")
    assert "module_inputs: '1st' is not a valid variable name" == bad_name.json()["message"]
    assert too_many.json()["message"].startswith("module_inputs:")
    assert "module_params.size.default: unknown field" == extra.json()["message"]


async def test_modules__references_must_exist(org: Org) -> None:
    await _type(org)
    base = f"/orgs/{org.id}/modules"
    body = {"id": "pg", "resource_type": "postgres", "module_source": GIT_SOURCE}

    no_type = await org.admin.post(base, json={**body, "resource_type": "mysql"})
    no_dependency_type = await org.admin.post(
        base, json={**body, "dependencies": {"net": {"type": "vpc"}}, "coprovisioned": [{"type": "dns"}]}
    )
    no_provider = await org.admin.post(base, json={**body, "provider_mapping": {"aws": "aws.nope"}})
    bad_reference = await org.admin.post(base, json={**body, "provider_mapping": {"aws": "aws"}})

    assert 409 == no_type.status_code
    assert "resource types referenced by the module do not exist: mysql" == no_type.json()["message"]
    assert 409 == no_dependency_type.status_code
    assert no_dependency_type.json()["message"].endswith("do not exist: dns, vpc")
    assert 400 == no_provider.status_code
    assert "provider_mapping: no module provider aws.nope" == no_provider.json()["message"]
    assert bad_reference.json()["message"].startswith("provider_mapping.aws:")
    assert 404 == (await org.admin.get(f"{base}/pg")).status_code


async def test_modules__duplicate_and_missing(org: Org) -> None:
    await _type(org)
    await _module(org)

    duplicate = await org.admin.post(
        f"/orgs/{org.id}/modules", json={"id": "pg", "resource_type": "postgres", "module_source": GIT_SOURCE}
    )

    assert 409 == duplicate.status_code
    assert "module 'pg' already exists" == duplicate.json()["message"]
    assert 404 == (await org.admin.get(f"/orgs/{org.id}/modules/nope")).status_code
    assert 404 == (await org.admin.patch(f"/orgs/{org.id}/modules/nope", json={})).status_code
    assert 404 == (await org.admin.get(f"/orgs/{org.id}/modules/nope/versions")).status_code
    missing_version = await org.admin.get(
        f"/orgs/{org.id}/modules/pg/versions/00000000-0000-0000-0000-000000000001"
    )
    assert 404 == missing_version.status_code


async def test_modules__delete_refused_while_a_rule_names_it(org: Org) -> None:
    await _type(org)
    created = await _module(org)
    rule = await _rule(org)

    refused = await org.admin.delete(f"/orgs/{org.id}/modules/pg")
    await org.admin.delete(f"/orgs/{org.id}/module-rules/{rule['id']}")
    deleted = await org.admin.delete(f"/orgs/{org.id}/modules/pg")

    assert 409 == refused.status_code
    assert (
        f"module 'pg' is used by the module rules: {rule['id']}; delete them first"
        == refused.json()["message"]
    )
    assert 204 == deleted.status_code
    assert (
        404
        == (await org.admin.get(f"/orgs/{org.id}/modules/pg/versions/{created['version_id']}")).status_code
    )


# --- module rules ---


async def test_module_rules__create_get_list_with_filters_and_delete(org: Org) -> None:
    await _env(org)
    await _type(org)
    await _type(org, "s3")
    await _module(org)
    await _module(org, "bucket", "s3")
    base = f"/orgs/{org.id}/module-rules"
    everywhere = await _rule(org)
    in_env = await _rule(org, resource_class="large", project_id="shop", env_id="dev")
    bucket = await _rule(org, "bucket", resource_id="assets.main", env_type_id="development")

    got = await org.admin.get(f"{base}/{everywhere['id']}")
    listed = (await org.admin.get(base)).json()["items"]
    by_module = (await org.admin.get(base, params={"byModuleId": "bucket"})).json()["items"]
    by_type = (await org.admin.get(base, params={"byResourceType": "postgres"})).json()["items"]
    by_env = (await org.admin.get(base, params={"byProjectId": "shop", "byEnvId": "dev"})).json()["items"]
    env_alone = await org.admin.get(base, params={"byEnvId": "dev"})
    deleted = await org.admin.delete(f"{base}/{in_env['id']}")

    assert {
        "org_id": org.id,
        "module_id": "pg",
        "resource_type": "postgres",
        "resource_class": "default",
    }.items() <= everywhere.items()
    assert not {"resource_id", "project_id", "env_type_id", "env_id"} & everywhere.keys()
    assert everywhere == got.json()
    assert [bucket["id"]] == [r["id"] for r in by_module]
    assert {"resource_type": "s3", "resource_id": "assets.main", "env_type_id": "development"}.items() <= (
        bucket.items()
    )
    # Listed by (resource type, module, class, id).
    assert [everywhere["id"], in_env["id"], bucket["id"]] == [r["id"] for r in listed]
    assert {everywhere["id"], in_env["id"]} == {r["id"] for r in by_type}
    assert [in_env["id"]] == [r["id"] for r in by_env]
    assert 400 == env_alone.status_code
    assert "byEnvId: must be used together with byProjectId" == env_alone.json()["message"]
    assert 204 == deleted.status_code
    assert 404 == (await org.admin.get(f"{base}/{in_env['id']}")).status_code
    assert 404 == (await org.admin.delete(f"{base}/{in_env['id']}")).status_code


async def test_module_rules__scope_references_and_duplicates(org: Org) -> None:
    await _env(org)
    await _type(org)
    await _type(org, "s3")
    await _module(org)
    await _module(org, "pg-other")
    await _module(org, "bucket", "s3")
    base = f"/orgs/{org.id}/module-rules"
    first = await _rule(org, project_id="shop")

    env_without_project = await org.admin.post(base, json={"module_id": "pg", "env_id": "dev"})
    env_and_env_type = await org.admin.post(
        base, json={"module_id": "pg", "project_id": "shop", "env_id": "dev", "env_type_id": "development"}
    )
    no_module = await org.admin.post(base, json={"module_id": "nope"})
    no_project = await org.admin.post(base, json={"module_id": "pg", "project_id": "nope"})
    no_env_type = await org.admin.post(base, json={"module_id": "pg", "env_type_id": "nope"})
    no_env = await org.admin.post(base, json={"module_id": "pg", "project_id": "shop", "env_id": "nope"})
    same_key = await org.admin.post(base, json={"module_id": "pg-other", "project_id": "shop"})
    other_type = await org.admin.post(base, json={"module_id": "bucket", "project_id": "shop"})
    bad_class = await org.admin.post(base, json={"module_id": "pg", "resource_class": "-large"})

    assert "project_id: must be set when env_id is set" == env_without_project.json()["message"]
    assert "env_type_id: must not be set when env_id is set" == env_and_env_type.json()["message"]
    assert 400 == no_module.status_code
    assert "module_id: module 'nope' not found" == no_module.json()["message"]
    assert (409, "project 'nope' not found") == (no_project.status_code, no_project.json()["message"])
    assert (409, "environment type 'nope' not found") == (
        no_env_type.status_code,
        no_env_type.json()["message"],
    )
    assert (409, "environment 'nope' not found in project 'shop'") == (
        no_env.status_code,
        no_env.json()["message"],
    )
    assert 409 == same_key.status_code
    assert (
        f"module rule conflicts with existing rule '{first['id']}' for module 'pg'"
        == same_key.json()["message"]
    )
    assert 201 == other_type.status_code
    assert bad_class.json()["message"].startswith("resource_class:")


async def test_module_rules__immutable_and_go_with_their_environment(org: Org) -> None:
    await _env(org)
    await _type(org)
    await _module(org)
    rule = await _rule(org, project_id="shop", env_id="dev")

    patch = await org.admin.patch(f"/orgs/{org.id}/module-rules/{rule['id']}", json={"resource_class": "x"})
    await _ok(await org.admin.delete(f"/orgs/{org.id}/projects/shop/envs/dev"), 204)

    assert 405 == patch.status_code
    assert 404 == (await org.admin.get(f"/orgs/{org.id}/module-rules/{rule['id']}")).status_code


# --- available resource types ---


async def test_available_resource_types__most_specific_option_per_class_and_id(org: Org) -> None:
    await _env(org)
    await _env(org, env_id="prod", env_type_id="production")
    await _type(org, description="Postgres")
    await _type(org, "s3")
    await _type(org, "vpc", is_developer_accessible=False)
    await _type(org, "queue")
    params = {"size": {"type": "string", "is_optional": True}}
    for module_id in ("pg-shared", "pg-dev", "pg-large"):
        await _module(org, module_id, module_params=params)
    await _module(org, "bucket", "s3")
    await _module(org, "net", "vpc")
    await _module(org, "mq", "queue")
    await _rule(org, "pg-shared")
    dev_rule = await _rule(org, "pg-dev", env_type_id="development")
    large = await _rule(org, "pg-large", resource_class="large", resource_id="main")
    await _rule(org, "bucket", project_id="shop", env_id="dev")
    await _rule(org, "net")
    await _rule(org, "mq", project_id="shop", env_id="prod")
    url = f"/orgs/{org.id}/projects/shop/envs/dev/available-resource-types"

    response = await org.admin.get(url)
    with_hidden = await org.admin.get(url, params={"include_non_developer_accessible": "true"})
    only_s3 = await org.admin.get(url, params={"type_id": "s3"})
    missing_env = await org.admin.get(f"/orgs/{org.id}/projects/shop/envs/nope/available-resource-types")

    items = response.json()["items"]
    assert ["postgres", "s3"] == [t["id"] for t in items]
    assert {"id": "postgres", "description": "Postgres", "output_schema": {"type": "object"}}.items() <= (
        items[0].items()
    )
    assert [
        {
            "resource_class": "default",
            "rule_id": dev_rule["id"],
            "module_id": "pg-dev",
            "module_params": {"size": {"type": "string", "is_optional": True}},
        },
        {
            "resource_id": "main",
            "resource_class": "large",
            "rule_id": large["id"],
            "module_id": "pg-large",
            "module_params": {"size": {"type": "string", "is_optional": True}},
        },
    ] == items[0]["options"]
    assert ["postgres", "s3", "vpc"] == [t["id"] for t in with_hidden.json()["items"]]
    assert ["s3"] == [t["id"] for t in only_s3.json()["items"]]
    assert 404 == missing_env.status_code


# --- isolation and roles ---

# (method, path under /orgs/{org}, body, permission); {rule} and {version} are ids of real objects of `org`.
ROUTES: list[tuple[str, str, Any, str]] = [
    ("GET", "resource-types", None, "read"),
    ("POST", "resource-types", {"id": "redis", "output_schema": {}}, "manage"),
    ("GET", "resource-types/postgres", None, "read"),
    ("PATCH", "resource-types/postgres", {"description": "x"}, "manage"),
    ("DELETE", "resource-types/unused", None, "manage"),
    ("GET", "module-providers", None, "read"),
    (
        "POST",
        "module-providers",
        {"provider_type": "aws", "id": "b", "source": "a/b", "version_constraint": "= 1"},
        "manage",
    ),
    ("GET", "module-providers/aws/default", None, "read"),
    ("PATCH", "module-providers/aws/default", {"description": "x"}, "manage"),
    ("DELETE", "module-providers/aws/default", None, "manage"),
    ("GET", "modules", None, "read"),
    ("POST", "modules", {"id": "pg2", "resource_type": "postgres", "module_source": GIT_SOURCE}, "manage"),
    ("GET", "modules/pg", None, "read"),
    ("PATCH", "modules/pg", {"description": "x"}, "manage"),
    ("DELETE", "modules/spare", None, "manage"),
    ("GET", "modules/pg/versions", None, "read"),
    ("GET", "modules/pg/versions/{version}", None, "read"),
    ("GET", "module-rules", None, "read"),
    ("POST", "module-rules", {"module_id": "pg", "resource_class": "large"}, "manage"),
    ("GET", "module-rules/{rule}", None, "read"),
    ("DELETE", "module-rules/{rule}", None, "manage"),
    ("GET", "projects/shop/envs/dev/available-resource-types", None, "read"),
]
ALLOWED = {"admin": {"read", "manage"}, "deployer": {"read"}, "viewer": {"read"}}


async def _populate(org: Org) -> dict[str, str]:
    await _env(org)
    await _type(org)
    await _type(org, "unused")
    await _provider(org)
    created = await _module(org)
    await _module(org, "spare")
    rule = await _rule(org)
    return {"rule": rule["id"], "version": created["version_id"]}


async def _call(
    client: httpx.AsyncClient, org_id: str, route: tuple[str, str, Any, str], ids: dict[str, str]
) -> httpx.Response:
    method, path, body, _ = route
    return await client.request(method, f"/orgs/{org_id}/{path.format(**ids)}", json=body)


async def test_catalogue__other_organization_gets_404_and_changes_nothing(org: Org, other_org: Org) -> None:
    ids = await _populate(org)
    reads = [r for r in ROUTES if r[0] == "GET"]
    before = [(await _call(org.admin, org.id, r, ids)).json() for r in reads]

    foreign = {r[:2]: await _call(other_org.admin, org.id, r, ids) for r in ROUTES}
    after = [(await _call(org.admin, org.id, r, ids)).json() for r in reads]
    # The other organization's own paths do not reach `org`'s objects either.
    own_path = [
        (await other_org.admin.request(method, f"/orgs/{other_org.id}/{path.format(**ids)}")).status_code
        for method, path in [
            ("GET", "resource-types/postgres"),
            ("GET", "module-providers/aws/default"),
            ("GET", "modules/pg"),
            ("GET", "modules/pg/versions/{version}"),
            ("GET", "module-rules/{rule}"),
            ("DELETE", "module-rules/{rule}"),
            ("DELETE", "modules/spare"),
        ]
    ]

    assert {} == {key: r.text for key, r in foreign.items() if r.status_code != 404}
    assert {f"organization '{org.id}' not found"} == {r.json()["message"] for r in foreign.values()}
    assert before == after
    assert [404] * 7 == own_path


async def test_catalogue__viewer_and_deployer_read_but_cannot_write(org: Org) -> None:
    ids = await _populate(org)

    for role in ("viewer", "deployer"):
        statuses = {
            r[:2]: (r[3], (await _call(org.clients[role], org.id, r, ids)).status_code) for r in ROUTES
        }

        refused = {
            key for key, (perm, status) in statuses.items() if perm not in ALLOWED[role] and status != 403
        }
        admitted = {
            key for key, (perm, status) in statuses.items() if perm in ALLOWED[role] and status != 200
        }
        assert (set(), set()) == (refused, admitted), role


async def test_catalogue__anonymous_is_401_everywhere(app: FastAPI, org: Org) -> None:
    ids = await _populate(org)
    anonymous = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test")

    statuses = {(await _call(anonymous, org.id, r, ids)).status_code for r in ROUTES}

    assert {401} == statuses


def test_catalogue__table_covers_every_catalogue_route(app: FastAPI) -> None:
    # The OpenAPI document, not app.routes: FastAPI 0.165 keeps included routers unflattened there.
    families = (
        "/orgs/{org_id}/resource-types",
        "/orgs/{org_id}/module",
        "/orgs/{org_id}/projects/{project_id}/envs/{env_id}/available-resource-types",
    )
    declared = {
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        if path.startswith(families)
        for method in operations
    }
    listed = {(method, _shape(f"/orgs/{{org_id}}/{path}")) for method, path, _, _ in ROUTES}

    assert set() == {(m, p) for m, p in declared if (m, _shape(p)) not in listed}
    assert len(ROUTES) == len(declared)


def _shape(path: str) -> str:
    """Every segment after a collection name (a path parameter or a concrete id) counts the same."""
    parts = path.split("/")
    collections = {"orgs", "resource-types", "modules", "versions", "module-rules", "projects", "envs"}
    shaped = ["*" if i > 0 and parts[i - 1] in collections else part for i, part in enumerate(parts)]
    # Providers are addressed by two segments: /module-providers/{provider_type}/{provider_id}.
    if len(parts) > 4 and parts[3] == "module-providers":
        shaped[4:6] = ["*", "*"]
    return "/".join(shaped)
