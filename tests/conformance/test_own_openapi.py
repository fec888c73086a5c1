"""Schemathesis against our own ``/openapi.json``: every operation, on a real server seeded with one object of
each kind (an organization, a project, an environment type and environment, a local runner and its rule, the
demo module and its rule, a module provider, a token, and a deployment that ran). No answer may be a 5xx,
break its documented response schema or content type, or have a status the operation does not document.

Generated cases of the positive mode address the seeded objects (their path parameters are replaced by the
seeds' ids), so that they reach the routes' code beyond the 404 of an unknown id; negative cases keep what
Schemathesis generated. The API is called with the platform token, the gateway's deployment routes with the
seeded deployment's token (and its state backend with basic auth), as their runner would. Operations run in
the document's order, deletions last (so that they do not remove what the others read). Each operation gets
``MAX_EXAMPLES`` derandomized examples per generation mode: the run is the same every time.
"""

from __future__ import annotations

import base64
import re
import secrets
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import schemathesis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis.errors import HypothesisException
from pydantic import SecretStr
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from orchestrator import deployment_tokens
from orchestrator.protocol import age, agent_auth
from orchestrator.protocol.results import DEPLOYMENT_TOKEN_HEADER
from orchestrator.settings import ServerSettings
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.schemathesis_runs import failures, repeatable
from tests.support.stack import build_stack, demo_manifest, running_server

if TYPE_CHECKING:
    from schemathesis.specs.openapi.schemas import OpenApiCase, OpenApiOperation

#: Examples per operation and generation mode (positive, negative).
MAX_EXAMPLES = 10
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, content_type_conformance]
SERVER_KEY = secrets.token_bytes(32)
AGENT_RUNNER = "agent1"
IDEMPOTENCY_KEY = "conformance-seed"
_, _RECIPIENT = age.generate_identity()
#: The seeded deployment's request.
DEPLOY_REQUEST: dict[str, Any] = {
    "project_id": "shop",
    "env_id": "dev",
    "mode": "deploy",
    "manifest": demo_manifest(),
    "encrypted_outputs_recipient": _RECIPIENT,
    "encrypted_logs_recipient": _RECIPIENT,
}
#: Requests whose answers random generation seldom reaches, checked like the generated ones:
#: (operation, headers, body) against the seeded objects.
KNOWN_REQUESTS: list[tuple[str, dict[str, str], dict[str, Any]]] = [
    # A dry run answers 200 with what would run.
    ("POST /orgs/{org_id}/deployments", {}, {**DEPLOY_REQUEST, "is_dry_run": True}),
    # The seeded deployment's request again: 201 with the deployment it created (as upstream answers).
    ("POST /orgs/{org_id}/deployments", {"Idempotency-Key": IDEMPOTENCY_KEY}, DEPLOY_REQUEST),
]
AGENT_ROUTES = "/runner-gateway/v1/orgs/{org_id}/runners/{runner_id}"
#: Managed runners are on: their routes are probed with a registered runner's token.
MANAGED_SECRET = secrets.token_urlsafe(48)


@dataclass
class Seeds:
    base_url: str
    #: Path parameter name to the seeded object's id.
    path_parameters: dict[str, str]
    #: Per path prefix, overrides of path_parameters (``rule_id`` of a runner rule or of a module rule).
    by_prefix: dict[str, dict[str, str]] = field(default_factory=dict)
    deployment_token: str = ""
    #: The agent runner's private key: each of its requests gets a fresh JWT (each is accepted once).
    agent_key: Ed25519PrivateKey | None = None
    #: A registered managed runner's token.
    managed_token: str = ""

    def parameters_for(self, path: str) -> dict[str, str]:
        chosen = dict(self.path_parameters)
        for prefix, overrides in self.by_prefix.items():
            if path.startswith(prefix):
                chosen.update(overrides)
        return chosen


@pytest.fixture
def seeds(settings: ServerSettings, tmp_path: Path) -> Iterator[Seeds]:
    def make(port: int) -> ServerSettings:
        return settings.model_copy(
            update={
                "listen": f"127.0.0.1:{port}",
                "public_url": f"http://127.0.0.1:{port}",
                "status_check_interval_seconds": 0.5,
                # The finished deployment's token still opens the gateway (its routes then answer
                # what a late runner gets: no bundle, results and logs already written).
                "deployment_token_grace_seconds": 3600.0,
                # The agent runner has nothing to deliver: its long polls end soon (204).
                "agent_fetch_wait_seconds": 0.2,
                "encryption_key": SecretStr(base64.b64encode(SERVER_KEY).decode()),
                # Its claim long polls end as soon as the agents' do.
                "managed_runner_secret": SecretStr(MANAGED_SECRET),
            }
        )

    with running_server(make) as base_url:
        stack = build_stack(base_url, tmp_path)
        try:
            created = stack.client.post(
                "/orgs/acme/deployments", json=DEPLOY_REQUEST, headers={"Idempotency-Key": IDEMPOTENCY_KEY}
            )
            assert 201 == created.status_code, created.text
            yield _seed(stack.client, base_url, stack.wait(created.json()["id"]))
            # Deleting shop/dev started a destroy run on this host: let it end before the server does.
            executing = stack.client.get("/orgs/acme/deployments", params={"by_status[]": "executing"})
            for deployment in executing.json()["items"]:
                if deployment["runner_id"] != AGENT_RUNNER:
                    stack.wait(deployment["id"])
        finally:
            stack.client.close()


def _seed(client: httpx.Client, base_url: str, deployment: dict[str, Any]) -> Seeds:
    org = "acme"
    assert "succeeded" == deployment["status"], deployment
    provider = {
        "provider_type": "aws",
        "id": "default",
        "source": "hashicorp/aws",
        "version_constraint": "~> 5.0",
    }
    assert 201 == client.post(f"/orgs/{org}/module-providers", json=provider).status_code
    created = client.post(f"/orgs/{org}/tokens", json={"role": "viewer", "description": "probe"})
    assert 201 == created.status_code, created.text
    token = created.json()
    env = client.get(f"/orgs/{org}/projects/shop/envs/dev").json()
    runner_rule = client.get(f"/orgs/{org}/runner-rules").json()["items"][0]
    module_rule = client.get(f"/orgs/{org}/module-rules").json()["items"][0]
    versions = client.get(f"/orgs/{org}/modules/demo-app/versions").json()["items"]
    private_pem, public_pem = agent_auth.generate_key_pair()
    agent = {
        "id": AGENT_RUNNER,
        "runner_configuration": {
            "type": "kubernetes-agent",
            "key": public_pem,
            "job": {"namespace": "po", "service_account": "po-runner"},
        },
        "state_storage_configuration": {"type": "kubernetes", "namespace": "po"},
    }
    executing = _agent_deployment(client, org, agent)
    registered = client.post("/runner/register", json={"managedSecret": MANAGED_SECRET, "name": "probe-0"})
    assert 201 == registered.status_code, registered.text
    token_key = deployment_tokens.token_key(SERVER_KEY)
    return Seeds(
        base_url=base_url,
        path_parameters={
            "org_id": org,
            "project_id": "shop",
            "env_id": "dev",
            "env_type_id": "development",
            "env_uuid": env["uuid"],
            "runner_id": "local",
            "type_id": "demo-app",
            "module_id": "demo-app",
            "version_id": versions[0]["version_id"],
            "provider_type": "aws",
            "provider_id": "default",
            "deployment_id": deployment["id"],
            "token_id": token["id"],
        },
        by_prefix={
            "/orgs/{org_id}/runner-rules": {"rule_id": runner_rule["id"]},
            "/orgs/{org_id}/module-rules": {"rule_id": module_rule["id"]},
            # The gateway serves the deployment that executes on the agent runner.
            "/runner-gateway": {
                "runner_id": AGENT_RUNNER,
                "deployment_id": executing["id"],
                "env_uuid": executing["env_uuid"],
            },
        },
        deployment_token=deployment_tokens.deployment_token(token_key, org, executing["id"]),
        agent_key=agent_auth.load_private_key(private_pem),
        managed_token=registered.json()["token"],
    )


def _agent_deployment(client: httpx.Client, org: str, agent: dict[str, Any]) -> dict[str, Any]:
    """A deployment of environment shop/agents, linked to the agent runner: it executes until the end of
    the test (no agent takes its command), so the gateway serves its bundle and its state."""
    for path, body in [
        ("/runners", agent),
        ("/env-types", {"id": "agents"}),
        ("/projects/shop/envs", {"id": "agents", "env_type_id": "agents"}),
        ("/runner-rules", {"runner_id": AGENT_RUNNER, "env_type_id": "agents"}),
    ]:
        created = client.post(f"/orgs/{org}{path}", json=body)
        assert 201 == created.status_code, (path, created.text)
    created = client.post(f"/orgs/{org}/deployments", json={**DEPLOY_REQUEST, "env_id": "agents"})
    assert 201 == created.status_code, created.text
    env = client.get(f"/orgs/{org}/projects/shop/envs/agents").json()
    return {"id": created.json()["id"], "env_uuid": env["uuid"]}


def _credentials(operation: OpenApiOperation, seeds: Seeds) -> dict[str, str]:
    schemes = {name for requirement in operation.definition.raw.get("security", []) for name in requirement}
    if "AgentJWT" in schemes and seeds.agent_key is not None:
        token = agent_auth.sign(seeds.agent_key, seeds.path_parameters["org_id"], AGENT_RUNNER)
        return {"Authorization": f"Bearer {token}"}
    if "ManagedRunnerToken" in schemes:
        return {"Authorization": f"Bearer {seeds.managed_token}"}
    if "DeploymentToken" in schemes:
        return {DEPLOYMENT_TOKEN_HEADER: seeds.deployment_token}
    if "StateBasicAuth" in schemes:
        user = seeds.parameters_for("/runner-gateway")["deployment_id"]
        basic = base64.b64encode(f"{user}:{seeds.deployment_token}".encode()).decode()
        return {"Authorization": f"Basic {basic}"}
    return {"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}


#: Operations that can end the executing deployment (after them the gateway serves it no more).
ENDING = ("/results", "/events", "/reject")


def _ordered(schema: Any) -> list[OpenApiOperation]:
    """The document's order, except: what can end the executing deployment, then deletions, last."""
    operations = [result.ok() for result in schema.get_all_operations()]
    return sorted(
        operations,
        key=lambda operation: (operation.method.upper() == "DELETE", operation.path.endswith(ENDING)),
    )


def _probe(
    operation: OpenApiOperation, mode: GenerationMode, seeds: Seeds, found: list[str], statuses: list[int]
) -> None:
    known = seeds.parameters_for(operation.path)

    @repeatable(max_examples=MAX_EXAMPLES)
    @given(case=operation.as_strategy(generation_mode=mode))
    def probe(case: OpenApiCase) -> None:
        if mode is GenerationMode.POSITIVE and case.path_parameters:
            case.path_parameters = {
                name: known.get(name, value) for name, value in case.path_parameters.items()
            }
        headers = _credentials(operation, seeds)
        response = case.call(base_url=seeds.base_url, headers=headers, timeout=30)
        statuses.append(response.status_code)
        _check(operation, mode, case, response, found)

    try:
        probe()
    except HypothesisException as exc:  # nothing to generate in this mode (no inputs to break)
        if mode is GenerationMode.POSITIVE:
            raise
        del exc


def _known_requests(operations: list[OpenApiOperation], seeds: Seeds, found: list[str]) -> list[int]:
    by_label = {operation.label: operation for operation in operations}
    statuses = []
    for label, headers, body in KNOWN_REQUESTS:
        operation = by_label[label]
        case = operation.Case(
            path_parameters={name: seeds.parameters_for(operation.path)[name] for name in _names(operation)},
            headers=headers,
            body=body,
            media_type="application/json",
        )
        response = case.call(base_url=seeds.base_url, headers=_credentials(operation, seeds), timeout=30)
        statuses.append(response.status_code)
        _check(operation, GenerationMode.POSITIVE, case, response, found)
    return statuses


def _check(
    operation: OpenApiOperation, mode: GenerationMode, case: OpenApiCase, response: Any, found: list[str]
) -> None:
    """Validate the answer; each failed check is noted in ``found`` (not raised: the run goes on)."""
    found.extend(
        _describe(operation, mode, response.status_code, f) for f in failures(case, response, CHECKS)
    )


def _names(operation: OpenApiOperation) -> list[str]:
    return re.findall(r"{(\w+)}", operation.path)


def _describe(operation: OpenApiOperation, mode: GenerationMode, status: int, failure: BaseException) -> str:
    title = getattr(failure, "title", type(failure).__name__)
    detail = " ".join(str(getattr(failure, "message", failure)).split())[:240]
    return f"{operation.label} [{mode.value}] {status}: {title}: {detail}"


@pytest.mark.timeout(900)
def test_own_openapi__every_answer_is_documented(seeds: Seeds) -> None:
    """Zero 5xx, zero response-schema or content-type violations, zero undocumented status codes."""
    schema = schemathesis.openapi.from_url(f"{seeds.base_url}/openapi.json")
    operations = _ordered(schema)
    found: list[str] = []
    statuses: list[int] = []

    known = _known_requests(operations, seeds, found)
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _probe(operation, mode, seeds, found, statuses)

    assert [200, 201] == known
    assert len(operations) > 70
    assert len(operations) == len({op.label for op in operations})
    # Enough calls got past authentication and the 404 of unknown ids to mean something.
    assert len(statuses) > 5 * len(operations)
    assert sum(1 for status in statuses if status < 300) > 2 * len(operations), Counter(statuses)
    assert [] == found, f"{len(found)} findings:\n" + "\n".join(found)


def test_own_openapi__the_checks_find_a_violation(seeds: Seeds) -> None:
    """The same probe, on a document whose organization schema requires a field we never send, finds it:
    the checks above are live, not vacuous."""
    document = httpx.get(f"{seeds.base_url}/openapi.json").json()
    organization = document["components"]["schemas"]["OrganizationOut"]
    organization["required"] = [*organization.get("required", []), "colour"]
    del document["paths"]["/orgs/{org_id}"]["get"]["responses"]["404"]
    schema = schemathesis.openapi.from_dict(document)
    operation = next(op for op in _ordered(schema) if op.label == "GET /orgs/{org_id}")
    found: list[str] = []

    _probe(operation, GenerationMode.POSITIVE, seeds, found, [])
    _probe(operation, GenerationMode.NEGATIVE, seeds, found, [])

    assert any("200: Response violates schema" in finding for finding in found), found
    assert any("404: Undocumented status code" in finding for finding in found), found
