"""``po-runner managed``'s parts: settings, backoff, tags, the child's environment, work directories and
exit codes. The loop against the contract's routes is in tests/integration/test_managed_runner_loop.py."""

from __future__ import annotations

import asyncio
import io
import json
import random
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.managed import child
from orchestrator.managed.loop import Delays
from orchestrator.managed.settings import ManagedSettings
from orchestrator.managed.tags import detect_tags, docker_answers
from tests.support.kube_api import CertificateAuthority

SECRET = "x" * 48
REQUIRED = {"RUNNER_URL": "http://po:8080", "RUNNER_MANAGED_SECRET": SECRET, "RUNNER_NAME": "managed-0"}
MANAGED_VARIABLES = (
    "RUNNER_URL",
    "RUNNER_MANAGED_SECRET",
    "RUNNER_NAME",
    "RUNNER_TAGS",
    "RUNNER_WORK_DIR",
    "RUNNER_GATEWAY_CA",
    "DOCKER_HOST",
)


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in MANAGED_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> ManagedSettings:
    for name, value in {**REQUIRED, **env}.items():
        monkeypatch.setenv(name, value)
    return ManagedSettings()


def problems(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    with pytest.raises(ValidationError) as caught:
        settings(monkeypatch, **env)
    return str(caught.value)


# Settings.


def test_settings__the_deployments_gateway_url_is_the_runner_gateway_under_runner_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert "http://po:8080/runner-gateway" == settings(monkeypatch).gateway_url
    prefixed = settings(monkeypatch, RUNNER_URL="https://gw.example.com/po/")
    assert "https://gw.example.com/po/runner-gateway" == prefixed.gateway_url


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("RUNNER_URL", "po:8080", "must be an absolute http:// or https:// URL"),
        ("RUNNER_URL", "ftp://po", "must be an absolute http:// or https:// URL"),
        ("RUNNER_NAME", "Managed_0", "'Managed_0' is not a valid name"),
        ("RUNNER_MANAGED_SECRET", "short", "must be at least 48 characters (it has 5)"),
        ("RUNNER_TAGS", "gpu,Bad Tag", "'Bad Tag': a tag is 1 to 63 characters"),
        ("RUNNER_GATEWAY_CA", "/nonexistent/ca.pem", "cannot read /nonexistent/ca.pem"),
        ("RUNNER_GATEWAY_CA", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----", "not a usable"),
    ],
)
def test_settings__a_wrong_value_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, said: str
) -> None:
    text = problems(monkeypatch, **{variable: value})

    assert variable.lower() in text and said in text
    assert SECRET not in text


def test_settings__the_secret_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = settings(monkeypatch)

    assert SECRET not in repr(loaded) and SECRET not in str(loaded.model_dump())
    assert SECRET == loaded.runner_managed_secret.get_secret_value()


def test_settings__the_gateway_ca_as_pem_text_or_as_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pem = CertificateAuthority("managed-test-ca").pem.decode()
    (tmp_path / "ca.pem").write_text(pem)

    assert pem == settings(monkeypatch, RUNNER_GATEWAY_CA=pem).runner_gateway_ca
    assert pem == settings(monkeypatch, RUNNER_GATEWAY_CA=str(tmp_path / "ca.pem")).runner_gateway_ca


# Backoff.


def test_delays__from_2_s_doubling_to_60_s_with_jitter_over_the_whole_range() -> None:
    delays = Delays(rng=random.Random(7))

    ceilings = [delays.ceiling(n) for n in range(1, 9)]
    samples = [[Delays(rng=random.Random(seed)).next() for seed in range(200)]]
    waits = [delays.next() for _ in range(40)]

    assert [2, 4, 8, 16, 32, 60, 60, 60] == ceilings
    assert all(2.0 <= wait <= 60.0 for wait in waits)
    assert all(2.0 <= wait <= ceiling for wait, ceiling in zip(waits, ceilings, strict=False))
    assert max(waits[6:]) > 40 and min(waits[6:]) < 20, "jittered over the whole range, not fixed"
    assert all(2.0 == first for first in samples[0]), "the first wait's range is [2 s, 2 s]"


def test_delays__a_success_resets_them() -> None:
    delays = Delays(rng=random.Random(3))
    for _ in range(10):
        delays.next()
    delays.reset()

    assert 2.0 == delays.next()
    assert delays.next() <= 4.0


# Tags.


@pytest.fixture
def docker_socket(tmp_path: Path) -> Iterator[Path]:
    """A real unix socket answering ``GET /_ping`` as a Docker daemon does."""
    path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    server.settimeout(0.05)  # accept() wakes up to see the test end
    stopping = threading.Event()

    def serve() -> None:
        while not stopping.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with connection:
                request = connection.recv(1024)
                if request.startswith(b"GET /_ping "):
                    connection.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nOK")
                else:
                    connection.sendall(b"HTTP/1.0 404 Not Found\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stopping.set()
        thread.join(5)
        server.close()


def test_tags__linux_and_docker_when_a_daemon_answers_at_the_socket(docker_socket: Path) -> None:
    assert ["linux", "docker"] == detect_tags({}, platform="linux", default_socket=docker_socket)
    assert docker_answers({"DOCKER_HOST": f"unix://{docker_socket}"}, default_socket=Path("/nonexistent"))


def test_tags__no_docker_without_a_daemon(tmp_path: Path) -> None:
    silent = tmp_path / "silent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(silent))  # bound but never listening: connections are refused
    try:
        assert ["linux"] == detect_tags({}, platform="linux", default_socket=tmp_path / "absent.sock")
        assert ["linux"] == detect_tags({}, platform="linux", default_socket=silent)
        assert not docker_answers({"DOCKER_HOST": f"unix://{tmp_path / 'absent.sock'}"})
    finally:
        listener.close()


def test_tags__never_kubernetes_by_itself_even_inside_a_cluster(docker_socket: Path) -> None:
    in_cluster = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}

    tags = detect_tags(in_cluster, platform="linux", default_socket=docker_socket)

    assert "kubernetes" not in tags
    assert ["linux", "docker", "kubernetes"] == detect_tags(
        in_cluster, ["kubernetes"], platform="linux", default_socket=docker_socket
    ), "RUNNER_TAGS may add it deliberately"


def test_tags__runner_tags_are_added_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    extra = settings(monkeypatch, RUNNER_TAGS=" gpu, linux,,eu-west.1 ").extra_tags

    assert ("gpu", "linux", "eu-west.1") == extra
    assert ["linux", "gpu", "eu-west.1"] == detect_tags(
        {}, extra, platform="linux", default_socket=tmp_path / "absent.sock"
    )
    assert [] == detect_tags({}, platform="darwin", default_socket=tmp_path / "absent.sock")


# The child: environment, work directory, output, exit code.

CLAIM_ENVIRONMENT = {
    "DEPLOYMENT_ID": "d-1",
    "TOKEN": "deployment-token",
    "MODE": "deploy",
    "ORG_ID": "org-a",
    "RUNNER_ID": "managed",
    "RUNNER_GATEWAY_URL": "http://elsewhere",  # never the claim's: the runner's own
    "HOME": "/root",
}


def test_child_environment__exactly_the_claim_the_gateway_and_a_minimal_own_part(tmp_path: Path) -> None:
    env = child.child_environment(
        CLAIM_ENVIRONMENT,
        gateway_url="http://po:8080/runner-gateway",
        gateway_ca="PEM",
        work=tmp_path,
        path="/usr/bin:/bin",
    )

    assert {
        "DEPLOYMENT_ID": "d-1",
        "TOKEN": "deployment-token",
        "MODE": "deploy",
        "ORG_ID": "org-a",
        "RUNNER_ID": "managed",
        "RUNNER_GATEWAY_URL": "http://po:8080/runner-gateway",
        "RUNNER_GATEWAY_CA": "PEM",
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "tmp"),
        "IAC_CODE_DIR": str(tmp_path / "code"),
    } == env
    without_ca = child.child_environment(
        {}, gateway_url="http://g", gateway_ca=None, work=tmp_path, path=None
    )
    assert child.DEFAULT_PATH == without_ca["PATH"] and "RUNNER_GATEWAY_CA" not in without_ca


def test_work_dirs__fresh_per_run_and_leftovers_removed_at_start(tmp_path: Path) -> None:
    root = tmp_path / "work"
    child.prepare_work_root(root)
    first = child.make_work_dir(root, "d-1")
    second = child.make_work_dir(root, "d-1")
    locked = first / "code" / ".terraform" / "modules"
    locked.mkdir(parents=True)
    (locked / "main.tf").write_text("# a module")
    locked.chmod(0o500)  # read-only, as some module sources leave them
    (root / "not-a-run").mkdir()

    assert first != second and {"home", "tmp", "code"} <= {p.name for p in first.iterdir()}
    assert 0o700 == root.stat().st_mode & 0o777
    child.prepare_work_root(root)  # an earlier process died with runs on disk
    assert ["not-a-run"] == sorted(p.name for p in root.iterdir())


def test_remove_tree__follows_no_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("mine")
    outside.chmod(0o500)
    work = tmp_path / "run"
    work.mkdir()
    (work / "link").symlink_to(outside)

    assert child.remove_tree(work)
    assert (outside / "keep").exists() and 0o500 == outside.stat().st_mode & 0o777
    outside.chmod(0o700)


@pytest.mark.parametrize(("returncode", "reported"), [(0, 0), (1, 1), (2, 2), (-15, 143), (-9, 137)])
def test_exit_code_of__a_signal_as_the_shell_reports_it(returncode: int, reported: int) -> None:
    assert reported == child.exit_code_of(returncode)


async def test_start__output_copied_as_json_lines_and_the_exit_code(tmp_path: Path) -> None:
    script = (
        "import json, sys, os, signal\n"
        "print(json.dumps({'event': 'step', 'level': 'info'}), flush=True)\n"
        "print('po-runner: deployment failed', file=sys.stderr, flush=True)\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    sink = io.StringIO()

    process = await child.start(
        [sys.executable, "-c", script, "3"],
        {"PATH": "/usr/bin:/bin"},
        tmp_path,
        deployment_id="d-7",
        sink=sink,
    )
    exit_code = await process.wait()

    lines = [json.loads(line) for line in sink.getvalue().splitlines()]
    assert 3 == exit_code
    assert {"event": "step", "level": "info"} in lines
    assert {
        "event": "po-runner: deployment failed",
        "stream": "stderr",
        "deployment_id": "d-7",
        "source": "po-runner",
    } in lines


async def test_start__a_killed_child_reports_128_plus_the_signal(tmp_path: Path) -> None:
    process = await child.start(
        [sys.executable, "-c", "import time; print('{}', flush=True); time.sleep(60)"],
        {},
        tmp_path,
        deployment_id="d-8",
        sink=io.StringIO(),
    )
    assert process.process.stdout is not None
    await asyncio.sleep(0)
    process.signal(15)

    assert 143 == await asyncio.wait_for(process.wait(), 30)
