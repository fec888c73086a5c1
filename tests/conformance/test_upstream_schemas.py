"""Our answers against upstream's OpenAPI documents, with Schemathesis: every operation of upstream's
control-plane and data-plane documents that we serve, against the real server (uvicorn on 127.0.0.1)
seeded with real objects, on each database; zero 5xx, zero response-schema, status-code, content-type and
response-header violations.

The documents are upstream's, read where the project's reference material lies
(``../shared/reference/openapi/`` beside the checkout, as on every developer machine and in CI;
``PO_TEST_UPSTREAM_OPENAPI_DIR`` elsewhere): they are not copied into the project. Only an in-memory copy
is changed: ``_with_our_extensions`` adds what they cannot know about (our deliberate extensions, listed
in README "Compatibility with upstream") and drops the one format upstream's own answers break
(``module_source`` ``inline`` is no URI); ``_load`` spells upstream's RE2 Unicode classes the way
Python's ``re`` reads them.
Not exercised: answers to missing or wrong tokens (every request here is authorized).
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import requests
import schemathesis
import yaml
from hypothesis import given
from pydantic import SecretStr
from schemathesis import Response
from schemathesis.checks import not_a_server_error
from schemathesis.core import NotSet
from schemathesis.core.failures import Failure
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.deployments import insert_deployment
from tests.support.live_server import serve_in_thread
from tests.support.managed import MANAGED_SECRET
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.schemathesis_runs import failures, repeatable
from tests.support.tools import tools_required
from tests.support.upstream import UPSTREAM

if TYPE_CHECKING:
    from schemathesis.specs.openapi.schemas import OpenApiCase, OpenApiOperation

RUNNERS = Path(__file__).parent.parent / "data" / "runners"
ORG = "acme"
#: Generated requests per operation (and the explicit ones below): 57 operations, ~25 s per database.
MAX_EXAMPLES = 20
CALL_TIMEOUT = 60  # seconds

#: Upstream's operations we serve (method, upstream path), checked here; NOT_SERVED lists the others.
CONTROL_PLANE = [
    ("POST", "/orgs"),
    ("GET", "/orgs/{orgId}"),
    ("GET", "/orgs/{orgId}/env-types"),
    ("POST", "/orgs/{orgId}/env-types"),
    ("GET", "/orgs/{orgId}/env-types/{envTypeId}"),
    ("PATCH", "/orgs/{orgId}/env-types/{envTypeId}"),
    ("DELETE", "/orgs/{orgId}/env-types/{envTypeId}"),
    ("GET", "/orgs/{orgId}/projects"),
    ("POST", "/orgs/{orgId}/projects"),
    ("GET", "/orgs/{orgId}/projects/{projectId}"),
    ("PATCH", "/orgs/{orgId}/projects/{projectId}"),
    ("DELETE", "/orgs/{orgId}/projects/{projectId}"),
    ("GET", "/orgs/{orgId}/projects/{projectId}/envs"),
    ("POST", "/orgs/{orgId}/projects/{projectId}/envs"),
    ("GET", "/orgs/{orgId}/projects/{projectId}/envs/{envId}"),
    ("PATCH", "/orgs/{orgId}/projects/{projectId}/envs/{envId}"),
    ("DELETE", "/orgs/{orgId}/projects/{projectId}/envs/{envId}"),
    ("GET", "/orgs/{orgId}/envs"),
    ("POST", "/orgs/{orgId}/projects/{projectId}/envs/{envId}/actions/refresh_runner"),
    ("GET", "/orgs/{orgId}/projects/{projectId}/envs/{envId}/available-resource-types"),
    ("GET", "/orgs/{orgId}/resource-types"),
    ("POST", "/orgs/{orgId}/resource-types"),
    ("GET", "/orgs/{orgId}/resource-types/{typeId}"),
    ("PATCH", "/orgs/{orgId}/resource-types/{typeId}"),
    ("DELETE", "/orgs/{orgId}/resource-types/{typeId}"),
    ("GET", "/orgs/{orgId}/module-providers"),
    ("POST", "/orgs/{orgId}/module-providers"),
    ("GET", "/orgs/{orgId}/module-providers/{providerType}/{providerId}"),
    ("PATCH", "/orgs/{orgId}/module-providers/{providerType}/{providerId}"),
    ("DELETE", "/orgs/{orgId}/module-providers/{providerType}/{providerId}"),
    ("GET", "/orgs/{orgId}/runners"),
    ("POST", "/orgs/{orgId}/runners"),
    ("GET", "/orgs/{orgId}/runners/{runnerId}"),
    ("PATCH", "/orgs/{orgId}/runners/{runnerId}"),
    ("DELETE", "/orgs/{orgId}/runners/{runnerId}"),
    ("GET", "/orgs/{orgId}/runner-rules"),
    ("POST", "/orgs/{orgId}/runner-rules"),
    ("GET", "/orgs/{orgId}/runner-rules/{ruleId}"),
    ("DELETE", "/orgs/{orgId}/runner-rules/{ruleId}"),
    ("GET", "/orgs/{orgId}/modules"),
    ("POST", "/orgs/{orgId}/modules"),
    ("GET", "/orgs/{orgId}/modules/{moduleId}"),
    ("PATCH", "/orgs/{orgId}/modules/{moduleId}"),
    ("DELETE", "/orgs/{orgId}/modules/{moduleId}"),
    ("GET", "/orgs/{orgId}/modules/{moduleId}/versions"),
    ("GET", "/orgs/{orgId}/modules/{moduleId}/versions/{moduleVersionId}"),
    ("GET", "/orgs/{orgId}/module-rules"),
    ("POST", "/orgs/{orgId}/module-rules"),
    ("GET", "/orgs/{orgId}/module-rules/{ruleId}"),
    ("DELETE", "/orgs/{orgId}/module-rules/{ruleId}"),
]
DATA_PLANE = [
    ("GET", "/orgs/{orgId}/deployments"),
    ("POST", "/orgs/{orgId}/deployments"),
    ("GET", "/orgs/{orgId}/deployments/{deploymentId}"),
    ("GET", "/orgs/{orgId}/deployments/{deploymentId}/actions/wait-for-complete"),
    ("GET", "/orgs/{orgId}/deployments/{deploymentId}/actions/get-logs"),
    ("GET", "/orgs/{orgId}/deployments/{deploymentId}/encrypted-outputs"),
    ("GET", "/orgs/{orgId}/deployments/{deploymentId}/tf"),
]

#: Upstream's operations we do not serve, by reason; with the two lists above, every operation of the
#: documents (test_upstream_documents__every_operation_is_checked_or_listed_here).
NOT_SERVED = {
    "upstream's internal routes (its services' back door behind its edge, no part of the public API)": [
        ("GET", "/internal/orgs"),
        ("POST", "/internal/orgs"),
        ("GET", "/internal/orgs/{orgId}"),
        ("GET", "/internal/orgs/{orgId}/projects/{projectUuid}"),
        ("GET", "/internal/orgs/{orgId}/projects/{projectUuid}/envs"),
        ("GET", "/internal/orgs/{orgId}/envs/{envUuid}"),
        ("GET", "/internal/resource-types"),
        ("POST", "/internal/resource-types"),
        ("DELETE", "/internal/resource-types/{typeId}"),
        ("PATCH", "/internal/resource-types/{typeId}"),
        ("GET", "/internal/orgs/{orgId}/runners/{runnerId}"),
        ("POST", "/internal/orgs/{orgId}/projects/{projectId}/envs/{envId}/actions/force-delete"),
        ("PATCH", "/internal/orgs/{orgId}/projects/{projectId}/envs/{envId}"),
        ("POST", "/internal/orgs/{orgId}/projects/{projectId}/envs/{envId}/module-catalogue"),
        ("POST", "/internal/orgs/{orgId}/deployments/{deploymentId}/actions/force-failure"),
        ("POST", "/internal/orgs/{orgId}/modules/{moduleId}/actions/check-usage"),
        ("DELETE", "/internal/orgs/{orgId}/deployments"),
    ],
    "features we do not have (last deployments, diffs, resource graphs, metadata keys)": [
        ("GET", "/orgs/{orgId}/last-deployments"),
        ("POST", "/orgs/{orgId}/deployments/{deploymentId}/actions/diff"),
        ("GET", "/orgs/{orgId}/deployments/{deploymentId}/resources"),
        ("GET", "/orgs/{orgId}/active-resources"),
        ("GET", "/orgs/{orgId}/metadata-keys"),
        ("POST", "/orgs/{orgId}/metadata-keys"),
        ("GET", "/orgs/{orgId}/metadata-keys/{metadataKeyName}"),
        ("DELETE", "/orgs/{orgId}/metadata-keys/{metadataKeyName}"),
        ("PATCH", "/orgs/{orgId}/metadata-keys/{metadataKeyName}"),
    ],
    "upstream's legacy direct-runner routes (runners since v3 use the gateway: ours, /runner-gateway/v1/)": [
        ("GET", "/orgs/{orgId}/deployments/{deploymentId}/bundle"),
        ("POST", "/orgs/{orgId}/deployments/{deploymentId}/results"),
    ],
    "upstream's OIDC issuer for cloud federation, which we do not have": [
        ("GET", "/.well-known/openid-configuration"),
        ("GET", "/.well-known/jwks"),
    ],
}

#: Requests written from upstream's documents that create something, beside the generated ones (which rarely
#: are valid enough to: a runner configuration, a manifest). Their answers are checked like the others.
EXPLICIT: dict[str, list[dict[str, Any]]] = {
    "POST /orgs/{orgId}/runners": [
        {"id": "agent2", **yaml.safe_load((RUNNERS / "seed000-agent.yaml").read_text())},
    ],
    "PATCH /orgs/{orgId}/runners/{runnerId}": [{"description": "patched by schemathesis"}],
    "POST /orgs/{orgId}/runner-rules": [{"runner_id": "agent", "project_id": "shop"}],
    "POST /orgs/{orgId}/modules": [
        {
            "id": "pg-git",
            "resource_type": "postgres",
            "module_source": "git::https://github.com/acme/modules.git//postgres?ref=v1",
            "provider_mapping": {"aws": "aws.default"},
        }
    ],
    "POST /orgs/{orgId}/module-rules": [
        {"module_id": "pg", "resource_class": "large", "project_id": "shop", "env_id": "dev"}
    ],
    "POST /orgs/{orgId}/deployments": [
        {
            "mode": "deploy",
            "project_id": "shop",
            "env_id": "dev",
            "is_dry_run": dry_run,
            "manifest": {
                "workloads": {"app": {"resources": {"db": {"type": "postgres", "params": {"size": 1}}}}}
            },
        }
        for dry_run in (True, False)
    ],
}
#: Creating an organization is the platform admin's (the bootstrap token); every other request is an
#: organization admin's.
PLATFORM_ONLY = {"POST /orgs"}

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


#: Upstream's display-name pattern uses Unicode classes (``\\p{Cc}``, ``\\p{Cs}``, ``\\p{Z}``, RE2 syntax)
#: that Python's ``re`` (which Schemathesis generates from) lacks: spelled out as the same code points.
_UNICODE_CLASSES = {
    r"\p{Cc}": r"\x00-\x1f\x7f-\x9f",
    r"\p{Cs}": r"\ud800-\udfff",
    r"\p{Z}": r"\x20\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000",
}


def _load(name: str) -> dict[str, Any]:
    if not (UPSTREAM / name).is_file():
        message = (
            f"upstream's OpenAPI document {UPSTREAM / name} is missing (set PO_TEST_UPSTREAM_OPENAPI_DIR)"
        )
        if tools_required():
            pytest.fail(message)
        pytest.skip(message)
    document: dict[str, Any] = yaml.safe_load((UPSTREAM / name).read_text())
    _python_patterns(document)
    return document


def _python_patterns(node: Any) -> None:
    if isinstance(node, dict):
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            for upstream_class, ranges in _UNICODE_CLASSES.items():
                pattern = pattern.replace(upstream_class, ranges)
            node["pattern"] = pattern
        for value in node.values():
            _python_patterns(value)
    elif isinstance(node, list):
        for value in node:
            _python_patterns(value)


#: Our deliberate extensions (README "Compatibility with upstream"), added to the in-memory copy:
#: runner types and a state storage type upstream does not have. Their configurations are ours (our own
#: OpenAPI describes them); here only their ``type`` is checked.
EXTRA_RUNNER_TYPES = ["kubernetes-aks", "vm"]
EXTRA_STATE_STORAGE_TYPES = ["orchestrator"]
#: Statuses we answer on every route, with upstream's ``Error`` body, though upstream's documents list them
#: only on some: 400 for input we refuse (out of our limits: ``per_page`` over 1000, unknown fields in a body,
#: an invalid page token, ...) and 404 for an object a path or body names that does not exist.
EVERYWHERE = {"400": "Bad input, refused with the field named", "404": "A named object does not exist"}


def _with_our_extensions(document: dict[str, Any]) -> dict[str, Any]:
    document = copy.deepcopy(document)
    schemas = document["components"]["schemas"]
    for item in document["paths"].values():
        for method, operation in item.items():
            if method in ("get", "post", "put", "patch", "delete"):
                responses = operation["responses"]
                for status, description in EVERYWHERE.items():
                    if status not in responses and int(status) not in responses:
                        responses[status] = {
                            "description": description,
                            "content": {
                                "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                            },
                        }
    if "ModuleVersionSummaryCoreFields" in schemas:
        # Upstream's own inline modules answer module_source "inline" (ModuleCoreFields: "module_source_code
        # ... if the module_source is 'inline'"), which its `format: uri` refuses: the format is dropped.
        del schemas["ModuleVersionSummaryCoreFields"]["properties"]["module_source"]["format"]
    if "RunnerType" in schemas:
        schemas["RunnerType"]["enum"] += EXTRA_RUNNER_TYPES
        schemas["StateStorageType"]["enum"] += EXTRA_STATE_STORAGE_TYPES
        for union, extra_types, kind in (
            ("RunnerConfiguration", EXTRA_RUNNER_TYPES, "RunnerType"),
            ("StateStorageConfiguration", EXTRA_STATE_STORAGE_TYPES, "StateStorageType"),
        ):
            for extra in extra_types:
                name = f"Ours{kind}{extra.title().replace('-', '')}"
                schemas[name] = {
                    "type": "object",
                    "required": ["type"],
                    "properties": {"type": {"enum": [extra]}},
                }
                schemas[union]["oneOf"].append({"$ref": f"#/components/schemas/{name}"})
                schemas[union]["discriminator"]["mapping"][extra] = f"#/components/schemas/{name}"
    return document


def _only(document: dict[str, Any], operations: list[tuple[str, str]]) -> dict[str, Any]:
    """``document`` with only ``operations``; each must be in it (a typo would silently test less)."""
    kept: dict[str, Any] = {}
    for method, path in operations:
        item = document["paths"][path]
        assert method.lower() in item, f"{method} {path} is not in the upstream document"
        shared = {k: v for k, v in item.items() if k in ("parameters", "summary", "description")}
        kept.setdefault(path, dict(shared))[method.lower()] = item[method.lower()]
    return {**document, "paths": kept}


#: The objects that PATCH and DELETE requests change, beside those the other requests read (a PATCH of the
#: shared resource type may well make it unavailable in manifests).
SCRATCH = {
    "/orgs/{orgId}/env-types/{envTypeId}": {"envTypeId": "scratch-type"},
    "/orgs/{orgId}/projects/{projectId}": {"projectId": "scratch-project"},
    "/orgs/{orgId}/projects/{projectId}/envs/{envId}": {"envId": "scratch-env"},
    "/orgs/{orgId}/resource-types/{typeId}": {"typeId": "scratch-db"},
    "/orgs/{orgId}/module-providers/{providerType}/{providerId}": {"providerId": "scratch-provider"},
    "/orgs/{orgId}/modules/{moduleId}": {"moduleId": "scratch-module"},
    "/orgs/{orgId}/runners/{runnerId}": {"runnerId": "scratch-runner"},
}


@dataclass
class Seed:
    """Real objects of organization ``acme`` that path parameters are pointed at."""

    values: dict[str, str] = field(default_factory=dict)
    #: per upstream path: parameter values that differ from ``values`` (rule ids, delete victims).
    per_path: dict[str, dict[str, str]] = field(default_factory=dict)

    def path_parameters(self, operation: str) -> dict[str, str]:
        return {**self.values, **self.per_path.get(operation, {})}


async def _seed(settings: ServerSettings) -> tuple[Seed, str]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://po.test",
            headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
        ) as platform:

            async def post(path: str, body: dict[str, Any], status: int = 201) -> dict[str, Any]:
                response = await platform.post(f"/orgs/{ORG}{path}" if path else "/orgs", json=body)
                assert status == response.status_code, f"{path}: {response.text}"
                answer: dict[str, Any] = response.json()
                return answer

            await post("", {"id": ORG})
            token = (await post("/tokens", {"role": "admin", "description": "schemathesis"}))["token"]
            agent = yaml.safe_load((RUNNERS / "seed000-agent.yaml").read_text())
            kubernetes = yaml.safe_load((RUNNERS / "kubernetes-token.yaml").read_text())
            for runner_id in ("agent", "scratch-runner"):
                await post("/runners", {"id": runner_id, **agent})
            await post("/runners", {"id": "cluster", **kubernetes})
            for extension in ("kubernetes-aks", "vm-ssh"):  # our runner types, listed with upstream's
                await post(
                    "/runners",
                    {"id": extension, **yaml.safe_load((RUNNERS / f"{extension}.yaml").read_text())},
                )
            for env_type in ("development", "staging", "scratch-type"):
                await post("/env-types", {"id": env_type, "display_name": env_type.title()})
            runner_rule = await post("/runner-rules", {"runner_id": "agent"})
            scratch_runner_rule = await post(
                "/runner-rules", {"runner_id": "cluster", "env_type_id": "staging"}
            )
            for project in ("shop", "scratch-project"):
                await post("/projects", {"id": project})
            env = await post("/projects/shop/envs", {"id": "dev", "env_type_id": "development"})
            await post("/projects/shop/envs", {"id": "scratch-env", "env_type_id": "development"})
            for type_id in ("postgres", "scratch-db"):
                await post("/resource-types", {"id": type_id, "output_schema": {"type": "object"}})
            for provider_id in ("default", "scratch-provider"):
                await post(
                    "/module-providers",
                    {
                        "provider_type": "aws",
                        "id": provider_id,
                        "source": "hashicorp/aws",
                        "version_constraint": "~> 5.0",
                        "configuration": {"region": "eu-west-1"},
                    },
                )
            inline = (
                'variable "size" {\n  type = number\n}\nvariable "region" {\n  type = string\n}\n'
                'output "host" {\n  value = "db"\n}\n'
            )
            for module_id in ("pg", "scratch-module"):
                await post(
                    "/modules",
                    {
                        "id": module_id,
                        "resource_type": "postgres",
                        "module_source": "inline",
                        "module_source_code": inline,
                        "module_params": {"size": {"type": "number"}},
                        "module_inputs": {"region": "eu-west-1"},
                        "provider_mapping": {"aws": "aws.default"},
                    },
                )
            versions = await platform.get(f"/orgs/{ORG}/modules/pg/versions")
            version_id = versions.json()["items"][0]["version_id"]
            module_rule = await post("/module-rules", {"module_id": "pg", "env_type_id": "development"})
            scratch_module_rule = await post("/module-rules", {"module_id": "pg", "project_id": "shop"})
            me = (await platform.get(f"/orgs/{ORG}/tokens")).json()["items"][0]["id"]
            deployment_id = await insert_deployment(app, ORG, env, runner_id="agent", created_by=me)
    seed = Seed(
        values={
            "orgId": ORG,
            "projectId": "shop",
            "envId": "dev",
            "envTypeId": "development",
            "typeId": "postgres",
            "providerType": "aws",
            "providerId": "default",
            "moduleId": "pg",
            "moduleVersionId": version_id,
            "runnerId": "agent",
            "deploymentId": deployment_id,
        },
        per_path={
            "GET /orgs/{orgId}/runner-rules/{ruleId}": {"ruleId": runner_rule["id"]},
            "DELETE /orgs/{orgId}/runner-rules/{ruleId}": {"ruleId": scratch_runner_rule["id"]},
            "GET /orgs/{orgId}/module-rules/{ruleId}": {"ruleId": module_rule["id"]},
            "DELETE /orgs/{orgId}/module-rules/{ruleId}": {"ruleId": scratch_module_rule["id"]},
            **{
                f"{method} {path}": values
                for path, values in SCRATCH.items()
                for method in ("PATCH", "DELETE")
            },
        },
    )
    return seed, token


@dataclass
class Findings:
    """What the run saw: violations (one per operation, check and place in the answer, list indexes folded,
    with an example) and the statuses answered per operation."""

    violations: dict[str, str] = field(default_factory=dict)
    statuses: dict[str, list[int]] = field(default_factory=dict)

    def record(self, name: str, failure: Failure, case: OpenApiCase, response: Response) -> None:
        where = [
            ("*" if isinstance(part, int) else str(part)) for part in getattr(failure, "instance_path", [])
        ]
        key = f"{name}: {failure.title}" + (f" at {'/'.join(where)}" if where else "")
        message = failure.message.splitlines()[0] if failure.message else ""
        body = "" if isinstance(case.body, NotSet) else f" body={str(case.body)[:200]}"
        self.violations.setdefault(
            key, f"{message} -- {response.status_code} {response.text[:200]!r} for query={case.query}{body}"
        )


def _exercise(operation: OpenApiOperation, base_url: str, token: str, seed: Seed, findings: Findings) -> None:
    """The explicit requests of ``operation`` and MAX_EXAMPLES generated ones, path parameters pointed at
    the seeded objects; every answer checked."""
    name = f"{operation.method.upper()} {operation.path}"
    headers = {"Authorization": f"Bearer {BOOTSTRAP_TOKEN if name in PLATFORM_ONLY else token}"}
    declared = {parameter.name for parameter in operation.path_parameters}
    fixed = {key: value for key, value in seed.path_parameters(name).items() if key in declared}

    def check(case: OpenApiCase) -> None:
        try:  # generous: CI runs this beside other workers; a hang still fails, naming the operation
            response = case.call(base_url=base_url, headers=headers, timeout=CALL_TIMEOUT)
        except requests.Timeout as exc:
            raise AssertionError(f"{name}: no answer in {CALL_TIMEOUT} s ({case.path_parameters})") from exc
        findings.statuses.setdefault(name, []).append(response.status_code)
        for failure in failures(case, response, CHECKS):
            findings.record(name, failure, case, response)

    for body in EXPLICIT.get(name, []):
        check(operation.Case(path_parameters=fixed, body=body, media_type="application/json"))

    @repeatable(max_examples=MAX_EXAMPLES)
    @given(case=operation.as_strategy(path_parameters=fixed))
    def generated(case: OpenApiCase) -> None:
        check(case)

    generated()


@pytest.mark.timeout(600)
def test_upstream_documents__our_answers_conform(settings: ServerSettings) -> None:
    # Managed runners on: the platform's pool (type "managed", not upstream's) is in every organization,
    # and upstream's clients must still read every answer, the runner list's included.
    settings = settings.model_copy(update={"managed_runner_secret": SecretStr(MANAGED_SECRET)})
    seed, token = asyncio.run(_seed(settings))
    documents = [
        _with_our_extensions(_only(_load("control-plane.yaml"), CONTROL_PLANE)),
        _with_our_extensions(_only(_load("data-plane.yaml"), DATA_PLANE)),
    ]
    findings = Findings()
    with serve_in_thread(create_app(settings)) as base_url:
        for document in documents:
            for result in schemathesis.openapi.from_dict(document).get_all_operations():
                if isinstance(result, Err):
                    raise result.err()
                _exercise(result.ok(), base_url, token, seed, findings)

    violations = [f"{key}\n    {example}" for key, example in sorted(findings.violations.items())]
    assert not violations, f"{len(violations)} violations:\n" + "\n".join(violations)
    # Not a pass on 400s and 404s alone: every operation was run and answered a real object at least once.
    assert len(CONTROL_PLANE) + len(DATA_PLANE) == len(findings.statuses)
    assert [] == sorted(
        name for name, codes in findings.statuses.items() if not any(200 <= code < 300 for code in codes)
    )


def test_upstream_documents__every_operation_is_checked_or_listed_here() -> None:
    documented = {
        (method.upper(), path)
        for name in ("control-plane.yaml", "data-plane.yaml")
        for path, item in _load(name)["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    }
    listed = [*CONTROL_PLANE, *DATA_PLANE, *(op for ops in NOT_SERVED.values() for op in ops)]

    assert sorted(documented) == sorted(listed)
