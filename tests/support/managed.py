"""Managed runners in tests: the secret of the test settings, registration, an organization whose
environments deploy on the managed pool (runner ``managed``) through a rule, and ``po-runner managed`` as a
real process (:class:`RunnerProcess`)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from tests.support.orgs import Org

#: MANAGED_RUNNER_SECRET of the tests that enable managed runners (48 characters or more).
MANAGED_SECRET = "managed-runner-secret-for-tests-0123456789abcdefghij"
#: A deployment with nothing to deploy: it compiles, and runs with any engine.
EMPTY_MANIFEST: dict[str, Any] = {"workloads": {}}


def runs_work_dir(root: Path, name: str) -> Path:
    """A managed runner's RUNNER_WORK_DIR. As root each run executes as a uid of its own (RUNNER_RUN_UIDS)
    that must pass through to its work directory: then not under ``root`` (pytest's are 0700) but in a
    directory of its own under the system's temporary directory, mode 0711 (the caller removes its parent)."""
    if os.geteuid() != 0:
        return root / f"work-{name}"
    made = Path(tempfile.mkdtemp(prefix=f"po-managed-{name}-"))
    made.chmod(0o711)
    return made / "work"


async def register(
    client: httpx.AsyncClient, name: str, tags: list[str] | None = None, secret: str = MANAGED_SECRET
) -> httpx.Response:
    return await client.post(
        "/runner/register", json={"managedSecret": secret, "name": name, "tags": tags or []}
    )


async def registered(client: httpx.AsyncClient, name: str, tags: list[str] | None = None) -> str:
    """A registered runner's token."""
    response = await register(client, name, tags)
    assert 201 == response.status_code, response.text
    token: str = response.json()["token"]
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def claim(client: httpx.AsyncClient, token: str, wait: int = 0) -> httpx.Response:
    return await client.post("/runner/claim", json={"waitSeconds": wait}, headers=bearer(token))


async def managed_env(org: Org, env_id: str, required_tags: list[str] | None = None) -> None:
    """Environment ``shop/<env_id>`` (env type ``<env_id>``) linked to the managed pool by a rule that
    requires ``required_tags``."""
    base = f"/orgs/{org.id}"
    rule: dict[str, Any] = {"runner_id": "managed", "env_type_id": env_id}
    if required_tags:
        rule["required_tags"] = required_tags
    for path, body in [
        ("/env-types", {"id": env_id}),
        ("/projects", {"id": "shop"}),
        ("/projects/shop/envs", {"id": env_id, "env_type_id": env_id}),
        ("/runner-rules", rule),
    ]:
        response = await org.admin.post(base + path, json=body)
        assert response.status_code in (201, 409), (path, response.text)


async def deploy(org: Org, env_id: str) -> str:
    """A deployment of ``shop/<env_id>``; its id."""
    response = await org.admin.post(
        f"/orgs/{org.id}/deployments",
        json={"project_id": "shop", "env_id": env_id, "mode": "deploy", "manifest": EMPTY_MANIFEST},
    )
    assert 201 == response.status_code, response.text
    deployment_id: str = response.json()["id"]
    return deployment_id


def run_claimed(
    base_url: str, token: str, work_dir: Path, *, extra: dict[str, str], wait: int = 20
) -> dict[str, Any]:
    """A small managed runner: claim one deployment with ``token`` (waiting up to ``wait`` s), run
    ``po-runner standard`` for it in ``work_dir`` with the claim's environment, RUNNER_GATEWAY_URL (the
    orchestrator's base URL, as for every runner) and ``extra`` (the runner host's own settings: engine,
    CLI config), then tell ``finished``. The claim's answer, with ``exitCode``."""
    with httpx.Client(base_url=base_url, headers=bearer(token), timeout=wait + 30) as client:
        claimed = client.post("/runner/claim", json={"waitSeconds": wait})
        assert 200 == claimed.status_code, (claimed.status_code, claimed.text)
        answer: dict[str, Any] = claimed.json()
        run_dir = work_dir / answer["deployment"]["id"]
        for sub in ("home", "tmp", "code"):
            (run_dir / sub).mkdir(parents=True)
        environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(run_dir / "home"),
            "TMPDIR": str(run_dir / "tmp"),
            **extra,
            **answer["environment"],
            "RUNNER_GATEWAY_URL": base_url,
            "IAC_CODE_DIR": str(run_dir / "code"),
        }
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli.runner", "standard"],
            env=environment,
            capture_output=True,
            timeout=300,
            check=False,
        )
        finished = client.post(
            f"/runner/deployments/{answer['deployment']['id']}/finished", json={"exitCode": done.returncode}
        )
        assert 200 == finished.status_code, finished.text
        answer["exitCode"] = done.returncode
        answer["stderr"] = done.stderr.decode(errors="replace")[-3000:]
        return answer


_started = itertools.count()


class RunnerProcess:
    """``po-runner managed`` as a process of its own, with only the environment given (nothing of the
    test's, so no KUBERNETES_SERVICE_HOST unless a test sets it); its output (JSON lines) in ``log``."""

    def __init__(
        self, url: str, name: str, root: Path, *, secret: str = MANAGED_SECRET, **extra: str
    ) -> None:
        self.name = name
        self.work_dir = runs_work_dir(root, name)
        self.log = root / f"runner-{name}-{next(_started)}.log"
        self.home = root / f"home-{name}"
        self.home.mkdir(parents=True, exist_ok=True)
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "RUNNER_URL": url,
            "RUNNER_MANAGED_SECRET": secret,
            "RUNNER_NAME": name,
            "RUNNER_WORK_DIR": str(self.work_dir),
            **extra,
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RunnerProcess:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.cli.runner", "managed"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def stop(self) -> int:
        """SIGTERM to its PID, SIGKILL if it has not exited 30 s later; its exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("event") == name:
                found.append(entry)
        return found

    def registrations(self) -> list[dict[str, Any]]:
        return self.events("registered")
