"""What upstream's JobSpec in a ``kubernetes-agent`` command costs the server, per deployment.

    uv run python bench/agent_payload.py [--number 2000] [--repeat 7]

Since issue 8 a ``kubernetes-agent`` command carries, beside our own run description (``spec``), the
complete Kubernetes JobSpec upstream's agent creates (``configuration``). The dispatcher renders it once
per deployment (``dispatch.agent_commands.job_spec``) and the gateway adds the deployment token to it on
every delivery (``protocol.commands.with_deployment_token``), then encodes it. The baseline, measured in the
same run, is that delivery work for a command without a JobSpec (a ``vm`` agent runner's, and every command
before issue 8): each row prints its time per call and the ratio to that baseline. The runner is seed 000's
``kubernetes-agent`` example (``tests/data/runners/seed000-agent.yaml``).
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import SecretStr

from orchestrator.dispatch.agent_commands import job_spec
from orchestrator.protocol import commands as protocol
from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.results import RunnerMode

RUNNER = Path(__file__).resolve().parent.parent / "tests" / "data" / "runners" / "seed000-agent.yaml"
TOKEN = "t" * 43  # the length of a deployment token (base64url of 32 bytes)


def _spec() -> RunSpec:
    configuration = yaml.safe_load(RUNNER.read_text())["runner_configuration"]
    return RunSpec(
        org_id="acme",
        runner_id="agent-runner",
        deployment_id="8d2f3c9e-5b1a-4f7e-9c3d-2a1b0c9d8e7f",
        env_uuid="0b6c1a2e-3d4f-4a5b-8c6d-7e8f9a0b1c2d",
        mode=RunnerMode.DEPLOY,
        token=SecretStr(TOKEN),
        gateway_url="https://orchestrator.example.com",
        encrypting_key="age1examplerecipient",
        runner_configuration=configuration,
    )


def _best_microseconds(fn: Callable[[], Any], number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--number", type=int, default=2000, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=7, help="timings; the best is kept")
    args = parser.parse_args()

    spec = _spec()
    configuration = job_spec(spec)
    description = protocol.RunDescription.from_run_spec(spec, "kubernetes-agent").model_dump(mode="json")
    without = {"job_id": spec.deployment_id, "namespace": "runners", "spec": description}
    with_job_spec = {**without, "configuration": configuration}

    def deliver(payload: dict[str, Any]) -> bytes:
        # What every delivery does with a stored payload: add the token, encode the answer.
        return json.dumps(protocol.with_deployment_token(payload, TOKEN)).encode()

    baseline = _best_microseconds(lambda: deliver(without), args.number, args.repeat)
    rows = [
        ("delivery without a JobSpec (baseline)", baseline),
        (
            "delivery with the JobSpec",
            _best_microseconds(lambda: deliver(with_job_spec), args.number, args.repeat),
        ),
        (
            "rendering the JobSpec (once per deployment)",
            _best_microseconds(lambda: job_spec(spec), args.number, args.repeat),
        ),
    ]
    print(f"JobSpec: {len(json.dumps(configuration))} bytes of JSON")
    print(f"{'measure':<50} {'us/call':>9} {'x baseline':>10}")
    for name, micros in rows:
        print(f"{name:<50} {micros:>9.1f} {micros / baseline:>10.1f}")


if __name__ == "__main__":
    main()
