"""The remote half of the ``vm`` runner over SSH: POSIX ``sh`` scripts, what they are sent, what they answer.

Pure code, no I/O: ``launchers.ssh`` runs these over an SSH connection. Every script is the command of
one SSH exec channel (``sh -c SCRIPT po-ssh ARGS...``, quoted for the login's shell). No script and no
argument holds a secret: the run's environment (the runner's variables, ``job.environment`` and
``job.secrets``) travels on the channel's stdin as ``export NAME='value'`` lines, which the launch
script reads into memory and ``eval``\\ s (``export`` and ``eval`` are shell builtins: nothing is
executed with the values on its command line, nothing is written to a file). Values are quoted with
``shlex.quote``; names are checked (``check_names``).

A run of runtime ``process`` lives in ``<base>/<deployment id>/`` (``base``: ``job.work_dir``, or
``~/.po-runs`` of the login), like a local run:

- ``run.sh``: the run's session leader (``RUN_SCRIPT``); ``runner.pid``: ``PID START``, its pid and its
  start time in clock ticks since boot (field 22 of ``/proc/PID/stat``): a recycled pid is never taken
  for the run;
- ``stderr.log``: the runner's stderr (the last line is the deployment's message when the run dies
  without reporting); ``exit_code``: the runner's exit code, written once the whole run has ended;
- ``work/``: the run's ``HOME`` (``work/home``), ``TMPDIR`` (``work/tmp``) and code (``work/code``,
  ``IAC_CODE_DIR``). Removed when the run ends, unless it holds state Terraform could not save
  (``errored.tfstate``, or a local backend's ``terraform.tfstate``).

The session leader is ``sh run.sh``, started with ``setsid`` and in the background, so it outlives
the SSH connection and an orchestrator restart. It starts ``po-runner standard``, passes a SIGTERM on to
it once, and when the runner has exited stops what is left of its session (SIGTERM, then SIGKILL after
the reap grace), removes ``work/`` (unless it holds unsaved state), and only then writes ``exit_code``.
Processes of the run are found through ``/proc``, as ``launchers.processes`` does locally: those whose
session or process group is the leader's pid and that started no earlier than the leader.

Runtimes ``docker`` and ``podman``: ``<engine> run -d --name <deployment id> --network host -e NAME ...
IMAGE standard``: each value is in the environment of the engine's client (``-e NAME`` only, never
``NAME=value`` on its command line). The status check that sees the container ended records its exit
code and its stderr in the run directory and removes the container (whose configuration holds the
environment).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, cast

__all__ = [
    "CANCEL_SCRIPT",
    "CONTAINER_LAUNCH_SCRIPT",
    "FORGET_SCRIPT",
    "PROCESS_LAUNCH_SCRIPT",
    "RUN_SCRIPT",
    "STATUS_SCRIPT",
    "Handle",
    "LaunchAnswer",
    "RemoteStatus",
    "check_names",
    "command",
    "environment_script",
    "parse_launch",
    "parse_status",
]

Runtime = Literal["process", "docker", "podman"]

#: Names the scripts use for their own variables, which the run's environment may not set.
RESERVED_PREFIX: Final = "po_ssh_"
#: A variable name the shell reads (word splitting) and the scripts depend on.
SHELL_NAMES: Final = frozenset({"IFS"})
_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: The first word of the script's argv (``$0``), what ``ps`` shows after ``sh -c SCRIPT``.
ARGV0: Final = "po-ssh"
#: Runs that ended longer ago than this are removed from ``<base>`` at the next launch (unless they hold
#: unsaved state).
PRUNE_DAYS: Final = 7

# --- the scripts ------------------------------------------------------------------------------------------

#: Shell functions over /proc: ``po_ssh_stat PID`` reads the fields a run's membership needs,
#: ``po_ssh_members LEADER START [EXCEPT]`` sets ``po_ssh_members`` to the run's live pids (no zombies).
#: Builtins only (``read``, globbing): no process is started, so none joins the session it looks at. The
#: functions' own variables are ``po_ssh_f_*``: a caller's variables (its ``po_ssh_pid``) stay as they are.
PROC_FUNCTIONS: Final = r"""
po_ssh_stat() {
    po_ssh_f_line=
    { read -r po_ssh_f_line < "/proc/$1/stat"; } 2>/dev/null || return 1
    [ -n "$po_ssh_f_line" ] || return 1
    po_ssh_f_rest=${po_ssh_f_line##*) }
    set -- $po_ssh_f_rest
    po_ssh_state=$1 po_ssh_pgid=$3 po_ssh_sid=$4 po_ssh_start=${20:-}
}
po_ssh_alive() {
    po_ssh_stat "$1" && [ "$po_ssh_state" != Z ] && [ "$po_ssh_start" = "$2" ]
}
po_ssh_members() {
    po_ssh_members=
    for po_ssh_f_dir in /proc/[0-9]*; do
        po_ssh_f_pid=${po_ssh_f_dir#/proc/}
        [ "$po_ssh_f_pid" = "${3:-}" ] && continue
        po_ssh_stat "$po_ssh_f_pid" || continue
        [ "$po_ssh_state" = Z ] && continue
        if [ "$po_ssh_f_pid" = "$1" ]; then
            [ "$po_ssh_start" = "$2" ] && po_ssh_members="$po_ssh_members $po_ssh_f_pid"
        elif [ "$po_ssh_sid" = "$1" ] || [ "$po_ssh_pgid" = "$1" ]; then
            [ "$po_ssh_start" -ge "$2" ] 2>/dev/null && po_ssh_members="$po_ssh_members $po_ssh_f_pid"
        fi
    done
}
"""

#: ``sh RUN_DIR/run.sh RUN_DIR REAP_GRACE_SECONDS``: the run's session leader (see the module docstring),
#: written to the run directory by the launch script (it holds no secret). Its environment is the run's;
#: its own variables are ``po_ssh_*`` (``check_names``).
RUN_SCRIPT: Final = (
    r"""
unset IFS
po_ssh_run=$1 po_ssh_grace=$2
"""
    + PROC_FUNCTIONS
    + r"""
po_ssh_stat $$ || exit 125
po_ssh_self=$po_ssh_start
printf '%s %s\n' "$$" "$po_ssh_self" > "$po_ssh_run/runner.pid.new" || exit 125
mv -f "$po_ssh_run/runner.pid.new" "$po_ssh_run/runner.pid" || exit 125
po-runner standard &
po_ssh_child=$!
trap 'kill -TERM "$po_ssh_child" 2>/dev/null' TERM
while :; do
    wait "$po_ssh_child"
    po_ssh_code=$?
    kill -0 "$po_ssh_child" 2>/dev/null || break
done
po_ssh_members "$$" "$po_ssh_self" "$$"
if [ -n "$po_ssh_members" ]; then
    kill -TERM $po_ssh_members 2>/dev/null
    po_ssh_waited=0
    while [ "$po_ssh_waited" -lt "$po_ssh_grace" ]; do
        po_ssh_members "$$" "$po_ssh_self" "$$"
        [ -n "$po_ssh_members" ] || break
        sleep 1
        po_ssh_waited=$((po_ssh_waited + 1))
    done
    po_ssh_members "$$" "$po_ssh_self" "$$"
    [ -n "$po_ssh_members" ] && kill -KILL $po_ssh_members 2>/dev/null
fi
if [ ! -e "$po_ssh_run/work/code/errored.tfstate" ] && [ ! -e "$po_ssh_run/work/code/terraform.tfstate" ]
then
    rm -rf "$po_ssh_run/work"
fi
printf '%s\n' "$po_ssh_code" > "$po_ssh_run/exit_code.new" \
    && mv -f "$po_ssh_run/exit_code.new" "$po_ssh_run/exit_code"
"""
)

#: The start of both launch scripts: ``$1`` base (empty: ``~/.po-runs``), ``$2`` the deployment id.
#: Answers ``po-launch: WORD [TEXT]`` on stdout (``parse_launch``); exits 0 whenever it answered.
_LAUNCH_PROLOGUE: Final = (
    r"""
po_ssh_base=$1
[ -n "$po_ssh_base" ] || po_ssh_base="$HOME/.po-runs"
po_ssh_run="$po_ssh_base/$2"
answer() { printf 'po-launch: %s\n' "$*"; exit 0; }
"""
    + PROC_FUNCTIONS
    + r"""
umask 077
mkdir -p "$po_ssh_run" 2>/dev/null || answer cannot-create "$po_ssh_run"
for po_ssh_old in "$po_ssh_base"/*/exit_code; do
    [ -f "$po_ssh_old" ] || continue
    po_ssh_old=${po_ssh_old%/exit_code}
    [ "$po_ssh_old" = "$po_ssh_run" ] && continue
    [ -e "$po_ssh_old/work/code/errored.tfstate" ] && continue
    [ -e "$po_ssh_old/work/code/terraform.tfstate" ] && continue
    [ -n "$(find "$po_ssh_old/exit_code" -mtime +PRUNE_DAYS 2>/dev/null)" ] && rm -rf "$po_ssh_old"
done
""".replace("PRUNE_DAYS", str(PRUNE_DAYS))
)

#: ``sh -c PROCESS_LAUNCH_SCRIPT po-ssh BASE DEPLOYMENT_ID REAP_GRACE_SECONDS RUN_SCRIPT``, the run's
#: environment on stdin. A live run of the deployment is adopted (``adopted``); otherwise a fresh
#: ``work/`` is made and the run started (``started``). Answers ``unsaved-state PATH`` when an earlier
#: attempt left state Terraform could not save, and ``no-runner`` / ``no-setsid`` when the run's PATH
#: lacks them.
PROCESS_LAUNCH_SCRIPT: Final = (
    _LAUNCH_PROLOGUE
    + r"""
if { read -r po_ssh_pid po_ssh_since < "$po_ssh_run/runner.pid"; } 2>/dev/null; then
    po_ssh_members "$po_ssh_pid" "$po_ssh_since"
    [ -n "$po_ssh_members" ] && answer adopted "$po_ssh_run"
fi
for po_ssh_state_file in errored.tfstate terraform.tfstate; do
    [ -e "$po_ssh_run/work/code/$po_ssh_state_file" ] \
        && answer unsaved-state "$po_ssh_run/work/code/$po_ssh_state_file"
done
rm -rf "$po_ssh_run/work" "$po_ssh_run/exit_code" "$po_ssh_run/runner.pid" "$po_ssh_run/stderr.log" \
    "$po_ssh_run/run.sh"
mkdir "$po_ssh_run/work" "$po_ssh_run/work/home" "$po_ssh_run/work/tmp" "$po_ssh_run/work/code" 2>/dev/null \
    || answer cannot-create "$po_ssh_run/work"
cd "$po_ssh_run/work" || answer cannot-create "$po_ssh_run/work"
po_ssh_env=$(cat) || answer no-environment
po_ssh_grace=$3 po_ssh_script=$4
export HOME="$po_ssh_run/work/home" TMPDIR="$po_ssh_run/work/tmp"
eval "$po_ssh_env" || answer bad-environment
unset po_ssh_env
export IAC_CODE_DIR="$po_ssh_run/work/code"
command -v po-runner >/dev/null 2>&1 || answer no-runner
command -v setsid >/dev/null 2>&1 || answer no-setsid
printf '%s' "$po_ssh_script" > "$po_ssh_run/run.sh" || answer cannot-create "$po_ssh_run/run.sh"
setsid sh "$po_ssh_run/run.sh" "$po_ssh_run" "$po_ssh_grace" \
    < /dev/null > /dev/null 2> "$po_ssh_run/stderr.log" &
po_ssh_tries=0
while [ ! -s "$po_ssh_run/runner.pid" ]; do
    po_ssh_tries=$((po_ssh_tries + 1))
    [ "$po_ssh_tries" -gt 50 ] && answer not-started "$po_ssh_run"
    sleep 0.2 2>/dev/null || sleep 1
done
answer started "$po_ssh_run"
"""
)

#: ``sh -c CONTAINER_LAUNCH_SCRIPT po-ssh BASE DEPLOYMENT_ID ENGINE IMAGE NAME...``, the run's environment
#: on stdin (each NAME is one of its variables). A running container of the deployment is adopted; one
#: that ended (an earlier attempt) is removed first. Answers ``no-engine`` when the PATH lacks the engine,
#: ``no-daemon ADDRESS STDERR`` when the engine does not answer (``docker version``/``podman info``, before
#: anything else is asked of it) and ``engine-failed`` (with the engine's stderr) when ``run`` fails.
CONTAINER_LAUNCH_SCRIPT: Final = (
    _LAUNCH_PROLOGUE
    + r"""
po_ssh_env=$(cat) || answer no-environment
po_ssh_name=$2 po_ssh_engine=$3 po_ssh_image=$4
shift 4
po_ssh_count=$#
for po_ssh_var do
    set -- "$@" -e "$po_ssh_var"
done
shift "$po_ssh_count"
eval "$po_ssh_env" || answer bad-environment
unset po_ssh_env
command -v "$po_ssh_engine" >/dev/null 2>&1 || answer no-engine "$po_ssh_engine"
if [ "$po_ssh_engine" = podman ]; then
    po_ssh_at=${CONTAINER_HOST:-podman-default}
    po_ssh_out=$(podman info --format '{{.Host.Arch}}' 2>&1 < /dev/null)
else
    po_ssh_at=${DOCKER_HOST:-unix:///var/run/docker.sock}
    po_ssh_out=$("$po_ssh_engine" version --format '{{.Server.Version}}' 2>&1 < /dev/null)
fi || answer no-daemon "$po_ssh_at" "$(printf '%s' "$po_ssh_out" | tail -c 500 | tr '\n' ' ')"
po_ssh_running=$("$po_ssh_engine" container inspect --format '{{.State.Running}}' "$po_ssh_name" 2>/dev/null)
[ "$po_ssh_running" = true ] && answer adopted "$po_ssh_run"
[ -n "$po_ssh_running" ] && "$po_ssh_engine" rm -f "$po_ssh_name" > /dev/null 2>&1
rm -f "$po_ssh_run/exit_code" "$po_ssh_run/stderr.log"
po_ssh_out=$("$po_ssh_engine" run -d --name "$po_ssh_name" --network host \
    --label "platform-orchestrator.deployment=$po_ssh_name" "$@" "$po_ssh_image" standard 2>&1) \
    || answer engine-failed "$(printf '%s' "$po_ssh_out" | tail -c 2000 | tr '\n' ' ')"
answer started "$po_ssh_run"
"""
)

#: ``sh -c STATUS_SCRIPT po-ssh RUN_DIR RUNTIME DEPLOYMENT_ID``; for containers the job's environment on
#: stdin (the engine's PATH, DOCKER_HOST, ...). Answers ``po-status: WORD [CODE]``, then ``po-unsaved: SIZE
#: PATH`` when the run left unsaved state, then ``po-stderr:`` and the last 4 KiB of the runner's stderr.
STATUS_SCRIPT: Final = (
    r"""
po_ssh_run=$1
"""
    + PROC_FUNCTIONS
    + r"""
if [ "$2" = process ]; then
    if ! { read -r po_ssh_pid po_ssh_since < "$po_ssh_run/runner.pid"; } 2>/dev/null; then
        if [ -d "$po_ssh_run" ]; then echo "po-status: vanished"; else echo "po-status: gone"; fi
    elif po_ssh_alive "$po_ssh_pid" "$po_ssh_since"; then
        echo "po-status: running"
    else
        po_ssh_members "$po_ssh_pid" "$po_ssh_since"
        if [ -n "$po_ssh_members" ]; then
            echo "po-status: leftovers"
        elif { read -r po_ssh_code < "$po_ssh_run/exit_code"; } 2>/dev/null; then
            echo "po-status: exited $po_ssh_code"
        else
            echo "po-status: vanished"
        fi
    fi
else
    po_ssh_env=$(cat)
    eval "$po_ssh_env"
    if { read -r po_ssh_code < "$po_ssh_run/exit_code"; } 2>/dev/null; then
        echo "po-status: exited $po_ssh_code"
    elif ! command -v "$2" >/dev/null 2>&1; then
        echo "po-status: no-engine"
    else
        po_ssh_found=$("$2" container inspect \
            --format '{{.State.Status}} {{.State.ExitCode}}' "$3" 2>/dev/null)
        case "$po_ssh_found" in
            exited*|dead*)
                "$2" logs --tail 200 "$3" 2> "$po_ssh_run/stderr.log" > /dev/null
                printf '%s\n' "${po_ssh_found#* }" > "$po_ssh_run/exit_code"
                "$2" rm -f "$3" > /dev/null 2>&1
                echo "po-status: exited ${po_ssh_found#* }"
                ;;
            "") if [ -d "$po_ssh_run" ]; then echo "po-status: vanished"; else echo "po-status: gone"; fi ;;
            *) echo "po-status: running" ;;
        esac
    fi
fi
for po_ssh_state_file in errored.tfstate terraform.tfstate; do
    if [ -f "$po_ssh_run/work/code/$po_ssh_state_file" ]; then
        printf 'po-unsaved: %s %s\n' "$(wc -c < "$po_ssh_run/work/code/$po_ssh_state_file")" \
            "$po_ssh_run/work/code/$po_ssh_state_file"
        break
    fi
done
echo "po-stderr:"
tail -c 4096 "$po_ssh_run/stderr.log" 2>/dev/null
exit 0
"""
)

#: ``sh -c CANCEL_SCRIPT po-ssh RUN_DIR RUNTIME DEPLOYMENT_ID GRACE_SECONDS``; for containers the job's
#: environment on stdin. A process run: SIGTERM to the leader while it lives (it passes it on to the
#: runner once) or else to every process of the run, then SIGKILL to whatever of it is left after the
#: grace period. A container: ``<engine> stop -t GRACE`` (SIGTERM, then SIGKILL).
CANCEL_SCRIPT: Final = (
    r"""
po_ssh_run=$1
"""
    + PROC_FUNCTIONS
    + r"""
if [ "$2" != process ]; then
    po_ssh_env=$(cat)
    eval "$po_ssh_env"
    "$2" stop -t "$4" "$3" > /dev/null 2>&1
    exit 0
fi
{ read -r po_ssh_pid po_ssh_since < "$po_ssh_run/runner.pid"; } 2>/dev/null || exit 0
if po_ssh_alive "$po_ssh_pid" "$po_ssh_since"; then
    kill -TERM "$po_ssh_pid" 2>/dev/null
else
    po_ssh_members "$po_ssh_pid" "$po_ssh_since"
    [ -n "$po_ssh_members" ] && kill -TERM $po_ssh_members 2>/dev/null
fi
po_ssh_waited=0
while :; do
    po_ssh_members "$po_ssh_pid" "$po_ssh_since"
    [ -n "$po_ssh_members" ] || exit 0
    [ "$po_ssh_waited" -ge "$4" ] && break
    sleep 1
    po_ssh_waited=$((po_ssh_waited + 1))
done
kill -KILL $po_ssh_members 2>/dev/null
po_ssh_waited=0
while [ "$po_ssh_waited" -lt 10 ]; do
    po_ssh_members "$po_ssh_pid" "$po_ssh_since"
    [ -n "$po_ssh_members" ] || exit 0
    sleep 1
    po_ssh_waited=$((po_ssh_waited + 1))
done
exit 0
"""
)

#: ``sh -c FORGET_SCRIPT po-ssh RUN_DIR``: the run's unsaved state is saved elsewhere now: remove it (the
#: file a status check reports: ``errored.tfstate`` first), and the run's ``work/`` unless it holds more.
FORGET_SCRIPT: Final = r"""
for po_ssh_state_file in errored.tfstate terraform.tfstate; do
    if [ -e "$1/work/code/$po_ssh_state_file" ]; then
        rm -f "$1/work/code/$po_ssh_state_file"
        break
    fi
done
if [ ! -e "$1/work/code/errored.tfstate" ] && [ ! -e "$1/work/code/terraform.tfstate" ]; then
    rm -rf "$1/work"
fi
"""

#: ``sh -c READ_SCRIPT po-ssh PATH``: the bytes of one file.
READ_SCRIPT: Final = r"""exec cat -- "$1"
"""


# --- rendering ----------------------------------------------------------------------------------------


def command(script: str, *args: str) -> str:
    """The command line of an exec channel: ``sh -c SCRIPT po-ssh ARGS...``, quoted for the login's shell."""
    return shlex.join(["sh", "-c", script, ARGV0, *args])


def check_names(names: Iterable[str]) -> list[str]:
    """The names among ``names`` the scripts cannot pass on: not a shell variable name, or one the
    scripts use themselves (``po_ssh_*``, ``IFS``)."""
    return [
        name
        for name in names
        if not _NAME.match(name) or name.startswith(RESERVED_PREFIX) or name in SHELL_NAMES
    ]


def environment_script(environment: Mapping[str, str]) -> str:
    """``export NAME='value'`` lines for the launch script's ``eval``; the names must pass ``check_names``."""
    bad = check_names(environment)
    if bad:
        raise ValueError(f"not a variable the run can get: {', '.join(sorted(bad))}")
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in environment.items())


# --- answers ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LaunchAnswer:
    #: ``started``, ``adopted``, or what stopped the launch (``no-runner``, ``unsaved-state``, ...).
    word: str
    #: The run directory (``started``, ``adopted``), a path or the engine's message.
    text: str


def parse_launch(stdout: str) -> LaunchAnswer | None:
    """The launch script's answer (its last ``po-launch:`` line), None if it gave none."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("po-launch: "):
            word, _, text = line[len("po-launch: ") :].partition(" ")
            return LaunchAnswer(word=word, text=text)
    return None


@dataclass(frozen=True, kw_only=True)
class RemoteStatus:
    #: ``running``, ``leftovers`` (the runner is gone, processes of it are not), ``exited``, ``vanished``
    #: (no exit code: the run was killed, or the host restarted), ``gone`` (no run directory), ``no-engine``.
    word: str
    exit_code: int | None = None
    #: The unsaved state file on the host and its size, if the run left one.
    unsaved_path: str | None = None
    unsaved_size: int | None = None
    #: The last 4 KiB of the runner's stderr.
    stderr_tail: str = ""


def parse_status(stdout: str) -> RemoteStatus | None:
    """The status script's answer, None if it gave none."""
    head, marker, tail = stdout.partition("po-stderr:\n")
    if not marker:
        head, tail = stdout, ""
    word: str | None = None
    exit_code: int | None = None
    unsaved_path: str | None = None
    unsaved_size: int | None = None
    for line in head.splitlines():
        if line.startswith("po-status: "):
            word, _, rest = line[len("po-status: ") :].partition(" ")
            exit_code = int(rest) if rest.strip().lstrip("-").isdigit() else None
        elif line.startswith("po-unsaved: "):
            size, _, path = line[len("po-unsaved: ") :].partition(" ")
            if size.strip().isdigit() and path:
                unsaved_size, unsaved_path = int(size.strip()), path
    if word is None:
        return None
    return RemoteStatus(
        word=word,
        exit_code=exit_code,
        unsaved_path=unsaved_path,
        unsaved_size=unsaved_size,
        stderr_tail=tail,
    )


# --- handles ----------------------------------------------------------------------------------------------

_HANDLE: Final = re.compile(
    r"^ssh:(?P<user>[^@]+)@(?P<host>.+?):(?P<port>\d+):(?P<runtime>process|docker|podman):(?P<run>/.*)$"
)


@dataclass(frozen=True, kw_only=True)
class Handle:
    """``ssh:<user>@<host>:<port>:<runtime>:<run dir>``: where a run is, all a later status check, cancel
    or adoption (after a restart of the orchestrator) needs besides the runner's connection."""

    username: str
    host: str
    port: int
    runtime: Runtime
    #: The run's directory on the host (absolute; its last part is the deployment id).
    run_dir: str

    def __str__(self) -> str:
        return f"ssh:{self.username}@{self.host}:{self.port}:{self.runtime}:{self.run_dir}"

    @property
    def deployment_id(self) -> str:
        return self.run_dir.rstrip("/").rsplit("/", 1)[-1]

    @classmethod
    def parse(cls, text: str) -> Handle:
        found = _HANDLE.match(text)
        if found is None:
            raise ValueError(f"not an SSH run handle: {text}")
        runtime = cast(Runtime, found["runtime"])  # the pattern allows these three only
        return cls(
            username=found["user"],
            host=found["host"],
            port=int(found["port"]),
            runtime=runtime,
            run_dir=found["run"],
        )
