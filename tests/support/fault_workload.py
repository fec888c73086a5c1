"""The workload of the fault-injection suite (tests/faults) and its checks.

Several environments of one organization deploy one after another, in parallel with each other, a module
whose resources leave a trace on disk: each creation appends ``started <label> <id>`` and ``created
<label> <id>`` to a history file (a local-exec provisioner, with a sleep in between), each destruction
``destroyed <id>`` (a destroy-time provisioner). ``triggers_replace`` is the deployment's label, so every
deployment destroys the environment's resources and creates new ones. From the history the checks know:

- what Terraform created and did not destroy, which must be exactly what the environments' stored states
  hold (nothing lost, nothing forgotten, nothing in two environments);
- how often each deployment created each resource: at most once (no deployment ran, nor was its result
  applied, twice);
- at a fault, how far each executing deployment was (before its apply, in it, after it).

After the faults each environment deploys once more (it must succeed) and plans once (nothing to add);
then no state lock may be held and no process may run in the runs directories.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from orchestrator.protocol import age
from tests.support.outages import ServerProcess, StoredState, resource_ids
from tests.support.stack import Stack, build_stack, demo_manifest, runner_body

#: Resources per deployment.
COUNT = 2
#: Final states of a deployment.
FINAL = ("succeeded", "failed")
#: How far an executing deployment is, as the history tells.
BEFORE_APPLY = "before apply (bundle, init, plan, destroy of the old resources)"
APPLY = "apply"
AFTER_APPLY = "after apply (state write, unlock, show, logs, results)"
PHASES = (BEFORE_APPLY, APPLY, AFTER_APPLY)


def module_code(history: Path, *, sleep_seconds: float) -> str:
    create = (
        f"echo started ${{var.name}} ${{self.id}} >> {history}; sleep {sleep_seconds}; "
        f"echo created ${{var.name}} ${{self.id}} >> {history}"
    )
    return f"""
variable "name" {{
  type = string
}}

resource "terraform_data" "item" {{
  count            = {COUNT}
  triggers_replace = var.name
  input            = "${{var.name}}-${{count.index}}"
  provisioner "local-exec" {{
    command = "{create}"
  }}
  provisioner "local-exec" {{
    when    = destroy
    command = "echo destroyed ${{self.id}} >> {history}"
  }}
}}

output "url" {{
  value = "https://${{var.name}}.example.test/"
}}

output "bucket" {{
  value = terraform_data.item[0].output
}}
"""


@dataclass(frozen=True, kw_only=True)
class History:
    """The history file, read."""

    #: label -> ids created (started and finished) by that deployment
    created: dict[str, list[str]]
    #: label -> ids whose creation started
    started: dict[str, list[str]]
    destroyed: set[str]

    @classmethod
    def read(cls, path: Path) -> History:
        created: dict[str, list[str]] = {}
        started: dict[str, list[str]] = {}
        destroyed: set[str] = set()
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines:
            parts = line.split()
            if len(parts) == 3 and parts[0] in ("created", "started"):
                (created if parts[0] == "created" else started).setdefault(parts[1], []).append(parts[2])
            elif len(parts) == 2 and parts[0] == "destroyed":
                destroyed.add(parts[1])
        return cls(created=created, started=started, destroyed=destroyed)

    def live(self) -> set[str]:
        """Ids created (their provisioner finished) and not destroyed."""
        return {i for ids in self.created.values() for i in ids} - self.destroyed

    def phase(self, label: str) -> str:
        if label not in self.started:
            return BEFORE_APPLY
        if len(self.created.get(label, [])) < len(self.started[label]):
            return APPLY
        return AFTER_APPLY


@dataclass
class Record:
    label: str
    env: str
    id: str | None = None
    final: dict[str, Any] | None = None


@dataclass
class Workload:
    """An organization with ``envs`` environments on ``server``, deploying the history module."""

    server: ServerProcess
    work: Path
    envs: list[str]
    runner: dict[str, Any]
    sleep_seconds: float = 1.0
    stack: Stack = field(init=False)
    history: Path = field(init=False)
    env_uuids: dict[str, str] = field(init=False)
    records: list[Record] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.history = self.work / "history"
        self.stack = build_stack(self.server.url, self.work, runner=self.runner)
        client, org = self.stack.client, self.stack.org
        for env in self.envs:
            if env != "dev":
                made = client.post(
                    f"/orgs/{org}/projects/shop/envs", json={"id": env, "env_type_id": "development"}
                )
                assert 201 == made.status_code, made.text
        code = module_code(self.history, sleep_seconds=self.sleep_seconds)
        patched = client.patch(f"/orgs/{org}/modules/demo-app", json={"module_source_code": code})
        assert 200 == patched.status_code, patched.text
        self.env_uuids = {
            env: str(client.get(f"/orgs/{org}/projects/shop/envs/{env}").json()["uuid"]) for env in self.envs
        }

    # -- talking to a server that may be down ------------------------------------------------------------

    def _call(self, method: str, path: str, *, deadline: float, **kwargs: Any) -> httpx.Response:
        while True:
            try:
                return self.stack.client.request(method, path, timeout=10, **kwargs)
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def create(self, env: str, label: str, *, plan_only: bool = False, timeout: float = 300) -> str:
        """Create a deployment, through outages: the Idempotency-Key makes a repeat after a lost answer
        return the same deployment."""
        _, recipient = age.generate_identity()
        body = {
            "project_id": "shop",
            "env_id": env,
            "mode": "deploy",
            "manifest": demo_manifest(label),
            "plan_only": plan_only,
            "encrypted_outputs_recipient": recipient,
            "encrypted_logs_recipient": recipient,
        }
        deadline = time.monotonic() + timeout
        while True:
            answer = self._call(
                "POST",
                f"/orgs/{self.stack.org}/deployments",
                json=body,
                headers={"Idempotency-Key": f"{self.work.name}-{label}-{'plan' if plan_only else 'deploy'}"},
                deadline=deadline,
            )
            if answer.status_code in (200, 201):
                deployment_id: str = answer.json()["id"]
                return deployment_id
            # 409: the environment's previous deployment is still executing (its result in flight);
            # 503: the server is starting. Anything else is a bug.
            assert answer.status_code in (409, 503), answer.text
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.5)

    def wait(self, deployment_id: str, *, timeout: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        path = f"/orgs/{self.stack.org}/deployments/{deployment_id}"
        while True:
            answer = self._call("GET", path, deadline=deadline)
            if answer.status_code == 200 and answer.json()["status"] in FINAL:
                final: dict[str, Any] = answer.json()
                return final
            assert time.monotonic() < deadline, f"deployment {deployment_id} did not end: {answer.text}"
            time.sleep(0.5)

    def deploy(self, env: str, label: str, *, plan_only: bool = False) -> dict[str, Any]:
        record = Record(label=label, env=env)
        with self._lock:
            self.records.append(record)
        record.id = self.create(env, label, plan_only=plan_only)
        record.final = self.wait(record.id)
        return record.final

    def run_envs(self, deployments: int, *, prefix: str) -> None:
        """``deployments`` deployments, spread over the environments, each environment's in sequence."""
        per_env = [
            deployments // len(self.envs) + (i < deployments % len(self.envs)) for i in range(len(self.envs))
        ]
        failures: list[BaseException] = []

        def loop(env: str, count: int) -> None:
            try:
                for n in range(count):
                    self.deploy(env, f"{prefix}-{env}-{n}")
            except BaseException as exc:  # reported by the caller's thread
                failures.append(exc)

        threads = [
            threading.Thread(target=loop, args=(env, count), daemon=True)
            for env, count in zip(self.envs, per_env, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]

    def executing(self) -> list[Record]:
        with self._lock:
            return [r for r in self.records if r.id is not None and r.final is None]

    def phases(self) -> list[str]:
        history = History.read(self.history)
        return [history.phase(r.label) for r in self.executing()]

    def reach(self, phase: str, stop: threading.Event, *, timeout: float = 30.0) -> bool:
        """Wait until an executing deployment is in ``phase`` (False: stopped, or not within timeout)."""
        deadline = time.monotonic() + timeout
        while not stop.is_set() and time.monotonic() < deadline:
            if phase in self.phases():
                return True
            time.sleep(0.1)
        return False

    def summary(self, phases: list[str]) -> str:
        counted = Counter(phases)
        return ", ".join(f"{counted[p]} {p}" for p in PHASES if counted[p]) or "none executing"

    # -- the checks ------------------------------------------------------------------------------------

    def check(self, seed: int, *, runs_dirs: list[Path]) -> dict[str, int]:
        """Every check of the module docstring; a summary of the deployments' outcomes."""
        context = f"(PO_FAULT_SEED={seed})"
        outcomes: Counter[str] = Counter()
        for record in self.records:
            assert record.final is not None, f"{record.label} never ended {context}"
            status, message = record.final["status"], record.final["status_message"]
            assert status in FINAL and message.strip(), (record.label, record.final, context)
            outcomes[status] += 1
        for env in self.envs:
            converged = self.deploy(env, f"converge-{self.work.name}-{env}")
            assert "succeeded" == converged["status"], (env, converged["status_message"], context)
        stored = StoredState(self.server.database_url, self.server.key())
        in_states: dict[str, str] = {}
        for env, env_uuid in self.env_uuids.items():
            for resource_id in resource_ids(stored.latest(env_uuid)).values():
                assert resource_id not in in_states, f"{resource_id} in {env} and {in_states[resource_id]}"
                in_states[resource_id] = env
        history = History.read(self.history)
        assert history.live() == set(in_states), (
            f"created but in no state: {sorted(history.live() - set(in_states))}; "
            f"in a state but never created: {sorted(set(in_states) - history.live())} {context}"
        )
        twice = {label: ids for label, ids in history.created.items() if len(ids) > COUNT}
        assert {} == twice, f"deployments that created their resources more than once {context}"
        for env in self.envs:
            planned = self.deploy(env, f"converge-{self.work.name}-{env}", plan_only=True)
            assert "succeeded" == planned["status"], (env, planned["status_message"], context)
            assert 0 == planned["metrics"]["num_tf_resources_added"], (env, planned["metrics"], context)
        for env, env_uuid in self.env_uuids.items():
            assert stored.lock(env_uuid) is None, f"the state lock of {env} is held {context}"
        # A runner reports, then exits: give the last ones a moment.
        deadline = time.monotonic() + 30
        while (left := processes_in(runs_dirs)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [] == left, f"processes left running: {left} {context}"
        return dict(outcomes)


def processes_in(directories: list[Path]) -> list[str]:
    """Live processes whose working directory is inside one of ``directories`` (runners, engines,
    provisioners all work inside their run's directory)."""
    roots = [str(d.resolve()) for d in directories]
    found: list[str] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{name}/cwd")
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z" and any(cwd.startswith(root) for root in roots):
            found.append(f"{name}: {command.strip()} (in {cwd})")
    return found


def outage_seconds(rng: random.Random, *, longest: float) -> float:
    """Most outages short, some longer, a few long (up to ``longest``)."""
    draw = rng.random()
    if draw < 0.7:
        return rng.uniform(1.0, 5.0)
    if draw < 0.9:
        return rng.uniform(5.0, min(20.0, longest))
    return rng.uniform(min(20.0, longest), longest)


def local_runner(work: Path, runs: Path) -> dict[str, Any]:
    tf_config = work / "terraformrc"
    tf_config.touch()
    body = runner_body(tf_config)
    body["runner_configuration"]["job"]["work_dir"] = str(runs)
    return body
