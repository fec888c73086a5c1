"""``octl create agent-key``: a key pair for a runner agent, and the runner configuration that registers it.

The private key (PKCS#8 PEM) goes to a new file readable only by its owner; give it to the agent as
``PRIVATE_KEY``. The public key goes into the printed ``runner_configuration`` (``key`` of a
``kubernetes-agent`` runner, ``connection.key`` of a ``vm`` runner), ready for ``octl create runner``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.octl import output
from orchestrator.cli.octl.commands import verbs


def runner_configuration(
    runner_type: str, public_key: str, *, namespace: str, service_account: str
) -> dict[str, Any]:
    """The ``runner_configuration`` of a runner whose agent holds the matching private key."""
    if runner_type == "vm":
        return {"type": "vm", "connection": {"type": "agent", "key": public_key}}
    return {
        "type": "kubernetes-agent",
        "key": public_key,
        "job": {"namespace": namespace, "service_account": service_account},
    }


def _write_private(path: Path, pem: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise click.ClickException(f"{path} exists already; not overwriting a key") from exc
    except OSError as exc:
        raise click.ClickException(f"cannot create {path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "w") as handle:
        handle.write(pem)


@verbs.create.command("agent-key")
@click.option(
    "--runner-type",
    type=click.Choice(["vm", "kubernetes-agent"]),
    required=True,
    help="The type of the runner the agent serves.",
)
@click.option(
    "--private-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Where to write the private key (PKCS#8 PEM, mode 0600); an existing file is never overwritten.",
)
@click.option(
    "--namespace", default="default", show_default=True, help="kubernetes-agent: the Jobs' namespace."
)
@click.option(
    "--service-account",
    default="platform-orchestrator-runner",
    show_default=True,
    help="kubernetes-agent: the Jobs' service account.",
)
@output.out_option("yaml")
def create_agent_key(
    runner_type: str, private_key_file: Path, namespace: str, service_account: str, out: str
) -> None:
    """Generate an Ed25519 key pair for a runner agent and print the matching runner configuration.

    e.g. `octl create agent-key --runner-type vm --private-key-file agent.pem > runner.yaml`, add a
    state_storage_configuration to runner.yaml, then `octl create runner my-runner --set-yaml=@runner.yaml`
    and start the agent with PRIVATE_KEY="$(cat agent.pem)".
    """
    # Imported here: JWT and key code are needed by this command only, not by every octl start.
    from orchestrator.protocol import agent_auth

    private_pem, public_pem = agent_auth.generate_key_pair()
    _write_private(private_key_file, private_pem)
    configuration = runner_configuration(
        runner_type, public_pem, namespace=namespace, service_account=service_account
    )
    output.emit({"runner_configuration": configuration}, out, ())
    output.success(
        f"Private key written to {private_key_file}: give it to the agent as PRIVATE_KEY, and keep it secret."
    )
