"""docs/guides/octl.md's walk through `octl`, every line of its three blocks in a shell, in order, as a
platform admin against a real server that allows local runners: the organization and its catalogue, the
GKE runner of docs/runners/kubernetes-gke.md as `gke-runner-config.yaml` (created, read, updated, ruled;
never launched), then deployments on the local runner whose more specific rule wins, with `DEPLOYMENT` the
first deployment's id as `octl get deployments` lists it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.settings import ServerSettings
from tests.support.docs import ROOT, Shell, commands, docs_example, substitute
from tests.support.octl import serve
from tests.support.orgs import BOOTSTRAP_TOKEN

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.spread]


def test_walk__every_line_runs_in_order(settings: ServerSettings, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    (work / "gke-runner-config.yaml").write_text(docs_example("runners/gke-runner"))
    with serve(settings, allow_local_runners=True) as base_url:
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "PO_API_URL": base_url,
            "PO_AUTH_TOKEN": BOOTSTRAP_TOKEN,
            "OCTL_CONFIG": str(tmp_path / "octl.yaml"),
            "OCTL_KEYS_DIR": str(tmp_path / "keys"),
        }
        shell = Shell(cwd=work, env=env, state=tmp_path)

        setup = commands(docs_example("guides/octl-walk-setup"))
        shown = [shell.run(line) for line in setup]
        assert "po_" in shown[2].stdout + shown[2].stderr  # the token, shown once

        runners = commands(docs_example("guides/octl-walk-runners"))
        ran = {line.split("#")[0].strip(): shell.run(line) for line in runners}
        got = yaml.safe_load(shell.run("octl get runner my-gke-runner -o yaml").stdout)
        assert "kubernetes-gke" == got["runner_configuration"]["type"]
        assert "my-gke-runner" in ran["octl refresh-runner my-project dev --dry-run"].stdout + (
            ran["octl refresh-runner my-project dev --dry-run"].stderr
        )

        first: str | None = None
        for line in commands(docs_example("guides/octl-walk-deployments")):
            if "DEPLOYMENT" in line:
                if first is None:
                    listed = json.loads(shell.run("octl get deployments --env dev -o json").stdout)
                    first = listed[-1]["id"]
                line = substitute(line, {"DEPLOYMENT": first})
            shell.run(line)

        deployments = json.loads(shell.run("octl get deployments -o json").stdout)
        assert {"succeeded"} == {d["status"] for d in deployments}
        assert {"deploy", "rollback", "destroy"} <= {d.get("mode") for d in deployments}
        assert {"local"} == {d.get("runner_id") for d in deployments}
        assert [] == json.loads(shell.run("octl get envs -o json").stdout)
