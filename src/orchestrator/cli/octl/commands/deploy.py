"""``octl deploy PROJECT ENV MANIFEST`` and ``octl rollback PROJECT ENV DEPLOYMENT``.

Both create a deployment and, unless ``--no-wait``, wait for it and print its decrypted outputs:

1. A fresh age key pair for the outputs and one for the logs; only the public halves are sent.
2. ``POST /orgs/{org}/deployments`` with an ``Idempotency-Key`` (a uuid4), sent again with the same key
   if the connection fails, so a lost answer never starts a second deployment.
3. The keys saved (``keys.default_directory`` or ``--save-keys DIR``; not with ``--no-save-keys``), so
   that ``octl outputs`` reads the outputs again after ``--no-wait`` or Ctrl-C.
4. Its live log followed (``GET .../logs?follow=true``), decrypted here: the phase and the resource
   changes planned and applied so far on a progress line on stderr (``--show-logs``: the log itself);
   where the log cannot be followed, ``wait-for-complete`` long polls in a loop.
5. The status on stderr; the outputs, decrypted here, on stdout. A failed deployment exits 1.

``octl outputs DEPLOYMENT`` is steps 4 and 5 again, with the saved key (or ``--key``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import update_wrapper
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console

from orchestrator.cli.octl import completion, keys, manifest, output
from orchestrator.cli.octl.commands.logs import decrypt_logs, print_log, renderer_for
from orchestrator.cli.octl.follow import FollowError, LogFollower
from orchestrator.cli.octl.inputs import InputError
from orchestrator.cli.octl.progress import DeployProgress, WaitProgress, format_duration
from orchestrator.cli.octl.session import (
    OperationFailure,
    Session,
    UnreachableFailure,
    UsageFailure,
    org_option,
    pass_session,
)
from orchestrator.client.api import ApiConnectionError, ApiError, JsonObject
from orchestrator.protocol import age

F = TypeVar("F", bound=Callable[..., Any])

RUNNER_LOG_LEVELS = ("debug", "info", "warn", "error")
#: The statuses a deployment ends in.
FINAL_STATUSES = ("succeeded", "failed", "cancelled")
#: The API's 404 message once a deployment's outputs are past their retention (upstream's words).
OUTPUTS_GONE = "deployment outputs are no longer available"
#: Seconds the server holds each wait-for-complete call open.
WAIT_SECONDS = 30
#: Consecutive connection failures while waiting before octl gives up (the deployment goes on).
WAIT_RECONNECT_ATTEMPTS = 5
#: Logs are uploaded just before the results; a few short retries cover a slow upload.
LOG_FETCH_ATTEMPTS = 4
LOG_FETCH_DELAY_SECONDS = 0.5


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How to create and follow one deployment (the flags ``deploy`` and ``rollback`` share)."""

    plan_only: bool
    runner_logs_level: str
    dry_run: bool
    no_wait: bool
    show_logs: bool
    save_keys: Path | None
    no_save_keys: bool
    yes: bool
    out: str


def run_options(func: F) -> F:
    """The flags ``deploy`` and ``rollback`` share; the command gets them as ``options``."""

    def command(*args: Any, **kwargs: Any) -> Any:
        # Each flag's parameter is named as its RunOptions field.
        options = RunOptions(**{flag.name: kwargs.pop(flag.name) for flag in fields(RunOptions)})
        return func(*args, options=options, **kwargs)

    wrapped: Any = update_wrapper(command, func)
    flags = (
        click.option("--plan-only", is_flag=True, help="Only plan: show what would change, change nothing."),
        click.option(
            "--dry-run",
            is_flag=True,
            help="Compile only: print the runner, the resource graph diff and the Terraform code.",
        ),
        click.option(
            "--no-wait",
            is_flag=True,
            help="Do not wait: print the deployment id and its logs key, and return.",
        ),
        click.option(
            "--runner-logs-level",
            type=click.Choice(RUNNER_LOG_LEVELS),
            default="info",
            show_default=True,
            help="How much the runner logs.",
        ),
        click.option(
            "--show-logs",
            is_flag=True,
            help="Print the runner logs (stderr) as they come, as Terraform prints them.",
        ),
        click.option(
            "--save-keys",
            metavar="DIR",
            type=click.Path(file_okay=False, path_type=Path),
            help="Write the outputs and logs keys to DIR/<deployment>.{outputs,logs}.key (mode 0600) "
            f"[default: ${keys.KEYS_DIR_ENV}, else $XDG_STATE_HOME/octl/keys, else "
            "~/.local/state/octl/keys]. `octl outputs` reads them.",
        ),
        click.option(
            "--no-save-keys",
            is_flag=True,
            help="Keep the keys in this process only: the outputs cannot be read again once it ends.",
        ),
        click.option(
            "-y",
            "--yes",
            is_flag=True,
            help="Do not ask before a deployment that removes resources (on a terminal it asks, as "
            "`terraform apply` does; elsewhere it says what it removes and goes on).",
        ),
        click.option(
            "-o",
            "--out",
            type=click.Choice(output.FORMATS),
            default="yaml",
            show_default=True,
            help="Format of the outputs (or dry-run result) on stdout.",
        ),
        org_option,
    )
    for flag in reversed(flags):
        wrapped = flag(wrapped)
    return wrapped  # type: ignore[no-any-return]


@click.command("deploy")
@click.argument("project_id", metavar="PROJECT", shell_complete=completion.projects)
@click.argument("env_id", metavar="ENV", shell_complete=completion.envs)
@click.argument("source", metavar="MANIFEST")
@run_options
@pass_session
def deploy(
    session: Session,
    project_id: str,
    env_id: str,
    source: str,
    options: RunOptions,
) -> None:
    """Deploy MANIFEST (a YAML or JSON file, or - for stdin) to environment ENV of PROJECT.

    The manifest lists workloads (their resources and outputs) and shared resources:

    \b
      workloads:
        my-app:
          resources:
            db: {type: postgres}
          outputs:
            db_host: ${resources.db.outputs.host}

    Waits for the deployment and prints its outputs, decrypted with a key made for this deployment
    only. Resources that are no longer in the manifest are destroyed.
    """
    try:
        document = manifest.read(source, sys.stdin)
    except InputError as exc:
        raise UsageFailure(str(exc)) from exc
    body: JsonObject = {"project_id": project_id, "env_id": env_id, "mode": "deploy", "manifest": document}
    run(session, body, options)


@click.command("rollback")
@click.argument("project_id", metavar="PROJECT", shell_complete=completion.projects)
@click.argument("env_id", metavar="ENV", shell_complete=completion.envs)
@click.argument("target_id", metavar="DEPLOYMENT", type=click.UUID, shell_complete=completion.deployments)
@run_options
@pass_session
def rollback(
    session: Session,
    project_id: str,
    env_id: str,
    target_id: uuid.UUID,
    options: RunOptions,
) -> None:
    """Deploy the manifest of an earlier DEPLOYMENT of ENV again (mode rollback).

    Like deploy, it waits and prints the outputs. It does not revert changes to runners,
    providers or module rules.
    """
    body: JsonObject = {
        "project_id": project_id,
        "env_id": env_id,
        "mode": "rollback",
        "rollback_to_deployment_id": str(target_id),
    }
    run(session, body, options)


def run(session: Session, body: JsonObject, options: RunOptions) -> None:
    """Create the deployment ``body`` describes and follow it as ``options`` say."""
    save_dir = None
    if options.save_keys is not None and options.no_save_keys:
        raise UsageFailure("--save-keys and --no-save-keys: give one of them")
    if not options.dry_run and not options.no_save_keys:
        save_dir = _prepare_keys_dir(options.save_keys or keys.default_directory(os.environ))
    outputs_key, logs_key = keys.KeyPair.generate(), keys.KeyPair.generate()
    body = {
        **body,
        "runner_log_level": options.runner_logs_level,
        "encrypted_outputs_recipient": outputs_key.recipient,
        "encrypted_logs_recipient": logs_key.recipient,
    }
    if options.plan_only:
        body["plan_only"] = True
    if options.dry_run:
        body["is_dry_run"] = True
    org = session.org()
    what = f"{body['mode']} deployment{' (plan only)' if body.get('plan_only') else ''}"
    output.note(f"Creating {what} in {body['project_id']}/{body['env_id']}...")
    if not (options.dry_run or options.plan_only or options.yes):
        _confirm_removals(session, org, body)
    started = time.monotonic()
    created = session.client().create_deployment(
        org,
        body,
        idempotency_key=str(uuid.uuid4()),
        on_retry=lambda exc: output.note(f"{exc.message}; sending it again with the same Idempotency-Key..."),
    )
    if options.dry_run:
        output.emit(created, options.out, ())
        output.success(
            f"Dry run: the deployment would run on runner {created.get('runner_id')}; nothing changed."
        )
        return
    deployment_id = str(created["id"])
    output.success(f"Deployment {deployment_id} created; it runs on runner {created.get('runner_id')}.")
    reread = _save_keys(save_dir, deployment_id, outputs_key, logs_key)
    if options.no_wait:
        output.emit({"deployment_id": deployment_id, "logs_key": logs_key.identity}, options.out, ())
        output.note(
            f"Once it completes: `octl get deployment {deployment_id}`; "
            f"`octl logs {deployment_id} --key <logs_key>` prints its logs."
        )
        output.note(
            f"`{reread}` waits for it and prints its outputs."
            if reread
            else "Its outputs are encrypted to a key that was not kept (--no-save-keys)."
        )
        return
    output.note(f"Logs key: {logs_key.identity} (`octl logs {deployment_id} --key <key>`)")
    deployment = watch(
        session, org, deployment_id, started, logs_key.identity, show_logs=options.show_logs, reread=reread
    )
    report(session, org, deployment, outputs_key.identity, started, options.out)


def _confirm_removals(session: Session, org: str, body: JsonObject) -> None:
    """Before a deployment that removes resources (the dry run's diff says which): ask on a terminal, as
    `terraform apply` does; where no one can answer (standard input or error not a terminal: a pipeline, a
    manifest piped in), say what it removes and go on."""
    dry_run = session.client().create_deployment(org, {**body, "is_dry_run": True})
    changes = (dry_run.get("diff") or {}).get("changes") or []
    removed = [change for change in changes if change.get("type") == "removed"]
    if not removed:
        return
    target = f"{body['project_id']}/{body['env_id']}"
    lines = "".join(f"\n  - {change.get('resource')}: {change.get('summary')}" for change in removed)
    listing = f"This deployment removes {len(removed)} resource(s) from {target}:{lines}"
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        output.note(f"{listing}\n(not asked: no terminal to answer on; --yes leaves this note out)")
        return
    output.note(listing)
    if not click.confirm("Do you want to continue?", default=False, err=True):
        raise OperationFailure(
            f"not deployed: the removal from {target} was not confirmed (pass --yes to deploy without asking)"
        )


def _save_keys(
    save_dir: Path | None, deployment_id: str, outputs_key: keys.KeyPair, logs_key: keys.KeyPair
) -> str:
    """Save the keys where the user finds them again; the command that reads the outputs with them
    ("" when they are not saved)."""
    if save_dir is None:
        return ""
    saved = keys.save(save_dir, keys.outputs_file(save_dir, deployment_id).name, outputs_key)
    keys.save(save_dir, keys.logs_file(save_dir, deployment_id).name, logs_key)
    output.note(f"Keys saved to {saved.parent} ({deployment_id}.outputs.key, {deployment_id}.logs.key).")
    default = save_dir == keys.default_directory(os.environ)
    return f"octl outputs {deployment_id}" + ("" if default else f" --keys-dir {save_dir}")


def _prepare_keys_dir(directory: Path) -> Path:
    try:
        return keys.prepare_directory(directory)
    except InputError as exc:
        raise UsageFailure(str(exc)) from exc


def watch(
    session: Session,
    org: str,
    deployment_id: str,
    started: float,
    identity: str,
    *,
    show_logs: bool,
    reread: str = "",
) -> JsonObject:
    """The deployment once final, its live log followed meanwhile: its phases and resource changes on the
    progress line (live on a terminal, a plain line per phase elsewhere), the log as Terraform prints it on
    stderr with ``show_logs``. Where the log cannot be followed, it waits as :func:`wait` does."""
    client = session.client()
    progress = DeployProgress(deployment_id, console=Console(stderr=True), started=started)
    renderer = renderer_for(sys.stderr)
    printed: list[str] = []

    def text(chunk: str, _phase: str | None) -> None:
        progress.feed(chunk)
        if not show_logs:
            return
        rendered = renderer.text(chunk)
        if rendered:
            if not printed:
                progress.print("Runner logs:\n")
            printed.append(rendered)
            progress.print(rendered)

    follower = LogFollower(
        client=client,
        org=org,
        deployment_id=deployment_id,
        identity=identity,
        on_text=text,
        on_phase=lambda phase, _at: progress.set_phase(phase),
        on_gap=lambda first, last: progress.print(
            f"Warning: log chunks {first}..{last} never reached the server: lines are missing here\n"
        ),
    )
    try:
        with progress:
            progress.poll()
            try:
                follower.run()
                deployment = client.get_deployment(org, deployment_id)
            except (FollowError, ApiError, ApiConnectionError) as exc:
                progress.print(
                    f"Cannot follow the log of deployment {deployment_id} ({exc}); waiting for it.\n"
                )
                deployment = None
    except KeyboardInterrupt:
        _stopped_waiting(deployment_id, reread)
    if deployment is None or deployment.get("status") not in FINAL_STATUSES:
        deployment = wait(session, org, deployment_id, started, reread=reread)
        if show_logs and not printed:
            _show_logs(session, org, deployment_id, identity)
    elif show_logs and not printed:
        output.note(f"Deployment {deployment_id} has no runner logs (its runner sent none).")
    return deployment


def _stopped_waiting(deployment_id: str, reread: str) -> NoReturn:
    then = f"; `{reread}` prints its outputs" if reread else ""
    output.note(
        f"\nStopped waiting; deployment {deployment_id} goes on: `octl get deployment {deployment_id}`"
        f"{then}; `octl cancel {deployment_id}` stops it."
    )
    raise click.exceptions.Exit(130) from None


def wait(session: Session, org: str, deployment_id: str, started: float, *, reread: str = "") -> JsonObject:
    """The deployment once final; connection failures are retried a few times (it runs on regardless).
    ``reread``: the command that reads the outputs again, told on Ctrl-C."""
    client = session.client()
    failures = 0
    progress = WaitProgress(
        f"Waiting for deployment {deployment_id} to complete", console=Console(stderr=True), started=started
    )
    try:
        with progress:
            while True:
                progress.poll()
                try:
                    done = client.wait_for_deployment(org, deployment_id, timeout_seconds=WAIT_SECONDS)
                except ApiConnectionError as exc:
                    failures += 1
                    if failures > WAIT_RECONNECT_ATTEMPTS:
                        raise UnreachableFailure(
                            f"{exc.message}; deployment {deployment_id} goes on without octl: "
                            f"`octl get deployment {deployment_id}` shows how it ends"
                        ) from exc
                    time.sleep(min(2.0**failures, 30.0))
                    continue
                failures = 0
                if done is not None:
                    return done
    except KeyboardInterrupt:
        _stopped_waiting(deployment_id, reread)


def _show_logs(session: Session, org: str, deployment_id: str, identity: str) -> None:
    """The runner logs on stderr; a problem with them is reported, but does not fail the command."""
    ciphertext = None
    for attempt in range(1, LOG_FETCH_ATTEMPTS + 1):
        try:
            ciphertext = session.client().get_deployment_logs(org, deployment_id)
            break
        except ApiError as exc:
            if exc.status != 404 or attempt == LOG_FETCH_ATTEMPTS:
                output.note(f"Cannot show the runner logs: {exc}")
                return
            time.sleep(LOG_FETCH_DELAY_SECONDS * 2 ** (attempt - 1))
    assert ciphertext is not None
    try:
        text = decrypt_logs(deployment_id, ciphertext, identity)
    except OperationFailure as exc:
        output.note(f"Cannot show the runner logs: {exc.message}")
        return
    output.note("Runner logs:")
    print_log(text, raw=False, err=True)


def _resources_line(deployment: JsonObject) -> str | None:
    metrics = deployment.get("metrics") or {}
    counts = [metrics.get(f"num_tf_resources_{k}") for k in ("added", "changed", "removed")]
    if any(not isinstance(c, int) for c in counts):
        return None
    added, changed, removed = counts
    if deployment.get("plan_only"):
        return f"Plan: {added} to add, {changed} to change, {removed} to remove."
    return f"Resources: {added} added, {changed} changed, {removed} removed."


def report(
    session: Session, org: str, deployment: JsonObject, identity: str, started: float, out: str
) -> None:
    """The deployment's end on stderr; its outputs, decrypted with ``identity``, on stdout."""
    deployment_id = str(deployment.get("id"))
    status, message = deployment.get("status"), deployment.get("status_message") or ""
    elapsed = format_duration(time.monotonic() - started)
    if status != "succeeded":
        raise OperationFailure(f"deployment {deployment_id} {status} after {elapsed}: {message}")
    output.success(f"Deployment {deployment_id} succeeded after {elapsed}: {message}")
    resources = _resources_line(deployment)
    if resources:
        output.note(resources)
    try:
        raw = session.client().get_encrypted_outputs(org, deployment_id)
    except ApiError as exc:
        if exc.status != 404:
            raise
        if exc.message == OUTPUTS_GONE or deployment.get("has_outputs") is not False:
            # Past the retention (the server's "no longer available"), or deleted since it was read.
            raise OperationFailure(
                f"the outputs of deployment {deployment_id} are no longer available: the server answers "
                "them for a while after a deployment ends (PO_OUTPUTS_RETENTION_SECONDS, 5 minutes by "
                "default); deploy again to read them"
            ) from exc
        output.note("The deployment reported no outputs.")
        return
    try:
        values = json.loads(age.decrypt_b64(raw, identity))
    except (age.AgeDecryptError, ValueError) as exc:
        raise OperationFailure(f"the outputs of deployment {deployment_id} cannot be read: {exc}") from exc
    # Keyed by workload already: the compiled code names each workload's output after the workload.
    output.emit(values, out, ())


@click.command("outputs")
@click.argument("deployment_id", metavar="DEPLOYMENT", type=click.UUID, shell_complete=completion.deployments)
@click.option(
    "--key",
    metavar="AGE-SECRET-KEY-...|@FILE",
    help="The outputs key of the deployment [default: the one `octl deploy` saved in --keys-dir].",
)
@click.option(
    "--keys-dir",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Where `octl deploy` saved the keys [default: ${keys.KEYS_DIR_ENV}, else "
    "$XDG_STATE_HOME/octl/keys, else ~/.local/state/octl/keys].",
)
@click.option("--no-wait", is_flag=True, help="Fail at once if the deployment still executes.")
@click.option(
    "-o",
    "--out",
    type=click.Choice(output.FORMATS),
    default="yaml",
    show_default=True,
    help="Output format.",
)
@org_option
@pass_session
def outputs(
    session: Session,
    deployment_id: uuid.UUID,
    key: str | None,
    keys_dir: Path | None,
    no_wait: bool,
    out: str,
) -> None:
    """Print the outputs of DEPLOYMENT again (after `deploy --no-wait`, or when waiting was stopped).

    Waits for the deployment if it still executes, then decrypts its outputs here with the key
    `octl deploy` saved (or --key). The server answers the outputs for a while after the deployment
    ends (PO_OUTPUTS_RETENTION_SECONDS, 5 minutes by default).

    \b
    Example:
      octl deploy shop dev manifest.yaml --no-wait
      octl outputs 5f0c6a52-3a4e-4d8f-9d0e-2b7c1e4f8a90
      octl outputs 5f0c6a52-3a4e-4d8f-9d0e-2b7c1e4f8a90 --key @keys/5f0c6a52-....outputs.key -o json
    """
    identity = _outputs_identity(str(deployment_id), key, keys_dir)
    org = session.org()
    started = time.monotonic()
    deployment = session.client().get_deployment(org, str(deployment_id))
    if deployment.get("status") not in FINAL_STATUSES:
        if no_wait:
            raise OperationFailure(
                f"deployment {deployment_id} is still {deployment.get('status')}; run without --no-wait to "
                "wait for it"
            )
        deployment = wait(session, org, str(deployment_id), started)
    report(session, org, deployment, identity, started, out)


def _outputs_identity(deployment_id: str, key: str | None, keys_dir: Path | None) -> str:
    try:
        if key is not None:
            return keys.read_identity("--key", key)
        directory = keys_dir or keys.default_directory(os.environ)
        path = keys.outputs_file(directory, deployment_id)
        if not path.is_file():
            raise InputError(
                f"no outputs key of deployment {deployment_id} in {directory}: pass --key (the key `octl "
                "deploy` printed or saved), or --keys-dir where `deploy --save-keys` put it"
            )
        return keys.read_identity("--key", f"@{path}")
    except InputError as exc:
        raise UsageFailure(str(exc)) from exc
