"""``po-runner remote`` (the agent) as a real process, for the agent runner's acceptance and fault tests:
organization ``acme``, runner ``local``, its runs in ``<work>/agent-runs``, its output in
``<work>/<name>.log``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


class AgentProcess:
    """`po-runner remote` as a real process."""

    def __init__(self, gateway_url: str, private_pem: str, work: Path, name: str = "agent") -> None:
        self.runs_dir = work / "agent-runs"
        self.log = work / f"{name}.log"
        self.env = {
            **os.environ,
            "ORG_ID": "acme",
            "RUNNER_ID": "local",
            "PRIVATE_KEY": private_pem,
            "RUNNER_GATEWAY_URL": gateway_url,
            "AGENT_RUNS_DIR": str(self.runs_dir),
            # Runs as the test's user: tmp_path (0700) is out of an unprivileged run user's reach.
            "AGENT_RUN_USER": "root",
            "AGENT_MAX_BACKOFF_SECONDS": "2",
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.cli.runner", "remote"],
                env=self.env,
                stdout=log,
                stderr=log,
            )
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)
        return self.process.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")
