"""``launchers.availability``: the table of the runner kinds the orchestrator launches itself, the reason
GET runner answers for the others, and the server's ``launcher_for``, which must agree with it for every
runner example: with every extra installed, with local runners off, and in processes that cannot import
one extra's libraries."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

import pytest

from orchestrator.domain.runner_types import RunnerType, VmConnection
from orchestrator.launchers import availability
from tests.support.launchability import (
    EXAMPLES,
    ROOT,
    Outcome,
    example_configuration,
    outcomes,
    outcomes_without,
)


def connection_types() -> set[str]:
    """The ``type`` of each ``vm`` connection model."""
    members = typing.get_args(typing.get_args(VmConnection)[0])
    return {member.model_fields["type"].default for member in members}


def agree(outcome: Outcome) -> None:
    """``launcher_for`` builds a launcher exactly when the table calls the runner launchable, and raises
    the very reason GET answers otherwise."""
    if outcome.kind is None:  # an agent launches it: nothing to launch here, nothing to say
        assert (None, None, None) == (outcome.reason, outcome.launcher, outcome.error)
    elif outcome.reason is None:
        assert outcome.launcher is not None and outcome.error is None, outcome
    else:
        assert (None, outcome.reason) == (outcome.launcher, outcome.error)


def install_hint(*extras: str) -> str:
    quoted = " and ".join(f"'{extra}'" for extra in extras)
    plural = "s" if len(extras) > 1 else ""
    return (
        f"install the {quoted} extra{plural} (pip install 'platform-orchestrator[{','.join(extras)}]') and "
        "restart the orchestrator"
    )


def test_table__a_row_for_each_kind_the_orchestrator_launches_itself() -> None:
    agent_types = {RunnerType.KUBERNETES_AGENT, RunnerType.VM}
    direct = {t.value for t in RunnerType if t not in agent_types}
    direct |= {f"vm:{connection}" for connection in connection_types() if connection != "agent"}

    assert direct == set(availability.LAUNCHERS)
    assert {"vm:local", "vm:ssh"} < direct  # the vm connection types were found


def test_table__every_example_has_its_kind() -> None:
    kinds = {example: availability.launcher_kind(*example_configuration(example)) for example in EXAMPLES}

    assert {"seed000-agent.yaml": None, "vm-agent.yaml": None} == {
        example: kind for example, kind in kinds.items() if kind is None
    }
    assert set(availability.LAUNCHERS) == {kind for kind in kinds.values() if kind is not None}


@pytest.mark.parametrize("allow_local_runners", [True, False], ids=["local-allowed", "local-off"])
def test_launcher_for__a_launcher_exactly_for_what_the_table_calls_launchable(
    tmp_path: Path, allow_local_runners: bool
) -> None:
    found = outcomes(tmp_path, allow_local_runners=allow_local_runners)

    for outcome in found.values():
        agree(outcome)
    # This environment has every extra: only local runners, when off, are not launchable.
    unlaunchable = {example for example, outcome in found.items() if outcome.reason is not None}
    assert (set() if allow_local_runners else {"vm-local.yaml"}) == unlaunchable
    assert "SshLauncher" == found["vm-ssh.yaml"].launcher
    assert "KubernetesLauncher" == found["seed001-kubernetes.yaml"].launcher
    assert "EcsLauncher" == found["serverless-ecs.yaml"].launcher


def test_local_runner__not_launchable_while_local_runners_are_off() -> None:
    runner_type, configuration = example_configuration("vm-local.yaml")

    reason = availability.unlaunchable_reason(runner_type, configuration, allow_local_runners=False)

    assert (
        "this orchestrator cannot launch vm runners with a local connection: local runners are off on this "
        "server (start it with PO_ALLOW_LOCAL_RUNNERS=true)"
    ) == reason
    assert availability.unlaunchable_reason(runner_type, configuration, allow_local_runners=True) is None


def test_a_kind_without_a_row__has_no_launcher() -> None:
    reason = availability.unlaunchable_reason(
        "vm", {"connection": {"type": "telnet"}}, allow_local_runners=True
    )

    assert (
        "this orchestrator cannot launch vm runners with a telnet connection: it has no launcher for them"
        == (reason)
    )


def test_a_library_that_does_not_import__named_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library that is there but fails to import (a dependency of its own is missing) is named with the
    import's error, not called missing."""
    (tmp_path / "po_test_broken.py").write_text("import po_test_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = availability.Library(module="po_test_broken", distribution="po-test-broken", extra="kubernetes")
    missing = availability.Library(module="po_test_absent.sub", distribution="po-test-absent", extra="cloud")
    row = availability.Row(modules=("orchestrator.launchers.local",), libraries=(missing, broken))
    monkeypatch.setitem(availability.LAUNCHERS, "test-kind", row)

    with pytest.raises(availability.LauncherUnavailableError) as raised:
        availability.require("test-kind", allow_local_runners=True)

    assert (
        "this orchestrator cannot launch test-kind runners: po-test-absent is not installed; po-test-broken "
        "does not import (No module named 'po_test_absent_dependency'): "
        + install_hint("cloud", "kubernetes")
    ) == raised.value.message
    assert not raised.value.retryable


def test_a_launcher_module_that_does_not_import__named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(availability.LAUNCHERS, "test-kind", availability.Row(modules=("orchestrator.nope",)))

    with pytest.raises(availability.LauncherUnavailableError) as raised:
        availability.require("test-kind", allow_local_runners=True)

    assert (
        "this orchestrator cannot launch test-kind runners: its launcher (orchestrator.nope) does not import "
        "(No module named 'orchestrator.nope')"
    ) == raised.value.message


@pytest.mark.slow
@pytest.mark.parametrize(
    ("unimportable", "expected"),
    [
        pytest.param(
            ("lightkube", "google.auth"),
            {
                "kubernetes": "kubernetes runners: lightkube is not installed: " + install_hint("kubernetes"),
                "kubernetes-gke": "kubernetes-gke runners: lightkube and google-auth are not installed: "
                + install_hint("kubernetes", "cloud"),
                "kubernetes-aks": "kubernetes-aks runners: lightkube is not installed: "
                + install_hint("kubernetes"),
                "kubernetes-eks": "kubernetes-eks runners: lightkube is not installed: "
                + install_hint("kubernetes"),
            },
            id="kubernetes-and-google",
        ),
        pytest.param(
            # "azure": the namespace package, so azure.identity's parent is missing too.
            ("azure", "botocore", "asyncssh"),
            {
                "kubernetes-aks": "kubernetes-aks runners: azure-identity is not installed: "
                + install_hint("cloud"),
                "kubernetes-eks": "kubernetes-eks runners: botocore is not installed: "
                + install_hint("server"),
                "serverless-ecs": "serverless-ecs runners: botocore is not installed: "
                + install_hint("server"),
                "vm:ssh": "vm runners with an ssh connection: asyncssh is not installed: "
                + install_hint("server"),
            },
            id="azure-aws-ssh",
        ),
    ],
)
def test_launcher_for__without_an_extra__agrees_with_the_table(
    tmp_path: Path, unimportable: tuple[str, ...], expected: dict[str, str]
) -> None:
    """In a process that cannot import the libraries (as if the extra were not installed), exactly the
    kinds that need them are unlaunchable, with the reason naming extras and libraries; ``launcher_for``
    raises that reason for them and builds the others' launchers."""
    found = outcomes_without(unimportable, tmp_path)

    for outcome in found.values():
        agree(outcome)
    reasons = {outcome.kind: outcome.reason for outcome in found.values() if outcome.kind is not None}
    assert {
        kind: f"this orchestrator cannot launch {expected[kind]}" if kind in expected else None
        for kind in availability.LAUNCHERS
    } == reasons


@pytest.mark.slow
def test_docs__the_status_of_a_kubernetes_runner_without_lightkube(tmp_path: Path) -> None:
    """docs/runners/index.md shows what GET runner answers for a kubernetes runner on a server without the
    `kubernetes` extra: the answer of a process that cannot import lightkube."""
    import json

    from tests.support.docs import docs_example

    shown = json.loads(docs_example("runners/status-unlaunchable"))
    (reason,) = {
        o.reason for o in outcomes_without(("lightkube",), tmp_path).values() if o.kind == "kubernetes"
    }

    assert {"status": {"launchable": False, "message": reason}} == shown


def test_import__loads_no_launcher_and_no_library() -> None:
    """Importing the table imports none of what it names: a server or runner image without an extra
    imports it all the same, and nothing is loaded before a kind is asked about."""
    libraries = ["lightkube", "google.auth", "azure.identity", "requests", "botocore", "asyncssh"]
    launchers = sorted({module for row in availability.LAUNCHERS.values() for module in row.modules})
    code = (
        "import sys\n"
        "from orchestrator.launchers import availability\n"
        f"print(sorted(m for m in {libraries + launchers!r} if m in sys.modules))\n"
    )

    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )

    assert "[]" == done.stdout.strip()
