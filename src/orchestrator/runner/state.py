"""The environment's Terraform state, as the runner keeps it safe through an outage of its backend.

Two layers:

1. Terraform's own retries. The ``http`` backend (state storage ``orchestrator``) retries every request
   (GET and POST of the state, LOCK, UNLOCK) on a connection error or a 5xx answer (go-retryablehttp;
   checked with Terraform 1.15, ``tests/integration/test_state_retries.py``), but by default only twice,
   1 s and 2 s apart: an orchestrator restart of more than 3 s failed the state write. The runner sets
   ``TF_HTTP_RETRY_*`` (``http_retry_environment``) so that the retries last
   ``RUNNER_STATE_HTTP_RETRY_SECONDS`` (10 minutes), with waits capped at 10 s, so that the engine goes on
   at most 10 s after the orchestrator is back.
2. When Terraform still gives up, it writes ``errored.tfstate`` into its working directory and fails.
   ``StateRescue`` saves that file: the ``http`` backend's state goes to the orchestrator
   (``POST .../errored-state``, which makes it the environment's state, or keeps it sealed); another
   backend's is pushed with ``terraform state push``, retried with backoff (a lock this run left behind
   is released first with ``force-unlock`` of its own lock id, never anyone else's), and when that fails
   for good it goes to the orchestrator, which keeps it sealed. The file is removed only once it is
   saved; otherwise it stays where it is, and the deployment's message says where.
"""

from __future__ import annotations

import contextlib
import getpass
import re
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from orchestrator import errors
from orchestrator.client.tls import GatewayTls
from orchestrator.runner import gateway_client, iac, logs

#: What Terraform writes when it cannot save the state to its backend.
ERRORED_STATE = "errored.tfstate"
HTTP_RETRY_WAIT_MIN_SECONDS = 1
HTTP_RETRY_WAIT_MAX_SECONDS = 10
#: The first words of every message about a rescued state.
HEADLINE = "Terraform could not save its state"
#: Longest wait between two `state push` attempts.
MAX_PUSH_BACKOFF_SECONDS = 30.0
#: A lock created this long before the run started is not this run's.
_LOCK_CLOCK_SLACK = timedelta(seconds=5)
#: `state push` refused the file for good: it does not continue the backend's state (lineage, serial).
_REFUSED = "cannot import state with"


def http_retry_environment(retry_seconds: float) -> dict[str, str]:
    """``TF_HTTP_RETRY_*`` for retries lasting about ``retry_seconds``: go-retryablehttp waits
    ``min * 2**n`` seconds before retry ``n + 1``, capped at ``max``."""
    retries, total = 0, 0.0
    while total < retry_seconds:
        total += min(HTTP_RETRY_WAIT_MIN_SECONDS * 2**retries, HTTP_RETRY_WAIT_MAX_SECONDS)
        retries += 1
    return {
        "TF_HTTP_RETRY_MAX": str(retries),
        "TF_HTTP_RETRY_WAIT_MIN": str(HTTP_RETRY_WAIT_MIN_SECONDS),
        "TF_HTTP_RETRY_WAIT_MAX": str(HTTP_RETRY_WAIT_MAX_SECONDS),
    }


def http_tls_environment(tls: GatewayTls) -> dict[str, str]:
    """``TF_HTTP_CLIENT_*`` for Terraform's ``http`` backend, which reads neither RUNNER_GATEWAY_CA nor
    the mTLS files: the gateway's extra CA and the client pair, so that the state requests verify and
    present what the runner's own do. A CA given there is the only one the backend trusts (the system
    CAs, some 200 KB, do not fit in one variable): RUNNER_GATEWAY_CA must be the CA of the gateway's
    certificate. Nothing without an extra CA or pair; files that cannot be read are left out (the
    runner's own client loaded them already and would have stopped)."""
    env: dict[str, str] = {}
    extra = []
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if tls.ca_file is not None:
            extra.append(tls.ca_file.read_text())
    if tls.ca_pem:
        extra.append(tls.ca_pem)
    if extra:
        env["TF_HTTP_CLIENT_CA_CERTIFICATE_PEM"] = "\n".join(extra)
    if tls.client_cert_file is not None and tls.client_key_file is not None:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            env["TF_HTTP_CLIENT_CERTIFICATE_PEM"] = tls.client_cert_file.read_text()
            env["TF_HTTP_CLIENT_PRIVATE_KEY_PEM"] = tls.client_key_file.read_text()
    return env


@dataclass(frozen=True, kw_only=True)
class LockInfo:
    """The holder of a state lock, as Terraform prints it when it cannot take the lock."""

    id: str
    who: str
    operation: str
    created: datetime | None


_LOCK_FIELD = re.compile(r"^\s*(ID|Who|Operation|Created):\s*(.*?)\s*$")
#: Colours, and the diagnostic box Terraform draws when colour is on (``│ `` before each line).
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_BOX = "│╷╵"


def parse_lock_info(lines: Sequence[str]) -> LockInfo | None:
    """The ``Lock Info:`` block of Terraform's "Error acquiring the state lock"; None without one."""
    fields: dict[str, str] = {}
    inside = False
    for raw in lines:
        line = _COLOUR.sub("", raw).lstrip().lstrip(_BOX)
        if line.strip() == "Lock Info:":
            inside = True
            continue
        match = _LOCK_FIELD.match(line) if inside else None
        if match is not None:
            fields.setdefault(match.group(1), match.group(2))
    if not fields.get("ID"):
        return None
    return LockInfo(
        id=fields["ID"],
        who=fields.get("Who", ""),
        operation=fields.get("Operation", ""),
        created=_go_time(fields.get("Created", "")),
    )


def _go_time(text: str) -> datetime | None:
    """Go's ``time.Time.String()`` in UTC: ``2026-01-02 15:04:05.123456789 +0000 UTC``."""
    match = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(\d+))? \+0000", text)
    if match is None:
        return None
    micros = (match.group(2) or "0")[:6].ljust(6, "0")
    return datetime.fromisoformat(f"{match.group(1)}.{micros}").replace(tzinfo=UTC)


def lock_owner() -> str:
    """``user@host`` as Terraform writes it into the locks it takes (``statemgr.NewLockInfo``)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    return f"{user}@{socket.gethostname()}"


@dataclass(eq=False, repr=False, kw_only=True)
class StateRescue:
    """Saves the ``errored.tfstate`` a failed command left in ``code_dir``; see the module docstring."""

    cli: iac.IacCli
    gateway: gateway_client.GatewayClient
    log: logs.RunnerLogger
    env_uuid: str | None
    deployment_id: str
    retry_seconds: float
    started_at: datetime
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def rescue(self, code_dir: Path, *, http_backend: bool) -> str | None:
        """Save the errored state, if there is one: the words for the deployment's message, else None."""
        path = code_dir / ERRORED_STATE
        if not path.is_file():
            return None
        self.log.error("Terraform could not save its state; saving errored.tfstate", path=str(path))
        deadline = self.clock() + self.retry_seconds
        if http_backend:
            return self._hand_over(path, deadline, why=None)
        pushed, why = self._push(path, deadline)
        if pushed:
            path.unlink()
            self.log.warning("errored.tfstate pushed to the state backend; removed from the code dir")
            return f"{HEADLINE}; the runner pushed it to the state backend with `terraform state push`"
        return self._hand_over(path, deadline, why=why)

    def _hand_over(self, path: Path, deadline: float, *, why: str | None) -> str:
        """Give the state to the orchestrator (retried until ``deadline``); it stays here if that fails."""
        first = f"{HEADLINE} and the runner could not push it ({why})" if why else HEADLINE
        if self.env_uuid is None:
            return (
                f"{first}; DEPLOYMENT_ENV_UUID is not set, so it stays in {path}: push it with "
                "`terraform state push`"
            )
        try:
            receipt = self.gateway.upload_errored_state(
                self.env_uuid,
                self.deployment_id,
                path.read_bytes(),
                retry_seconds=max(0.0, deadline - self.clock()),
            )
        except (errors.OrchestratorError, OSError) as exc:
            # Also a TerminatedError (the runner is being stopped): the file stays, the launcher keeps it.
            reason = exc.message if isinstance(exc, errors.OrchestratorError) else str(exc)
            self.log.error("errored.tfstate could not be handed to the orchestrator", reason=reason)
            return (
                f"{first}; the runner could not hand it to the orchestrator ({reason}): it stays in "
                f"{path}, push it with `terraform state push`"
            )
        path.unlink()
        self.log.warning("errored.tfstate handed to the orchestrator; removed from the code dir")
        return f"{first}; the runner recovered it: {receipt.message}"

    def _push(self, path: Path, deadline: float) -> tuple[bool, str]:
        """``terraform state push`` until it works, is refused for good, or ``deadline`` passes;
        (pushed, why not)."""
        attempt = 0
        released: set[str] = set()
        while True:
            attempt += 1
            try:
                result = self.cli.run("state", "push", "-no-color", "-lock-timeout=0s", path.name)
            except (errors.OrchestratorError, OSError) as exc:
                return False, f"`state push` did not run: {exc}"
            if result.ok:
                return True, ""
            output = [*result.stdout, *result.stderr]
            text = "\n".join(output)
            if "Error acquiring the state lock" in text:
                lock = parse_lock_info(output)
                if lock is None or lock.id in released or not self._ours(lock):
                    holder = f"lock {lock.id} of {lock.who}" if lock else "a lock"
                    return False, f"the state is held by {holder}, not by this run"
                self.log.warning("releasing the state lock this run left behind", lock_id=lock.id)
                released.add(lock.id)
                self.cli.run("force-unlock", "-no-color", "-force", lock.id)
                continue
            if _REFUSED in text:
                return False, _last_error(output)
            delay = min(2.0 ** min(attempt - 1, 10), MAX_PUSH_BACKOFF_SECONDS)
            if self.clock() + delay >= deadline:
                return False, _last_error(output)
            self.log.warning("`state push` failed; retrying", attempt=attempt, delay_seconds=delay)
            self.sleep(delay)

    def _ours(self, lock: LockInfo) -> bool:
        """A lock this run's engine took: its user and host, taken after the run started."""
        return (
            lock.who == lock_owner()
            and lock.created is not None
            and lock.created >= self.started_at - _LOCK_CLOCK_SLACK
        )


def _last_error(lines: Sequence[str]) -> str:
    text = " ".join(line.strip() for line in lines if line.strip())
    return text[-500:] if text else "no output"
