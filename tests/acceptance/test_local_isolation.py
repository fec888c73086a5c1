"""A tenant's code never runs as the server, nor as another run: a local run of an orchestrator serving as
root executes as an unprivileged uid of its own (``PO_LOCAL_RUN_UIDS``, default 2100000-2100999; no
account, the group of the same number), outside the data dir, with none of the server's environment; it can
read neither the server key nor the database, sees nothing of another run (``/proc`` of other uids, their
directories, an idle warm runner's memory) and nothing of it outlives its run. All of it holds for runs
forked from the zygote (``PO_LOCAL_ZYGOTE=auto``, the default) and for runners started as processes of
their own (``off``: warm or cold): the ``isolated`` fixture takes both, one per database (``diagonal``).
A secret of one forked run is in no other forked run's memory nor in the zygote's.

Real ``orchestrator serve`` processes as root, real runner processes, the embedded Terraform engine; the
probes are ``local-exec`` provisioners and ``file()`` in an inline module, as a tenant would write them.
The server's files live in a directory others may pass through (0755), so what keeps the run out is the
run user and the modes the server gives its files, not the test's temporary directory.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.launchers import run_cgroups
from tests.support import run_probe
from tests.support.outages import ServerProcess, wait_for, zygote_of
from tests.support.run_user import nobody
from tests.support.stack import EXAMPLES, Stack, build_stack, demo_manifest, runner_body
from tests.support.zygote_probe import memory_holds

pytestmark = [pytest.mark.slow, pytest.mark.diagonal("isolated")]

MODULE = yaml.safe_load((EXAMPLES / "module.yaml").read_text())
#: PO_LOCAL_RUN_UIDS's default.
RUN_UIDS = range(2100000, 2101000)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory in the system temp dir that every user may pass through (not tmp_path: 0700)."""
    made = Path(tempfile.mkdtemp(prefix="po-isolation-"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made, ignore_errors=True)


class Isolated:
    """A root server with default run-user settings, its files under ``shared``, and a place where the
    probes write what they found (writable by the run user)."""

    def __init__(self, database_url: str, shared: Path, tmp_path: Path, **environment: str) -> None:
        self.user = nobody()
        self.data_dir = shared / "data"
        self.runs_dir = shared / "runs"
        self.found = shared / "found"
        self.found.mkdir(mode=0o777)
        self.found.chmod(0o777)
        self.tf_config = shared / "terraformrc"
        self.tf_config.touch()
        # SQLite where a real installation has it: in the data dir (orchestrator.db).
        self.sqlite = database_url.startswith("sqlite")
        if self.sqlite:
            database_url = f"sqlite+aiosqlite:///{self.data_dir / 'orchestrator.db'}"
        self.server = ServerProcess(
            database_url,
            self.data_dir,
            # The defaults of a real installation: no PO_LOCAL_RUN_USER (nobody).
            PO_LOCAL_RUNS_DIR=str(self.runs_dir),
            **environment,
        )
        del self.server.env["PO_LOCAL_RUN_USER"]
        self.server.start()
        self.stack: Stack = build_stack(self.server.url, tmp_path, runner=runner_body(self.tf_config))

    def close(self) -> None:
        self.stack.client.close()
        self.server.stop()

    def deploy_module(self, code: str) -> dict[str, Any]:
        patched = self.stack.client.patch(
            f"/orgs/{self.stack.org}/modules/demo-app", json={"module_source_code": code}
        )
        assert 200 == patched.status_code, patched.text
        return self.stack.deploy(demo_manifest())

    def probe(self, script: str) -> dict[str, Any]:
        """Deploy the demo module with a provisioner running ``script`` (no ``${``: Terraform's)."""
        code = MODULE["module_source_code"] + (
            '\nresource "terraform_data" "probe" {\n  provisioner "local-exec" {\n'
            f"    command = <<-EOT\n{script}\n    EOT\n  }}\n}}\n"
        )
        return self.deploy_module(code)

    def read(self, name: str) -> str:
        return (self.found / name).read_text().strip()


@pytest.fixture(params=["zygote", "no-zygote"])
def isolated(
    request: pytest.FixtureRequest, database_url: str, shared: Path, tmp_path: Path
) -> Iterator[Isolated]:
    """A root server whose runs are forked from its zygote, or (``no-zygote``) start as runners of their
    own (the first cold, the next ones warm)."""
    made = Isolated(
        database_url, shared, tmp_path, PO_LOCAL_ZYGOTE="auto" if request.param == "zygote" else "off"
    )
    yield made
    made.close()


def test_local_run__executes_as_the_unprivileged_user_without_privileges(isolated: Isolated) -> None:
    found = isolated.found
    deployment = isolated.probe(
        f"id -u > {found}/uid\nid -G > {found}/groups\ngrep '^Cap' /proc/self/status > {found}/caps\n"
        f"umask > {found}/umask"
    )

    assert "succeeded" == deployment["status"], deployment["status_message"]
    uid = int(isolated.read("uid"))
    assert uid in RUN_UIDS
    # Its own group (the same number) only: none of root's groups.
    assert [str(uid)] == isolated.read("groups").split()
    capabilities = dict(line.split(":") for line in isolated.read("caps").splitlines())
    for kind in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert 0 == int(capabilities[kind].strip(), 16), kind
    # What it creates is its own.
    assert "0077" == isolated.read("umask")
    # And the deployment itself works as that user: outputs as the demo prints them.
    assert {
        "bucket": "bucket-shop",
        "url": "https://shop.example.test/bucket-shop",
    } == isolated.stack.outputs(deployment)["shop"]


def test_local_run__lives_outside_the_data_dir_in_its_own_private_directory(isolated: Isolated) -> None:
    found = isolated.found
    deployment = isolated.probe(
        f"pwd > {found}/pwd\n"
        f'stat -c "%u %a" "$HOME/.." > {found}/work\n'
        f'stat -c "%U %a" "$HOME/../.." > {found}/run\n'
        f"id -u > {found}/uid\n"
        f'echo "$HOME" > {found}/home\necho "$TMPDIR" > {found}/tmpdir'
    )

    assert "succeeded" == deployment["status"], deployment["status_message"]
    work = Path(isolated.read("pwd")).parent
    data_dir = isolated.data_dir.resolve()
    assert isolated.runs_dir.resolve() == work.parent.parent
    assert data_dir not in work.parents
    assert f"{isolated.read('uid')} 700" == isolated.read("work")
    # The launcher's own part of the run (stderr, pid file): the run user may only pass through.
    assert "root 711" == isolated.read("run")
    assert (str(work / "home"), str(work / "tmp")) == (isolated.read("home"), isolated.read("tmpdir"))


def test_local_run__cannot_read_the_server_key_or_the_database(isolated: Isolated) -> None:
    found, data_dir = isolated.found, isolated.data_dir
    names = ["server.key", "orchestrator.db"] if isolated.sqlite else ["server.key"]
    lines = [
        f"cat {data_dir}/{name} > {found}/{name}.out 2> {found}/{name}.err; echo $? > {found}/{name}.rc"
        for name in names
    ]
    deployment = isolated.probe(
        "\n".join([*lines, f"ls {data_dir} > {found}/ls.out 2> {found}/ls.err; true"])
    )

    assert "succeeded" == deployment["status"], deployment["status_message"]
    for name in names:
        assert "0" != isolated.read(f"{name}.rc"), name
        assert "" == isolated.read(f"{name}.out"), name
        assert "Permission denied" in isolated.read(f"{name}.err"), name
        # Private even where the data dir could be passed through.
        assert 0o600 == (data_dir / name).stat().st_mode & 0o777, name
    assert "Permission denied" in isolated.read("ls.err")
    assert 0o700 == data_dir.stat().st_mode & 0o777


def test_local_run__an_output_reading_the_server_key_fails(isolated: Isolated) -> None:
    key = (isolated.data_dir / "server.key").read_text().strip()
    code = MODULE["module_source_code"] + (
        f'\noutput "key" {{\n  value = file("{isolated.data_dir}/server.key")\n}}\n'
    )

    deployment = isolated.deploy_module(code)
    logs = isolated.server.log.read_text()

    assert "failed" == deployment["status"]
    assert "permission denied" in deployment["status_message"].lower()
    assert key not in str(deployment)
    assert key not in logs


@pytest.fixture
def canaries(database_url: str, shared: Path, tmp_path: Path) -> Iterator[tuple[Isolated, dict[str, str]]]:
    """A server whose environment holds secrets of its own, and its own HOME and TMPDIR."""
    (shared / "server-home").mkdir()
    (shared / "server-tmp").mkdir()
    values = {
        "PO_ENCRYPTION_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
        "AWS_SECRET_ACCESS_KEY": f"canary-{secrets.token_hex(8)}",
        "AWS_ACCESS_KEY_ID": f"CANARY{secrets.token_hex(4).upper()}",
        "GITHUB_TOKEN": f"canary-{secrets.token_hex(8)}",
        "HOME": str(shared / "server-home"),
        "TMPDIR": str(shared / "server-tmp"),
    }
    made = Isolated(database_url, shared, tmp_path, **values)
    server = made.server.env
    yield made, {**values, **{name: server[name] for name in ("PO_BOOTSTRAP_TOKEN", "PO_DATABASE_URL")}}
    made.close()


def test_local_run__environment_holds_none_of_the_servers(canaries: tuple[Isolated, dict[str, str]]) -> None:
    isolated, server = canaries
    deployment = isolated.probe(f"env > {isolated.found}/env")

    dump = isolated.read("env")
    environment = dict(line.split("=", 1) for line in dump.splitlines() if "=" in line)

    assert "succeeded" == deployment["status"], deployment["status_message"]
    assert [] == [name for name, value in server.items() if value in dump]
    assert [] == [name for name in environment if name.startswith(("PO_", "AWS_", "GITHUB_"))]
    # Its own HOME and TMPDIR, in its working directory.
    for name in ("HOME", "TMPDIR"):
        assert isolated.runs_dir in Path(environment[name]).parents, name
    # The zygote it was forked from holds nothing of the server's environment either.
    zygote = zygote_of(isolated.server)
    assert zygote is not None
    held = Path(f"/proc/{zygote}/environ").read_bytes().decode()
    assert [] == [name for name, value in server.items() if value in held]
    assert {"HOME": "/nonexistent"}.items() <= dict(v.split("=", 1) for v in held.split("\0") if v).items()


def test_local_runs__a_run_sees_nothing_of_another_and_nothing_of_it_outlives_it(
    database_url: str, shared: Path, tmp_path: Path
) -> None:
    isolated = Isolated(database_url, shared, tmp_path)
    marker = f"marker-{secrets.token_hex(12)}"
    runner = runner_body(isolated.tf_config)
    runner["runner_configuration"]["job"]["secrets"] = {"MY_RUNNER_SECRET": marker}
    (tmp_path / "other").mkdir()
    other = build_stack(isolated.server.url, tmp_path / "other", org="globex", runner=runner)
    found = isolated.found
    (found / "probe.py").write_text(run_probe.PROBE)
    (found / "probe.py").chmod(0o644)
    try:
        # Org acme's run: starts the detached probe, then waits (bounded) until org globex's run is over.
        code = MODULE["module_source_code"] + (
            '\nresource "terraform_data" "probe" {\n  provisioner "local-exec" {\n'
            f'    command = "setsid nohup {sys.executable} {found}/probe.py {found} {marker} '
            '> /dev/null 2>&1 < /dev/null &"\n  }\n}\n'
            '\nresource "terraform_data" "wait" {\n  depends_on = [terraform_data.probe]\n'
            '  provisioner "local-exec" {\n'
            f'    command = "for i in $(seq 600); do [ -e {found}/other-done ] && exit 0; sleep 0.2; done"\n'
            "  }\n}\n"
        )
        patched = isolated.stack.client.patch(
            f"/orgs/{isolated.stack.org}/modules/demo-app", json={"module_source_code": code}
        )
        assert 200 == patched.status_code, patched.text
        probing = isolated.stack.client.post(
            f"/orgs/{isolated.stack.org}/deployments",
            json={"project_id": "shop", "env_id": "dev", "mode": "deploy", "manifest": demo_manifest()},
        )
        assert 201 == probing.status_code, probing.text
        run_probe.wait_for(found / "probe.alive", 60)
        # Org globex's run, with the marker in its runner's secrets, while the probe looks.
        victim = other.deploy(demo_manifest())
        time.sleep(1.0)  # a few more rounds of the probe over what globex's run left (nothing, it is over)
        (found / "other-done").touch()
        prober = isolated.stack.wait(probing.json()["id"])
        probe_pid = int((found / "probe.pid").read_text())
        gone = run_probe.wait_gone(probe_pid, 30)
        findings = run_probe.findings(found)
        looked_at = run_probe.uids_seen(found)
    finally:
        other.client.close()
        isolated.close()

    assert "succeeded" == victim["status"], victim["status_message"]
    assert "succeeded" == prober["status"], prober["status_message"]
    # Nothing of another uid: no environment (so no token, no secret), no directory, no file, no memory
    # of globex's run, of the idle warm runners (each of its own uid, not dumpable) or of the server.
    assert [] == findings
    # It looked at processes of other uids of the range (globex's run, the warm runners): beside its own.
    assert len(looked_at & set(RUN_UIDS)) >= 2, looked_at
    # The probe left its run's session, yet it is gone once its run is over.
    assert gone, f"the probe (pid {probe_pid}) outlived its run"


#: What the cgroup test's provisioner runs (python FOUND N): which runner it is under (cold: ``standard``,
#: warm: ``warm``), its cgroup, and a process in a session of its own that would sleep for ten minutes.
CGROUP_PROBE = r"""
import os, subprocess, sys
found, n = sys.argv[1], sys.argv[2]
pid, kind = os.getppid(), "none"
while pid > 1:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        argv = cmdline.read().split(b"\0")
    if b"orchestrator.cli.runner" in argv:
        kind = argv[argv.index(b"orchestrator.cli.runner") + 1].decode()
        break
    with open(f"/proc/{pid}/stat") as stat:
        pid = int(stat.read().rsplit(")", 1)[1].split()[1])
with open("/proc/self/cgroup") as cgroup:
    line = next(l for l in cgroup if l.startswith("0::")).strip()
detached = subprocess.Popen(
    ["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
with open(f"{found}/run-{n}", "w") as out:
    out.write(f"{kind} {line} {detached.pid}")
"""


@pytest.mark.diagonal("start")
@pytest.mark.parametrize("start", ["zygote", "no-zygote"])
def test_local_runs__without_a_uid_each_their_detached_processes_die_with_their_cgroup(
    database_url: str, shared: Path, tmp_path: Path, start: str
) -> None:
    # PO_LOCAL_RUN_UIDS empty: every run as the one run user, so no uid sweep can tell runs apart; the
    # cgroup of each run (this host's cgroup v2 hierarchy) still stops what left its session.
    usable = run_cgroups.RunCgroups.from_setting("auto", shared, setting="test")
    if usable is None:
        pytest.skip("no writable cgroup v2 hierarchy with cgroup.kill on this host")
    usable.close()
    isolated = Isolated(
        database_url,
        shared,
        tmp_path,
        PO_LOCAL_RUN_UIDS="",
        PO_LOCAL_ZYGOTE="auto" if start == "zygote" else "off",
    )
    found = isolated.found
    (found / "cgroup_probe.py").write_text(CGROUP_PROBE)
    (found / "cgroup_probe.py").chmod(0o644)
    runs: list[list[str]] = []
    try:
        # Without the zygote the first run starts cold (the warm pool fills on first use), the second is a
        # warm runner's; with it both are forked (the command line is the zygote's).
        for n in (1, 2):
            deployment = isolated.deploy_module(
                MODULE["module_source_code"]
                + '\nresource "terraform_data" "probe" {\n'
                + f'  triggers_replace = "{n}"\n'
                + '  provisioner "local-exec" {\n'
                + f'    command = "{sys.executable} {found}/cgroup_probe.py {found} {n}"\n  }}\n}}\n'
            )
            assert "succeeded" == deployment["status"], deployment["status_message"]
            runs.append(isolated.read(f"run-{n}").split())
        left = [int(pid) for _, _, pid in runs if not run_probe.wait_gone(int(pid), 30)]
    finally:
        isolated.close()
        for _, _, pid in runs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)

    expected = ["zygote", "zygote"] if start == "zygote" else ["standard", "warm"]
    assert expected == [kind for kind, _, _ in runs]
    assert [] == left, "processes that left their run's session outlived their run"
    # Each run in a cgroup of its own, in the server's parent for its runs.
    cgroups = [cgroup for _, cgroup, _ in runs]
    assert all("/po-runs-" in cgroup for cgroup in cgroups), cgroups
    assert len(set(cgroups)) == 2, cgroups


#: The provisioner of the run that waits to be looked at: it writes the pid of the runner above it (the
#: process running ``orchestrator.cli.runner``) and waits (bounded) for the test to release it.
WAIT_TO_BE_SCANNED = """
p=$PPID
while [ "$p" -gt 1 ] && ! tr '\\0' ' ' < /proc/$p/cmdline | grep -q orchestrator.cli.runner; do
  p=$(cut -d ' ' -f 4 /proc/$p/stat)
done
echo $p > FOUND/runner.pid
for i in $(seq 600); do [ -e FOUND/release ] && exit 0; sleep 0.2; done
"""


def test_local_runs__a_secret_of_one_forked_run_is_in_no_later_run_nor_in_the_zygote(
    database_url: str, shared: Path, tmp_path: Path
) -> None:
    """Org initech's runner has a secret; org globex's run, forked from the same zygote after initech's
    run, holds globex's secret in its memory and nothing of initech's; the zygote holds neither (its
    memory, its environment). Memory read as root through ``/proc/<pid>/mem``."""
    first_secret, globex_secret = (f"marker-{name}-{secrets.token_hex(12)}" for name in ("first", "globex"))
    isolated = Isolated(database_url, shared, tmp_path, PO_LOCAL_ZYGOTE="auto")
    stacks = []
    for org, secret in (("initech", first_secret), ("globex", globex_secret)):
        runner = runner_body(isolated.tf_config)
        runner["runner_configuration"]["job"]["secrets"] = {"MY_RUNNER_SECRET": secret}
        (tmp_path / org).mkdir()
        stacks.append(build_stack(isolated.server.url, tmp_path / org, org=org, runner=runner))
    initech, other = stacks
    found = isolated.found
    script = WAIT_TO_BE_SCANNED.replace("FOUND", str(found))
    try:
        first = initech.deploy(demo_manifest())
        patched = other.client.patch(
            f"/orgs/{other.org}/modules/demo-app",
            json={
                "module_source_code": MODULE["module_source_code"]
                + '\nresource "terraform_data" "probe" {\n  provisioner "local-exec" {\n'
                + f"    command = <<-EOT\n{script}\n    EOT\n  }}\n}}\n"
            },
        )
        assert 200 == patched.status_code, patched.text
        waiting = other.client.post(
            f"/orgs/{other.org}/deployments",
            json={"project_id": "shop", "env_id": "dev", "mode": "deploy", "manifest": demo_manifest()},
        )
        assert 201 == waiting.status_code, waiting.text
        pid_file = found / "runner.pid"
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 120, "globex's run to start")
        runner_pid = int(pid_file.read_text())
        zygote = zygote_of(isolated.server)
        assert zygote is not None
        parent = int(Path(f"/proc/{runner_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        in_runner = {
            name: memory_holds(runner_pid, value.encode())
            for name, value in (("first", first_secret), ("globex", globex_secret))
        }
        in_zygote = {
            name: memory_holds(zygote, value.encode())
            for name, value in (("first", first_secret), ("globex", globex_secret))
        }
        zygote_environ = Path(f"/proc/{zygote}/environ").read_bytes()
        (found / "release").touch()
        second = other.wait(waiting.json()["id"])
    finally:
        initech.client.close()
        other.client.close()
        isolated.close()

    assert "succeeded" == first["status"], first["status_message"]
    assert "succeeded" == second["status"], second["status_message"]
    assert zygote == parent  # globex's runner was forked from the zygote initech's run came from
    # The scan finds what is there (globex's own secret), and nothing of initech's run.
    assert {"first": False, "globex": True} == in_runner
    assert {"first": False, "globex": False} == in_zygote
    assert first_secret.encode() not in zygote_environ and globex_secret.encode() not in zygote_environ
