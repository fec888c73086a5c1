"""The pure half of the ``vm`` runner over SSH: handles, what the scripts are sent and what they answer,
and the redaction of texts from the host. (The scripts themselves run against a real sshd in
tests/integration/test_ssh_launcher.py.)"""

from __future__ import annotations

import shlex

import pytest

from orchestrator.launchers import ssh_scripts
from orchestrator.launchers.ssh import redact
from orchestrator.launchers.ssh_scripts import Handle


@pytest.mark.parametrize(
    "handle",
    [
        "ssh:root@127.0.0.1:22:process:/root/.po-runs/6f1c1d2e-0000-4000-8000-000000000001",
        "ssh:deploy@::1:2222:docker:/srv/runs/d1",
        "ssh:deploy@[2001:db8::5]:22:podman:/srv/with:colon/d2",
        "ssh:ops@vm.example.com:65535:process:/var/lib/po runs/d3",
    ],
)
def test_handle__round_trips(handle: str) -> None:
    assert handle == str(Handle.parse(handle))


def test_handle__its_parts() -> None:
    parsed = Handle.parse("ssh:deploy@::1:2222:docker:/srv/runs/d1")

    assert ("deploy", "::1", 2222, "docker", "/srv/runs/d1", "d1") == (
        parsed.username,
        parsed.host,
        parsed.port,
        parsed.runtime,
        parsed.run_dir,
        parsed.deployment_id,
    )


@pytest.mark.parametrize(
    "handle",
    ["local:host:1:2:/x", "ssh:root@h:22:lxc:/x", "ssh:root@h:22:process:relative", "ssh:h:22:process:/x"],
)
def test_handle__others_refused(handle: str) -> None:
    with pytest.raises(ValueError, match="not an SSH run handle"):
        Handle.parse(handle)


def test_check_names__the_scripts_own_and_non_names() -> None:
    names = ["PATH", "po_ssh_run", "IFS", "MY_VAR", "1ABC", "A-B", "po_sshx"]

    assert ["po_ssh_run", "IFS", "1ABC", "A-B"] == ssh_scripts.check_names(names)


def test_environment_script__one_quoted_export_a_variable() -> None:
    script = ssh_scripts.environment_script({"A": "it's $HOME", "B": "two\nlines"})

    assert ["export A='it'\"'\"'s $HOME'", "export B='two", "lines'"] == script.splitlines()
    assert ["export", "A=it's $HOME", "export", "B=two\nlines"] == shlex.split(script)


def test_environment_script__refuses_names_the_scripts_cannot_pass() -> None:
    with pytest.raises(ValueError, match="po_ssh_x"):
        ssh_scripts.environment_script({"po_ssh_x": "1"})


def test_command__no_argument_is_split_or_expanded() -> None:
    line = ssh_scripts.command("echo \"$1\" 'x'", "/runs/a b", "$(id)")

    assert ["sh", "-c", "echo \"$1\" 'x'", "po-ssh", "/runs/a b", "$(id)"] == shlex.split(line)


def test_parse_launch__the_last_answer_among_noise() -> None:
    answer = ssh_scripts.parse_launch("Welcome!\npo-launch: started /runs/d 1\n")

    assert ssh_scripts.LaunchAnswer(word="started", text="/runs/d 1") == answer
    assert ssh_scripts.parse_launch("no answer here\n") is None


def test_parse_status__word_code_unsaved_state_and_stderr() -> None:
    stdout = (
        "po-status: exited 1\npo-unsaved: 1234 /runs/d/work/code/errored.tfstate\n"
        "po-stderr:\nline one\npo-status: running\n"
    )

    status = ssh_scripts.parse_status(stdout)

    assert status == ssh_scripts.RemoteStatus(
        word="exited",
        exit_code=1,
        unsaved_path="/runs/d/work/code/errored.tfstate",
        unsaved_size=1234,
        stderr_tail="line one\npo-status: running\n",
    )


def test_parse_status__no_answer() -> None:
    assert ssh_scripts.parse_status("bash: sh: command not found\n") is None


def test_redact__secrets_and_each_line_of_a_key() -> None:
    key = "-----BEGIN KEY-----\nAAAAlineone\nBBBBlinetwo\n-----END KEY-----\n"
    text = "failed: token-12345 and BBBBlinetwo, short ab"

    assert "failed: [secret] and [secret], short ab" == redact(text, ["token-12345", key, "ab"])
