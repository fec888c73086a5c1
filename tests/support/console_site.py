"""What the console's browser tests (tests/browser) find on their server: :func:`populate` fills a fresh
server with an organization whose deployments really ran, a second organization and tokens of every
role."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from orchestrator.protocol import age
from tests.support.demo_modules import make_slow
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.stack import Stack, build_stack, demo_manifest

RUNNERS = Path(__file__).resolve().parents[1] / "data" / "runners"
#: A runner description that would run script if the console put it into the page as HTML.
HOSTILE_DESCRIPTION = (
    '<script>window.__injected = "script"</script><img src="x" onerror="window.__injected = \'img\'">'
)


@dataclass
class Site:
    """The server and what is in it: organization ``acme`` (runners ``local``, ``edge`` and ``cluster``, whose
    service account token is a secret; environments
    shop/dev, linked to ``local``, and shop/staging, linked to none, whose rule names ``edge``), one
    succeeded deployment of shop/dev (``deployment``, with its age identity as ``_identity``), and
    ``globex``, another organization."""

    url: str
    stack: Stack
    #: admin, deployer, viewer (of acme), other (globex's admin), platform (the bootstrap token).
    tokens: dict[str, str]
    deployment: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def get(self, path: str, token: str = "admin") -> httpx.Response:
        """``GET path`` with one of the tokens."""
        headers = {"Authorization": f"Bearer {self.tokens[token]}"}
        return httpx.get(f"{self.url}{path}", headers=headers, timeout=60)

    def start_slow_deployment(self, env_id: str, seconds: int) -> tuple[str, str]:
        """The first deployment of a new environment shop/``env_id``, whose apply sleeps ``seconds`` (the
        demo module is patched for good: a provisioner that sleeps, run when a resource is created), not
        waited for: its id and its age identity."""
        make_slow(self.stack, seconds=seconds)
        made = self.stack.client.post(
            "/orgs/acme/projects/shop/envs", json={"id": env_id, "env_type_id": "development"}
        )
        assert 201 == made.status_code, made.text
        identity, recipient = age.generate_identity()
        created = self.stack.client.post(
            "/orgs/acme/deployments",
            json={
                "project_id": "shop",
                "env_id": env_id,
                "manifest": demo_manifest("slow"),
                "encrypted_outputs_recipient": recipient,
                "encrypted_logs_recipient": recipient,
            },
        )
        assert 201 == created.status_code, created.text
        return created.json()["id"], identity


def populate(url: str, tmp: Path) -> Site:
    stack = build_stack(url, tmp)
    admin = str(stack.client.headers["Authorization"]).removeprefix("Bearer ")
    tokens = {"admin": admin, "platform": BOOTSTRAP_TOKEN}
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}, timeout=60
    ) as platform:
        for role in ("deployer", "viewer"):
            created = platform.post("/orgs/acme/tokens", json={"role": role, "description": role})
            assert 201 == created.status_code, created.text
            tokens[role] = created.json()["token"]
        assert 201 == platform.post("/orgs", json={"id": "globex"}).status_code
        tokens["other"] = platform.post("/orgs/globex/tokens", json={"role": "admin"}).json()["token"]
    edge = yaml.safe_load((RUNNERS / "vm-agent.yaml").read_text())
    edge["description"] = HOSTILE_DESCRIPTION
    cluster = yaml.safe_load((RUNNERS / "kubernetes-token.yaml").read_text())
    for path, body in [
        ("/runners", {"id": "edge", **edge}),
        ("/runners", {"id": "cluster", **cluster}),
        ("/env-types", {"id": "staging"}),
        ("/projects/shop/envs", {"id": "staging", "env_type_id": "staging"}),
        ("/runner-rules", {"runner_id": "edge", "env_type_id": "staging"}),
    ]:
        answer = stack.client.post(f"/orgs/acme{path}", json=body)
        assert 201 == answer.status_code, (path, answer.text)
    deployment = stack.deploy()
    assert "succeeded" == deployment["status"], deployment["status_message"]
    return Site(url=url, stack=stack, tokens=tokens, deployment=deployment)
