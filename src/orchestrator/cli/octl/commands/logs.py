"""``octl logs DEPLOYMENT``: a deployment's log, decrypted here and rendered as Terraform prints it.

The log is encrypted by the runner to a key only the deployer holds (``octl deploy`` makes one per
deployment and saves it). It is decrypted on this machine: the identity never goes to the server.
The key is ``--key``, else the one ``octl deploy`` saved (``--keys-dir``, else the default keys directory),
as ``octl outputs`` finds its key. Without a key there is nothing readable to print: on a terminal ``octl
logs`` says how to decrypt and exits 2; piped it prints the ciphertext as stored (upstream's behaviour)
and says so on stderr.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import click

from orchestrator.cli.octl import completion, keys, output
from orchestrator.cli.octl.follow import FollowError, LogFollower
from orchestrator.cli.octl.inputs import InputError
from orchestrator.cli.octl.log_render import DEFAULT_WIDTH, LogRenderer
from orchestrator.cli.octl.session import OperationFailure, Session, UsageFailure, org_option, pass_session
from orchestrator.client.api import ApiError
from orchestrator.protocol import age


@dataclass(frozen=True, kw_only=True)
class LogsKey:
    """The identity that opens a deployment's logs, or where it was looked for in vain."""

    identity: str | None
    #: The key file looked for (it did not exist) when ``identity`` is None.
    looked_for: Path


def find_logs_key(deployment_id: str, key: str | None, keys_dir: Path | None) -> LogsKey:
    """``--key`` (a key or ``@FILE``), else the key ``octl deploy`` saved for the deployment."""
    directory = keys_dir or keys.default_directory(os.environ)
    path = keys.logs_file(directory, deployment_id)
    try:
        if key is not None:
            return LogsKey(identity=keys.read_identity("--key", key), looked_for=path)
        if not path.is_file():
            return LogsKey(identity=None, looked_for=path)
        return LogsKey(identity=keys.read_identity("--key", f"@{path}"), looked_for=path)
    except InputError as exc:
        raise UsageFailure(str(exc)) from exc


def how_to_decrypt(deployment_id: str, looked_for: Path) -> str:
    """What to do when no key was found: the flags, and where ``octl deploy`` keeps the keys."""
    return (
        f"the logs of deployment {deployment_id} are encrypted to the deployer's logs key, and it is not in "
        f"{looked_for.parent} ({looked_for.name} not found): pass --key AGE-SECRET-KEY-1... or --key @FILE "
        "(the logs key `octl deploy` printed and saved), or --keys-dir DIR where `octl deploy --save-keys "
        f"DIR` put it (default: ${keys.KEYS_DIR_ENV}, else $XDG_STATE_HOME/octl/keys, else "
        "~/.local/state/octl/keys)"
    )


def decrypt_logs(deployment_id: str, ciphertext: str, identity: str) -> str:
    """The plain logs; a key that does not open them is the user's error (exit 1), named as such."""
    try:
        plain = age.decrypt_b64(ciphertext.strip(), identity)
    except age.AgeDecryptError as exc:
        raise OperationFailure(wrong_key(deployment_id)) from exc
    return plain.decode("utf-8", errors="replace")


def wrong_key(deployment_id: str) -> str:
    return (
        f"the logs of deployment {deployment_id} do not decrypt with this key: it is not the logs key "
        "of this deployment"
    )


def renderer_for(stream: TextIO) -> LogRenderer:
    """A renderer for ``stream``: its terminal's width and colours there (unless NO_COLOR), else
    Terraform's 78 columns and no colour."""
    terminal = _is_terminal(stream)
    width = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns if terminal else DEFAULT_WIDTH
    return LogRenderer(width=width, colour=terminal and output.colour_wanted())


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def print_log(text: str, *, raw: bool, err: bool = False) -> None:
    """A decrypted log on stdout (or stderr): rendered, or its lines as they are with ``raw``."""
    stream = sys.stderr if err else sys.stdout
    rendered = text if raw else renderer_for(stream).text(text)
    if rendered:
        click.echo(rendered, nl=not rendered.endswith("\n"), err=err)


def keys_options(func: click.decorators.FC) -> click.decorators.FC:
    """``--key`` and ``--keys-dir``: where the logs key comes from."""
    func = click.option(
        "--keys-dir",
        metavar="DIR",
        type=click.Path(file_okay=False, path_type=Path),
        help=f"Where `octl deploy` saved the keys [default: ${keys.KEYS_DIR_ENV}, else "
        "$XDG_STATE_HOME/octl/keys, else ~/.local/state/octl/keys].",
    )(func)
    return click.option(
        "--key",
        metavar="AGE-SECRET-KEY-...|@FILE",
        help="The logs key of the deployment [default: the one `octl deploy` saved in --keys-dir].",
    )(func)


@click.command("logs")
@click.argument("deployment_id", metavar="DEPLOYMENT", type=click.UUID, shell_complete=completion.deployments)
@keys_options
@click.option(
    "--raw",
    is_flag=True,
    help="Print the log's lines as the runner wrote them (its JSON lines, Terraform's -json lines) instead "
    "of the text Terraform prints.",
)
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Follow the log while the deployment runs (its phases on stderr) until it ends; exits 1 if it "
    "did not succeed.",
)
@org_option
@pass_session
def logs(
    session: Session,
    deployment_id: uuid.UUID,
    key: str | None,
    keys_dir: Path | None,
    raw: bool,
    follow: bool,
) -> None:
    """Print the runner logs of a deployment, as Terraform prints them.

    The logs are encrypted by the runner to a key only the deployer holds; they are decrypted here
    with the key `octl deploy` saved (or --key), so the key never leaves this machine. Without a key,
    on a terminal it says how to decrypt (exit 2); piped it prints the logs as stored (base64 age
    ciphertext) and says so on stderr. With -f it follows the log live, chunk by chunk, while the
    deployment runs, and ends with its status.
    """
    deployment = str(deployment_id)
    found = find_logs_key(deployment, key, keys_dir)
    if found.identity is None and (follow or _is_terminal(sys.stdout)):
        raise UsageFailure(how_to_decrypt(deployment, found.looked_for))
    if follow:
        assert found.identity is not None
        follow_log(session, deployment, found.identity, raw=raw)
        return
    client, org = session.client(), session.org()
    try:
        ciphertext = client.get_deployment_logs(org, deployment)
    except ApiError as exc:
        # No whole log yet (the deployment runs): what its runner streamed so far.
        if (
            exc.status != 404
            or found.identity is None
            or not _print_chunks(session, deployment, found.identity, raw)
        ):
            raise
        output.note(f"Deployment {deployment} has no whole log yet: `octl logs -f {deployment}` follows it.")
        return
    if found.identity is None:
        output.warning(
            "printing the logs as stored (base64 age ciphertext): "
            + how_to_decrypt(deployment, found.looked_for)
        )
        click.echo(ciphertext, nl=not ciphertext.endswith("\n"))
        return
    print_log(decrypt_logs(deployment, ciphertext, found.identity), raw=raw)


def _print_chunks(session: Session, deployment_id: str, identity: str, raw: bool) -> bool:
    """The live log's chunks stored so far, decrypted and printed; False when there are none."""
    from orchestrator.protocol import log_stream

    client, org, after = session.client(), session.org(), 0
    renderer = renderer_for(sys.stdout)
    try:
        page = client.get_deployment_log_chunks(org, deployment_id, after=after)
    except ApiError:
        return False
    if not page.get("items"):
        return False
    while True:
        for item in page["items"]:
            try:
                chunk = log_stream.decrypt_chunk(
                    item["ciphertext"], identity, deployment_id=deployment_id, seq=item["seq"]
                )
            except age.AgeDecryptError as exc:
                raise OperationFailure(wrong_key(deployment_id)) from exc
            shown = chunk.text if raw else renderer.text(chunk.text)
            if shown:
                click.echo(shown, nl=False)
            after = int(item["seq"])
        if after >= int(page.get("last_seq") or 0) or not page["items"]:
            return True
        page = client.get_deployment_log_chunks(org, deployment_id, after=after)


def follow_log(session: Session, deployment_id: str, identity: str, *, raw: bool) -> None:
    """``logs -f``: the log on stdout as it comes, the phases and the end on stderr."""
    renderer = renderer_for(sys.stdout)

    def text(chunk: str, _phase: str | None) -> None:
        shown = chunk if raw else renderer.text(chunk)
        if shown:
            click.echo(shown, nl=False)

    follower = LogFollower(
        client=session.client(),
        org=session.org(),
        deployment_id=deployment_id,
        identity=identity,
        on_text=text,
        on_phase=lambda phase, _at: output.note(f"Phase: {phase}"),
        on_gap=lambda first, last: output.warning(
            f"log chunks {first}..{last} of deployment {deployment_id} never reached the server: "
            "lines are missing here"
        ),
        on_reconnect=lambda reason: output.note(
            f"{reason}; following again after chunk {follower.last_seq}..."
        ),
    )
    try:
        end = follower.run()
    except FollowError as exc:
        raise OperationFailure(str(exc)) from exc
    message = f"Deployment {deployment_id} {end.status}: {end.status_message}".rstrip(": ")
    if end.status != "succeeded":
        raise OperationFailure(message)
    output.success(message)
