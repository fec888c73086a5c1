"""State storage end to end: the same deploy keeping its Terraform state in the orchestrator (Terraform's
http backend on the runner gateway), in S3 (moto_server), in GCS (fake-gcs-server) and in Azure Blob
Storage (Azurite), through real runner processes and the embedded Terraform engine; then the state lock
of each, held while others try. (``kubernetes`` state: tests/acceptance/test_kubernetes_runner.py.)

The compiled backend block names only the bucket and key/prefix (``compiler.backend.render_backend``):
everything else a backend needs comes from the runner's job environment, as it would in production:

- s3:  ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL_STS`` (the emulator), ``AWS_REGION``, credentials as
       job secrets, and ``TF_CLI_ARGS_init="-backend-config=use_path_style=true
       -backend-config=use_lockfile=true"`` (an S3 lock object, taken with ``If-None-Match: *``).
- gcs: ``GOOGLE_BACKEND_STORAGE_CUSTOM_ENDPOINT=<emulator>/storage/v1/`` and ``GOOGLE_OAUTH_ACCESS_TOKEN``
       (any token; fake-gcs-server checks none, but does enforce ``ifGenerationMatch``, the gcs lock).
- azurerm: ``ARM_ACCESS_KEY`` (the account key, a job secret), ``ARM_METADATA_HOSTNAME`` (a stub of Azure's
       metadata service), ``SSL_CERT_FILE`` (Azurite's test CA) and ``HTTPS_PROXY`` (the stub resolving
       ``<account>.blob.localhost``); see tests/support/azurite.py. The lock is a lease on the state blob.

Stand-ins, said plainly: moto, fake-gcs-server and Azurite emulate the cloud APIs; the lock semantics
Terraform relies on (conditional writes, blob leases) are real in all three. For the orchestrator's own
backend the test needs an executing deployment's credentials while that deployment's Terraform has not
started yet; the runner's engine is then a small ``terraform`` wrapper script that waits at ``plan`` or
``apply`` (a deploy plans inside its ``apply``) while a hold file exists and then execs the real embedded
engine (``po-terraform``) unchanged.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import stat
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import boto3
import httpx
import pytest
from azure.core.exceptions import ResourceExistsError

from orchestrator import deployment_tokens
from orchestrator.protocol import age
from orchestrator.secretbox import SecretBox, load_or_create_key
from orchestrator.settings import ServerSettings
from orchestrator.store import db
from orchestrator.store import states as state_store
from tests.support.azurite import AzureStorage, start_azurite
from tests.support.emulators import (
    MOTO_CREDENTIALS,
    Emulator,
    EmulatorMissingError,
    emulator_or_skip,
    missing,
    start_fake_gcs,
    start_moto,
)
from tests.support.stack import Stack, build_stack, demo_manifest, runner_body, running_server

# Each state backend on one database per test (tests/conftest.py): the store's tests cover both.
pytestmark = [pytest.mark.slow, pytest.mark.spread]

LOCK_ERROR = "Error acquiring the state lock"


# -- emulators ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    server = emulator_or_skip(start_moto, tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    server = emulator_or_skip(start_fake_gcs, tmp_path_factory.mktemp("fake-gcs"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureStorage]:
    try:
        storage = start_azurite(tmp_path_factory.mktemp("azurite"))
    except EmulatorMissingError as exc:
        missing(str(exc))
    yield storage
    storage.stop()


@pytest.fixture(scope="module")
def s3(moto: Emulator) -> Iterator[Any]:
    """A boto3 S3 client of the emulator, for the test's own look at the bucket."""
    client = boto3.client(
        "s3",
        endpoint_url=moto.url,
        region_name=MOTO_CREDENTIALS["AWS_REGION"],
        aws_access_key_id=MOTO_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=MOTO_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    yield client
    client.close()


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """``build_stack`` whose API clients are closed after the test."""
    made: list[Stack] = []

    def make(base_url: str, runner: dict[str, Any] | None = None) -> Stack:
        stack = build_stack(base_url, tmp_path, runner=runner)
        made.append(stack)
        return stack

    yield make
    for stack in made:
        stack.client.close()


def new_bucket_name(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:12]}"


def s3_bucket(s3: Any) -> str:
    name = new_bucket_name("tfstate")
    s3.create_bucket(Bucket=name)
    return name


def s3_keys(s3: Any, bucket: str) -> list[str]:
    listed = s3.list_objects_v2(Bucket=bucket)
    return sorted(item["Key"] for item in listed.get("Contents", []))


def gcs_bucket(fake_gcs: Emulator) -> str:
    name = new_bucket_name("tfstate")
    created = httpx.post(f"{fake_gcs.url}/storage/v1/b", params={"project": "test"}, json={"name": name})
    assert 200 == created.status_code, created.text
    return name


def gcs_names(fake_gcs: Emulator, bucket: str) -> list[str]:
    listed = httpx.get(f"{fake_gcs.url}/storage/v1/b/{bucket}/o")
    assert 200 == listed.status_code, listed.text
    return sorted(item["name"] for item in listed.json().get("items", []))


def gcs_object_url(fake_gcs: Emulator, bucket: str, name: str) -> str:
    return f"{fake_gcs.url}/storage/v1/b/{bucket}/o/{quote(name, safe='')}"


def gcs_upload(fake_gcs: Emulator, bucket: str, name: str, body: bytes, **params: str) -> httpx.Response:
    """A multipart upload, as the Go client Terraform uses sends a small object (fake-gcs-server checks
    preconditions such as ``ifGenerationMatch`` on multipart uploads, not on ``uploadType=media``)."""
    boundary = uuid.uuid4().hex
    content = b"".join(
        [
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
            json.dumps({"name": name, "contentType": "application/json"}).encode(),
            f"\r\n--{boundary}\r\nContent-Type: application/json\r\n\r\n".encode(),
            body,
            f"\r\n--{boundary}--\r\n".encode(),
        ]
    )
    return httpx.post(
        f"{fake_gcs.url}/upload/storage/v1/b/{bucket}/o",
        params={"uploadType": "multipart", **params},
        content=content,
        headers={"Content-Type": f"multipart/related; boundary={boundary}"},
    )


# -- runners -----------------------------------------------------------------------------------------


def s3_runner(tf_config: Path, moto: Emulator, bucket: str, prefix: str | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"type": "s3", "bucket": bucket}
    if prefix:
        state["path_prefix"] = prefix
    body = runner_body(
        tf_config,
        state=state,
        AWS_REGION=MOTO_CREDENTIALS["AWS_REGION"],
        AWS_ENDPOINT_URL_S3=moto.url,
        AWS_ENDPOINT_URL_STS=moto.url,
        TF_CLI_ARGS_init="-backend-config=use_path_style=true -backend-config=use_lockfile=true",
    )
    body["runner_configuration"]["job"]["secrets"] = {
        "AWS_ACCESS_KEY_ID": MOTO_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": MOTO_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }
    return body


def gcs_runner(tf_config: Path, fake_gcs: Emulator, bucket: str, prefix: str | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"type": "gcs", "bucket": bucket}
    if prefix:
        state["path_prefix"] = prefix
    body = runner_body(
        tf_config, state=state, GOOGLE_BACKEND_STORAGE_CUSTOM_ENDPOINT=f"{fake_gcs.url}/storage/v1/"
    )
    body["runner_configuration"]["job"]["secrets"] = {"GOOGLE_OAUTH_ACCESS_TOKEN": "fake-gcs-accepts-any"}
    return body


def azurerm_runner(
    tf_config: Path, azurite: AzureStorage, container: str, prefix: str | None = None
) -> dict[str, Any]:
    """A local runner (``vm``: the compatibility matrix allows azurerm for it) keeping state in Azurite."""
    state: dict[str, Any] = {
        "type": "azurerm",
        "storage_account_name": azurite.account,
        "container_name": container,
    }
    if prefix:
        state["path_prefix"] = prefix
    body = runner_body(tf_config, state=state, **azurite.backend_environment())
    body["runner_configuration"]["job"]["secrets"] = {"ARM_ACCESS_KEY": azurite.key}
    return body


def azure_container(azurite: AzureStorage) -> str:
    name = new_bucket_name("tfstate")
    azurite.service_client().create_container(name)
    return name


def held_terraform(directory: Path, hold_file: Path) -> dict[str, str]:
    """Job environment running ``terraform`` = a wrapper that waits at ``plan`` or ``apply`` (the first
    command that takes the state lock) while ``hold_file`` exists, then execs the embedded engine (the real
    Terraform) with the same arguments."""
    engine = Path(sys.executable).parent / "po-terraform"
    assert engine.is_file(), engine
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = directory / "terraform"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# argv: -chdir=<dir> <command> ...\n"
        'case "$2" in plan|apply)\n'
        '  while [ -e "$HOLD_FILE" ]; do sleep 0.05; done\n'
        "esac\n"
        f'exec "{engine}" "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return {
        "IAC_BACKEND": "terraform",
        "PATH": f"{directory}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOLD_FILE": str(hold_file),
    }


# -- the environment, its state ----------------------------------------------------------------------


def env_uuid(stack: Stack) -> str:
    env = stack.client.get(f"/orgs/{stack.org}/projects/shop/envs/dev")
    assert 200 == env.status_code, env.text
    return str(env.json()["uuid"])


def start(stack: Stack) -> dict[str, Any]:
    """Create a deploy deployment without waiting for it."""
    _, recipient = age.generate_identity()
    created = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={
            "project_id": "shop",
            "env_id": "dev",
            "mode": "deploy",
            "manifest": demo_manifest(),
            "encrypted_outputs_recipient": recipient,
            "encrypted_logs_recipient": recipient,
        },
    )
    assert created.status_code in (200, 201), created.text
    deployment: dict[str, Any] = created.json()
    return deployment


def assert_demo_state(state: dict[str, Any]) -> None:
    """The state Terraform wrote for the demo: its two terraform_data resources, applied."""
    resources = {(r.get("module", ""), r["type"], r["name"]) for r in state["resources"]}
    assert {"bucket", "app"} == {name for _, kind, name in resources if kind == "terraform_data"}, resources
    assert state["serial"] >= 1
    assert state["lineage"]


def assert_succeeded(deployment: dict[str, Any]) -> None:
    assert "succeeded" == deployment["status"], (deployment["status_message"], deployment.get("error"))


def assert_failed_on_lock(deployment: dict[str, Any], *holder: str) -> None:
    """Failed on the lock, and the message names the holder (Terraform prints the holder's lock info)."""
    assert "failed" == deployment["status"], deployment["status_message"]
    message = deployment["status_message"]
    assert LOCK_ERROR in message, message
    for text in holder:
        assert text in message, message


def lock_info(lock_id: str, path: str) -> dict[str, str]:
    """Lock info as Terraform writes it (``statemgr.LockInfo``)."""
    return {
        "ID": lock_id,
        "Operation": "OperationTypeApply",
        "Info": f"held by test_state_storage as {lock_id}",
        "Who": "tester@acceptance",
        "Version": "1.15.5",
        "Created": "2026-01-01T00:00:00Z",
        "Path": path,
    }


@dataclass
class OrchestratorState:
    """The orchestrator's own state: rows in ``tf_states``/``tf_state_locks``, the gateway's routes."""

    settings: ServerSettings
    base_url: str
    org: str

    def _run(self, query: Callable[[Any], Any]) -> Any:
        async def go() -> Any:
            engine = db.create_engine(self.settings.resolved_database_url)
            try:
                async with engine.connect() as conn:
                    return await query(conn)
            finally:
                await engine.dispose()

        return asyncio.run(go())

    def versions(self, env: str) -> list[int]:
        result: list[int] = self._run(lambda conn: state_store.versions(conn, uuid.UUID(env)))
        return result

    def latest(self, env: str) -> dict[str, Any]:
        found = self._run(lambda conn: state_store.latest(conn, uuid.UUID(env)))
        assert found is not None
        box = SecretBox(load_or_create_key(self.settings.data_dir))
        state: dict[str, Any] = json.loads(box.open(found[1], context=f"tfstate:{env}"))
        return state

    def held_lock(self, env: str) -> dict[str, Any] | None:
        held: dict[str, Any] | None = self._run(lambda conn: state_store.get_lock(conn, uuid.UUID(env)))
        return held

    def auth(self, deployment_id: str) -> httpx.BasicAuth:
        """The deployment's credentials, as the runner hands them to Terraform (TF_HTTP_USERNAME/PASSWORD)."""
        key = deployment_tokens.token_key(load_or_create_key(self.settings.data_dir))
        return httpx.BasicAuth(
            deployment_id, deployment_tokens.deployment_token(key, self.org, deployment_id)
        )

    def url(self, env: str) -> str:
        return f"{self.base_url}/runner-gateway/v1/orgs/{self.org}/environments/{env}/state"

    def lock(
        self, env: str, deployment_id: str, info: dict[str, Any], method: str = "LOCK"
    ) -> httpx.Response:
        return httpx.request(
            method, f"{self.url(env)}/lock", json=info, auth=self.auth(deployment_id), timeout=30
        )


@pytest.fixture
def orchestrator_state(settings: ServerSettings, server_url: str) -> OrchestratorState:
    return OrchestratorState(settings=settings, base_url=server_url, org="acme")


# -- the same deploy, each storage ---------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [None, "states/shop"], ids=["no-prefix", "prefix"])
def test_s3__state_object_is_env_uuid_tfstate_in_the_bucket(
    server_url: str,
    tmp_path: Path,
    make_stack: Callable[..., Stack],
    moto: Emulator,
    s3: Any,
    prefix: str | None,
) -> None:
    bucket = s3_bucket(s3)
    stack = make_stack(server_url, s3_runner(tmp_path / "terraformrc", moto, bucket, prefix))
    env = env_uuid(stack)

    deployment = stack.deploy()

    assert_succeeded(deployment)
    assert "https://shop.example.test/bucket-shop" == stack.outputs(deployment)["shop"]["url"]
    key = f"{prefix}/{env}.tfstate" if prefix else f"{env}.tfstate"
    assert [key] == s3_keys(s3, bucket)  # the state only: the lock object is gone
    assert_demo_state(json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read()))


@pytest.mark.parametrize("prefix", [None, "states/shop"], ids=["no-prefix", "prefix"])
def test_gcs__state_object_is_env_uuid_default_tfstate_under_the_prefix(
    server_url: str, tmp_path: Path, make_stack: Callable[..., Stack], fake_gcs: Emulator, prefix: str | None
) -> None:
    bucket = gcs_bucket(fake_gcs)
    stack = make_stack(server_url, gcs_runner(tmp_path / "terraformrc", fake_gcs, bucket, prefix))
    env = env_uuid(stack)

    deployment = stack.deploy()

    assert_succeeded(deployment)
    assert "https://shop.example.test/bucket-shop" == stack.outputs(deployment)["shop"]["url"]
    name = f"{prefix}/{env}/default.tfstate" if prefix else f"{env}/default.tfstate"
    assert [name] == gcs_names(fake_gcs, bucket)
    state = httpx.get(gcs_object_url(fake_gcs, bucket, name), params={"alt": "media"})
    assert 200 == state.status_code, state.text
    assert_demo_state(state.json())


@pytest.mark.parametrize("prefix", [None, "states/shop"], ids=["no-prefix", "prefix"])
def test_azurerm__state_blob_is_env_uuid_terraform_tfstate_in_the_container(
    server_url: str,
    tmp_path: Path,
    make_stack: Callable[..., Stack],
    azurite: AzureStorage,
    prefix: str | None,
) -> None:
    container = azure_container(azurite)
    stack = make_stack(server_url, azurerm_runner(tmp_path / "terraformrc", azurite, container, prefix))
    env = env_uuid(stack)

    deployment = stack.deploy()

    assert_succeeded(deployment)
    assert "https://shop.example.test/bucket-shop" == stack.outputs(deployment)["shop"]["url"]
    name = f"{prefix}/{env}/terraform.tfstate" if prefix else f"{env}/terraform.tfstate"
    blobs = list(azurite.container_client(container).list_blobs())
    assert [name] == [blob.name for blob in blobs]
    assert "available" == blobs[0].lease.state  # the lock (a lease on the blob) was released
    assert_demo_state(json.loads(azurite.container_client(container).download_blob(name).readall()))
    assert azurite.key not in deployment["status_message"]


@pytest.mark.spread(False)  # the state is in the database
def test_orchestrator__state_versions_in_the_database_readable_only_while_executing(
    stack: Stack, orchestrator_state: OrchestratorState
) -> None:
    env = env_uuid(stack)

    first = stack.deploy()
    versions_after_first = orchestrator_state.versions(env)
    second = stack.deploy()

    assert_succeeded(first)
    assert_succeeded(second)
    assert versions_after_first, "the first deploy wrote no state version"
    versions = orchestrator_state.versions(env)
    assert list(range(1, len(versions) + 1)) == versions
    assert_demo_state(orchestrator_state.latest(env))
    assert orchestrator_state.held_lock(env) is None
    # The credentials of a finished deployment open nothing, neither reading nor locking.
    for deployment in (first, second):
        auth = orchestrator_state.auth(deployment["id"])
        assert 401 == httpx.get(orchestrator_state.url(env), auth=auth).status_code
        info = lock_info(str(uuid.uuid4()), "")
        assert 401 == orchestrator_state.lock(env, deployment["id"], info).status_code
    wrong = httpx.BasicAuth(second["id"], "not-the-token")
    assert 401 == httpx.get(orchestrator_state.url(env), auth=wrong).status_code


# -- the lock: held, refused to others, released -------------------------------------------------------


def test_s3__lock_object_refuses_a_second_client_and_a_deployment_until_deleted(
    server_url: str, tmp_path: Path, make_stack: Callable[..., Stack], moto: Emulator, s3: Any
) -> None:
    bucket = s3_bucket(s3)
    stack = make_stack(server_url, s3_runner(tmp_path / "terraformrc", moto, bucket))
    env = env_uuid(stack)
    assert_succeeded(stack.deploy())
    client = s3
    lock_key = f"{env}.tfstate.tflock"
    lock_id = str(uuid.uuid4())

    # Take the lock as Terraform does with use_lockfile: create the object only if it does not exist.
    client.put_object(
        Bucket=bucket,
        Key=lock_key,
        Body=json.dumps(lock_info(lock_id, f"{bucket}/{env}.tfstate")).encode(),
        IfNoneMatch="*",
    )
    with pytest.raises(client.exceptions.ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=bucket, Key=lock_key, Body=b"{}", IfNoneMatch="*")
    refused = stack.deploy()
    client.delete_object(Bucket=bucket, Key=lock_key)
    after = stack.deploy()

    assert_failed_on_lock(refused, f"ID:        {lock_id}")
    assert_succeeded(after)
    assert [f"{env}.tfstate"] == s3_keys(s3, bucket)


def test_gcs__lock_object_refuses_a_second_client_and_a_deployment_until_deleted(
    server_url: str, tmp_path: Path, make_stack: Callable[..., Stack], fake_gcs: Emulator
) -> None:
    bucket = gcs_bucket(fake_gcs)
    stack = make_stack(server_url, gcs_runner(tmp_path / "terraformrc", fake_gcs, bucket))
    env = env_uuid(stack)
    assert_succeeded(stack.deploy())
    lock_name = f"{env}/default.tflock"
    lock_id = str(uuid.uuid4())
    info = json.dumps(lock_info(lock_id, f"gs://{bucket}/{env}/default.tflock")).encode()

    # Take the lock as Terraform's gcs backend does: create only if absent (ifGenerationMatch=0).
    taken = gcs_upload(fake_gcs, bucket, lock_name, info, ifGenerationMatch="0")
    second = gcs_upload(fake_gcs, bucket, lock_name, b"{}", ifGenerationMatch="0")
    refused = stack.deploy()
    deleted = httpx.delete(gcs_object_url(fake_gcs, bucket, lock_name))
    after = stack.deploy()

    assert 200 == taken.status_code, taken.text
    assert 412 == second.status_code, second.text
    # The gcs backend's lock ID is the lock object's generation, not the ID written in it.
    assert_failed_on_lock(refused, f"ID:        {taken.json()['generation']}", f"as {lock_id}")
    assert deleted.status_code in (200, 204), deleted.text
    assert_succeeded(after)
    assert [f"{env}/default.tfstate"] == gcs_names(fake_gcs, bucket)


def test_azurerm__blob_lease_refuses_a_second_client_and_a_deployment_until_released(
    server_url: str, tmp_path: Path, make_stack: Callable[..., Stack], azurite: AzureStorage
) -> None:
    container = azure_container(azurite)
    stack = make_stack(server_url, azurerm_runner(tmp_path / "terraformrc", azurite, container))
    env = env_uuid(stack)
    assert_succeeded(stack.deploy())
    blob = azurite.container_client(container).get_blob_client(f"{env}/terraform.tfstate")
    lock_id = str(uuid.uuid4())
    before = blob.get_blob_properties()

    # Take the lock as Terraform's azurerm backend does: an infinite lease on the state blob, the lock
    # info in its metadata.
    lease = blob.acquire_lease(lease_duration=-1)
    info = json.dumps(lock_info(lock_id, f"{container}/{env}/terraform.tfstate")).encode()
    blob.set_blob_metadata({"terraformlockid": base64.b64encode(info).decode()}, lease=lease)
    with pytest.raises(ResourceExistsError):
        blob.acquire_lease(lease_duration=-1)
    locked = blob.get_blob_properties()
    refused = stack.deploy()
    after = blob.get_blob_properties()
    blob.set_blob_metadata({}, lease=lease)
    lease.release()
    again = stack.deploy()

    assert_failed_on_lock(refused, lock_id)
    assert (after.etag, after.size) == (locked.etag, locked.size)  # the state untouched
    assert before.size == after.size
    assert_succeeded(again)
    assert [f"{env}/terraform.tfstate"] == [b.name for b in azurite.container_client(container).list_blobs()]


@pytest.mark.spread(False)  # the state is in the database
def test_orchestrator__lock_refuses_a_second_lock_and_a_deployment_until_unlocked(
    server_url: str, tmp_path: Path, make_stack: Callable[..., Stack], orchestrator_state: OrchestratorState
) -> None:
    hold = tmp_path / "hold"
    tf_config = tmp_path / "terraformrc"
    environment = held_terraform(tmp_path / "bin", hold)
    stack = make_stack(server_url, runner_body(tf_config, None, **environment))
    env = env_uuid(stack)
    assert_succeeded(stack.deploy())  # through the wrapper, nothing held
    versions_before = orchestrator_state.versions(env)
    first_id, second_id = str(uuid.uuid4()), str(uuid.uuid4())

    # Deployment A executes, its Terraform held before `apply`: its credentials take the lock twice.
    hold.touch()
    held = start(stack)
    first = orchestrator_state.lock(env, held["id"], lock_info(first_id, orchestrator_state.url(env)))
    second = orchestrator_state.lock(env, held["id"], lock_info(second_id, orchestrator_state.url(env)))
    readable = httpx.get(orchestrator_state.url(env), auth=orchestrator_state.auth(held["id"]))
    hold.unlink()
    refused = stack.wait(held["id"])

    assert 200 == first.status_code, first.text
    assert 423 == second.status_code, second.text
    assert first_id == second.json()["ID"]
    assert lock_info(first_id, orchestrator_state.url(env)) == second.json()
    assert 200 == readable.status_code, readable.text  # while executing, its credentials read the state
    assert_demo_state(readable.json())
    assert_failed_on_lock(refused, f"ID:        {first_id}")
    assert versions_before == orchestrator_state.versions(env)  # nothing written while locked

    # A lock left behind by a deployment that ended is released with it: its runner cannot unlock any
    # more (its credentials only open executing deployments), so the next deployment would be stuck.
    assert 401 == orchestrator_state.lock(env, held["id"], {"ID": first_id}, method="UNLOCK").status_code
    assert orchestrator_state.held_lock(env) is None
    after = stack.deploy()

    assert_succeeded(after)
    assert orchestrator_state.held_lock(env) is None


# -- bundles and logs in S3 ------------------------------------------------------------------------------


def test_object_store_s3__bundles_and_logs_live_in_the_bucket(
    settings: ServerSettings,
    make_stack: Callable[..., Stack],
    moto: Emulator,
    s3: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in MOTO_CREDENTIALS.items():  # the server's boto3 reads the standard AWS variables
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    bucket = new_bucket_name("objects")
    s3.create_bucket(Bucket=bucket)

    def make(port: int) -> ServerSettings:
        return settings.model_copy(
            update={
                "listen": f"127.0.0.1:{port}",
                "public_url": f"http://127.0.0.1:{port}",
                "status_check_interval_seconds": 0.5,
                "object_store_url": f"s3://{bucket}/po",
                "object_store_endpoint": moto.url,
            }
        )

    with running_server(make) as base_url:
        stack = make_stack(base_url)
        deployment = stack.deploy()
        logs = stack.client.get(
            f"/orgs/{stack.org}/deployments/{deployment['id']}/actions/get-logs",
            headers={"DecryptKey": deployment["_identity"]},
        )

    assert_succeeded(deployment)
    keys = s3_keys(s3, bucket)
    assert f"po/bundles/acme/{deployment['id']}.tar.gz.sealed" in keys, keys
    assert any(key.startswith("po/logs/") and deployment["id"] in key for key in keys), keys
    assert all(key.startswith("po/") for key in keys), keys
    assert 200 == logs.status_code, logs.text
    assert "terraform_data" in logs.text
    assert not (settings.data_dir / "objects").exists()
