"""The age keys of a deployment, on the user's side.

``octl deploy`` makes a fresh X25519 key pair for the outputs and one for the logs of each deployment and
sends only the recipients (``age1...``). The identities (``AGE-SECRET-KEY-1...``) are saved before the
deployment is waited for, so that ``--no-wait`` or Ctrl-C never leave its outputs unreadable: to
:func:`default_directory` (or ``--save-keys DIR``), in files readable by the owner only, in the format of
``age-keygen``, which ``age -d -i FILE``, ``octl outputs`` and ``octl logs --key @FILE`` read.
``--no-save-keys`` keeps them in memory only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.cli.octl import inputs
from orchestrator.cli.octl.inputs import InputError
from orchestrator.protocol import age

IDENTITY_PREFIX = "AGE-SECRET-KEY-"
#: Overrides where the keys go by default.
KEYS_DIR_ENV = "OCTL_KEYS_DIR"


def default_directory(environ: Mapping[str, str]) -> Path:
    """Where deployments' keys are saved without ``--save-keys``: ``$OCTL_KEYS_DIR``, else
    ``$XDG_STATE_HOME/octl/keys``, else ``~/.local/state/octl/keys``."""
    if environ.get(KEYS_DIR_ENV):
        return Path(environ[KEYS_DIR_ENV]).expanduser()
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "octl" / "keys"


def outputs_file(directory: Path, deployment_id: str) -> Path:
    return directory / f"{deployment_id}.outputs.key"


def logs_file(directory: Path, deployment_id: str) -> Path:
    return directory / f"{deployment_id}.logs.key"


@dataclass(frozen=True, kw_only=True)
class KeyPair:
    #: ``AGE-SECRET-KEY-1...``: secret, decrypts.
    identity: str
    #: ``age1...``: public, what the runner encrypts to.
    recipient: str

    @classmethod
    def generate(cls) -> KeyPair:
        identity, recipient = age.generate_identity()
        return cls(identity=identity, recipient=recipient)

    def file_text(self, *, now: datetime | None = None) -> str:
        """The key as ``age-keygen`` writes it."""
        created = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"# created: {created}\n# public key: {self.recipient}\n{self.identity}\n"


def prepare_directory(directory: Path) -> Path:
    """Create ``directory`` (mode 0700) if needed; checked before anything is deployed."""
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise InputError(f"--save-keys: cannot create '{directory}': {exc.strerror or exc}") from exc
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InputError(f"--save-keys: '{directory}' is not writable")
    return directory


def save(directory: Path, name: str, pair: KeyPair) -> Path:
    """Write ``pair`` to ``directory/name``, mode 0600 from the start; an existing file is never replaced."""
    path = directory / name
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise InputError(f"--save-keys: cannot write '{path}': {exc.strerror or exc}") from exc
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(pair.file_text())
    return path


def read_identity(flag: str, value: str) -> str:
    """The identity a ``--key`` value gives: the key, or ``@FILE`` holding it (``age-keygen`` format)."""
    text = value
    if value.startswith("@"):
        text = inputs.read_file(flag, inputs.file_path(flag, value), text="a text file")
    lines = [line.strip() for line in text.splitlines()]
    found = [line for line in lines if line and not line.startswith("#")]
    if len(found) != 1 or not found[0].upper().startswith(IDENTITY_PREFIX):
        # Never echo the value: it may be a secret key with a typo.
        raise InputError(f"{flag}: expected one age secret key ({IDENTITY_PREFIX}1...) or @FILE holding one")
    try:
        age.recipient_of(found[0])
    except age.AgeKeyError as exc:
        raise InputError(f"{flag}: not a valid age secret key ({IDENTITY_PREFIX}1...)") from exc
    return found[0]
