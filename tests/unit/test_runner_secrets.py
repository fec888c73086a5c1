"""Sensitive runner configuration values: split, restore, keep on update, validated after restoring."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.domain.runner_requests import RunnerCreateBody, apply_runner_patch
from orchestrator.domain.runner_secrets import (
    SECRET,
    SENSITIVE_PATHS,
    keep_existing_secrets,
    restore_secrets,
    split_secrets,
)
from orchestrator.domain.runner_types import (
    K8sRunnerConfiguration,
    RunnerType,
    VmRunnerConfiguration,
    VmSshConnection,
    parse_runner_configuration,
    runner_configuration_to_dict,
)
from orchestrator.errors import InvalidInputError

DATA = Path(__file__).resolve().parent.parent / "data" / "runners"
EXAMPLES = sorted(path.name for path in DATA.glob("*.yaml"))


def config(name: str) -> dict[str, Any]:
    """The validated runner configuration of an example, as the JSON dict that would be stored."""
    raw = yaml.safe_load((DATA / name).read_text())["runner_configuration"]
    return runner_configuration_to_dict(parse_runner_configuration(raw))


def test_sensitive_paths_table() -> None:
    assert set(SENSITIVE_PATHS) == set(RunnerType)
    assert SENSITIVE_PATHS[RunnerType.KUBERNETES] == (
        "cluster.auth.client_certificate_data",
        "cluster.auth.client_key_data",
        "cluster.auth.service_account_token",
    )
    assert SENSITIVE_PATHS[RunnerType.VM] == ("connection.private_key", "job.secrets.*")
    for kind in set(RunnerType) - {RunnerType.KUBERNETES, RunnerType.VM}:
        assert SENSITIVE_PATHS[kind] == ()


def test_split_kubernetes_client_certificate() -> None:
    full = config("seed001-kubernetes.yaml")
    before = copy.deepcopy(full)
    public, secrets = split_secrets(full)
    assert full == before  # argument untouched
    assert public["cluster"]["auth"] == {"client_certificate_data": SECRET, "client_key_data": SECRET}
    assert secrets == {
        "cluster.auth.client_certificate_data": full["cluster"]["auth"]["client_certificate_data"],
        "cluster.auth.client_key_data": full["cluster"]["auth"]["client_key_data"],
    }
    # The CA certificate and everything else stays public.
    assert public["cluster"]["cluster_data"] == full["cluster"]["cluster_data"]
    assert public["job"] == full["job"]
    assert restore_secrets(public, secrets) == full


def test_split_kubernetes_token() -> None:
    full = config("kubernetes-token.yaml")
    public, secrets = split_secrets(full)
    assert public["cluster"]["auth"] == {"service_account_token": SECRET}
    assert list(secrets) == ["cluster.auth.service_account_token"]
    assert restore_secrets(public, secrets) == full


def test_split_vm_ssh() -> None:
    full = config("vm-ssh.yaml")
    public, secrets = split_secrets(full)
    assert public["connection"]["private_key"] == SECRET
    assert public["connection"]["host_public_key"] == full["connection"]["host_public_key"]
    assert public["job"]["secrets"] == {"RUNNER_GIT_SSH_KEYS": SECRET, "GOOGLE_CREDENTIALS": SECRET}
    assert public["job"]["environment"] == {"TF_LOG": "WARN"}
    assert secrets == {
        "connection.private_key": full["connection"]["private_key"],
        "job.secrets.RUNNER_GIT_SSH_KEYS": "c3NoLWtleXM=",
        "job.secrets.GOOGLE_CREDENTIALS": "not-a-real-credential",
    }
    assert restore_secrets(public, secrets) == full


@pytest.mark.parametrize(
    "name",
    [
        "seed000-gke.yaml",
        "seed000-agent.yaml",
        "kubernetes-aks.yaml",
        "kubernetes-eks.yaml",
        "serverless-ecs.yaml",
        "vm-agent.yaml",
        "vm-local.yaml",
    ],
)
def test_nothing_to_split(name: str) -> None:
    full = config(name)
    public, secrets = split_secrets(full)
    assert public == full
    assert secrets == {}


@pytest.mark.parametrize("name", EXAMPLES)
def test_round_trip_and_no_placeholder_stored(name: str) -> None:
    full = config(name)
    public, secrets = split_secrets(full)
    assert SECRET not in secrets.values()
    assert all(value for value in secrets.values())
    assert restore_secrets(public, secrets) == full
    # Splitting the public form again finds only placeholders: never stores them.
    if secrets:
        with pytest.raises(InvalidInputError, match="placeholder"):
            split_secrets(public)


def test_split_of_unknown_type_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="known type"):
        split_secrets({"type": "nomad", "secret": "x"})
    with pytest.raises(ValueError, match="known type"):
        split_secrets({"cluster": {}})


def test_restore_without_stored_value_fails() -> None:
    public, secrets = split_secrets(config("vm-ssh.yaml"))
    del secrets["job.secrets.GOOGLE_CREDENTIALS"]
    with pytest.raises(KeyError, match=r"job\.secrets\.GOOGLE_CREDENTIALS"):
        restore_secrets(public, secrets)


@given(
    st.dictionaries(
        st.from_regex(r"[A-Z][A-Z0-9_]{0,15}", fullmatch=True),
        st.text(min_size=1, max_size=40).filter(lambda value: value != SECRET),
        max_size=6,
    )
)
def test_vm_secrets_round_trip(job_secrets: dict[str, str]) -> None:
    full = {
        "type": "vm",
        "connection": {"type": "local"},
        "job": {"runtime": "process", "secrets": job_secrets},
    }
    public, secrets = split_secrets(full)
    assert set(public["job"]["secrets"].values()) <= {SECRET}
    assert secrets == {f"job.secrets.{key}": value for key, value in job_secrets.items()}
    assert restore_secrets(public, secrets) == full
    assert keep_existing_secrets(public, secrets) == full


def test_keep_existing_secrets_takes_stored_values_only_for_placeholders() -> None:
    full = config("seed001-kubernetes.yaml")
    public, secrets = split_secrets(full)
    incoming = copy.deepcopy(public)
    incoming["cluster"]["auth"]["client_certificate_data"] = "bmV3LWNlcnQ="  # a new value: kept as sent
    kept = keep_existing_secrets(incoming, secrets)
    assert kept["cluster"]["auth"]["client_certificate_data"] == "bmV3LWNlcnQ="
    assert kept["cluster"]["auth"]["client_key_data"] == full["cluster"]["auth"]["client_key_data"]
    assert incoming["cluster"]["auth"]["client_key_data"] == SECRET  # argument untouched


def test_keep_existing_secrets_refuses_a_placeholder_without_stored_value() -> None:
    public, secrets = split_secrets(config("seed001-kubernetes.yaml"))
    incoming = copy.deepcopy(public)
    incoming["cluster"]["auth"]["service_account_token"] = SECRET
    with pytest.raises(InvalidInputError) as info:
        keep_existing_secrets(incoming, secrets)
    field = "runner_configuration.cluster.auth.service_account_token"
    assert info.value.message.startswith(f"{field}: the placeholder 'SECRET'")
    assert info.value.details is not None
    assert info.value.details["errors"][0]["field"] == field


def test_keep_existing_secrets_for_a_new_vm_secret_key() -> None:
    public, secrets = split_secrets(config("vm-ssh.yaml"))
    incoming = copy.deepcopy(public)
    incoming["job"]["secrets"]["NEW_ONE"] = SECRET
    with pytest.raises(InvalidInputError, match=r"runner_configuration\.job\.secrets\.NEW_ONE: "):
        keep_existing_secrets(incoming, secrets)


def test_keep_existing_secrets_leaves_non_sensitive_placeholders_alone() -> None:
    ecs = config("serverless-ecs.yaml")
    ecs["job"]["environment"]["LITERAL"] = SECRET
    assert keep_existing_secrets(ecs, {}) == ecs
    unknown = {"type": "nomad", "token": SECRET}
    assert keep_existing_secrets(unknown, {}) == unknown  # validation refuses the type afterwards


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("seed001-kubernetes.yaml", ("cluster", "auth", "client_certificate_data")),
        ("seed001-kubernetes.yaml", ("cluster", "auth", "client_key_data")),
        ("kubernetes-token.yaml", ("cluster", "auth", "service_account_token")),
        ("vm-ssh.yaml", ("connection", "private_key")),
        ("vm-ssh.yaml", ("job", "secrets", "GOOGLE_CREDENTIALS")),
    ],
)
def test_create_with_placeholder_is_refused(name: str, path: tuple[str, ...]) -> None:
    raw = yaml.safe_load((DATA / name).read_text())
    node = raw["runner_configuration"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = SECRET
    with pytest.raises(InvalidInputError) as info:
        parse_runner_configuration(raw["runner_configuration"])
    assert info.value.message.startswith("runner_configuration." + ".".join(path) + ": ")
    assert "placeholder" in info.value.message
    with pytest.raises(InvalidInputError):
        keep_existing_secrets(raw["runner_configuration"], {})
    RunnerCreateBody.model_validate({"id": "r1", **yaml.safe_load((DATA / name).read_text())})


def test_patch_sending_placeholders_back_validates_the_restored_values() -> None:
    full = config("seed001-kubernetes.yaml")
    public, secrets = split_secrets(full)
    # The client echoes what GET answered, with a new server; job and cluster replace the stored ones.
    patch = {"type": "kubernetes", "cluster": copy.deepcopy(public["cluster"])}
    patch["cluster"]["cluster_data"]["server"] = "https://k8s.example.com:6443"
    patched, _ = apply_runner_patch("kubernetes", public, patch, stored_secrets=secrets)
    assert isinstance(patched, K8sRunnerConfiguration)
    assert patched.cluster.cluster_data.server == "https://k8s.example.com:6443"
    assert patched.cluster.auth.client_key_data == full["cluster"]["auth"]["client_key_data"]
    new_public, new_secrets = split_secrets(runner_configuration_to_dict(patched))
    assert new_secrets == secrets
    assert new_public["cluster"]["auth"] == public["cluster"]["auth"]


def test_patch_with_placeholder_but_nothing_stored_names_the_field() -> None:
    public, _ = split_secrets(config("seed001-kubernetes.yaml"))
    with pytest.raises(InvalidInputError) as info:
        apply_runner_patch("kubernetes", public, {"type": "kubernetes"}, stored_secrets={})
    assert info.value.message.startswith("runner_configuration.cluster.auth.client_certificate_data: ")


def test_patch_replacing_a_key_validates_the_new_value() -> None:
    public, secrets = split_secrets(config("vm-ssh.yaml"))
    connection = {**public["connection"], "private_key": "not a key"}
    with pytest.raises(InvalidInputError) as info:
        apply_runner_patch("vm", public, {"type": "vm", "connection": connection}, stored_secrets=secrets)
    assert info.value.message.startswith(
        "runner_configuration.connection.private_key: must be an SSH private key"
    )


def test_patch_vm_keeps_stored_private_key_and_secrets() -> None:
    full = config("vm-ssh.yaml")
    public, secrets = split_secrets(full)
    job = {**public["job"], "secrets": {"GOOGLE_CREDENTIALS": SECRET, "EXTRA": "new"}}
    patched, _ = apply_runner_patch("vm", public, {"type": "vm", "job": job}, stored_secrets=secrets)
    assert isinstance(patched, VmRunnerConfiguration)
    assert isinstance(patched.connection, VmSshConnection)
    assert patched.connection.private_key == full["connection"]["private_key"]
    # Merged: the stored secret the patch left out is kept too.
    assert patched.job.secrets == {**full["job"]["secrets"], "EXTRA": "new"}


def test_patch_leaving_secrets_out_keeps_them_and_null_removes_one() -> None:
    """A merge patch that does not name a sensitive value keeps the stored one; null removes it."""
    full = config("vm-ssh.yaml")
    public, secrets = split_secrets(full)
    assert {"GOOGLE_CREDENTIALS", "RUNNER_GIT_SSH_KEYS"} <= set(full["job"]["secrets"])

    kept, _ = apply_runner_patch("vm", public, {"job": {"environment": {"A": "b"}}}, stored_secrets=secrets)
    removed, _ = apply_runner_patch(
        "vm", public, {"job": {"secrets": {"GOOGLE_CREDENTIALS": None}}}, stored_secrets=secrets
    )

    assert isinstance(kept, VmRunnerConfiguration)
    assert isinstance(kept.connection, VmSshConnection)
    assert kept.connection.private_key == full["connection"]["private_key"]
    assert kept.job.secrets == full["job"]["secrets"]
    assert {"A": "b", **full["job"]["environment"]} == kept.job.environment
    assert isinstance(removed, VmRunnerConfiguration)
    assert "GOOGLE_CREDENTIALS" not in removed.job.secrets
    assert removed.job.secrets["RUNNER_GIT_SSH_KEYS"] == full["job"]["secrets"]["RUNNER_GIT_SSH_KEYS"]


def test_patch_kubernetes_credentials_left_out_are_kept() -> None:
    full = config("seed001-kubernetes.yaml")
    public, secrets = split_secrets(full)

    patched, _ = apply_runner_patch(
        "kubernetes",
        public,
        {"cluster": {"cluster_data": {"server": "https://k8s.example.com"}}},
        stored_secrets=secrets,
    )

    assert isinstance(patched, K8sRunnerConfiguration)
    assert patched.cluster.auth.client_key_data == full["cluster"]["auth"]["client_key_data"]
    assert patched.cluster.auth.client_certificate_data == full["cluster"]["auth"]["client_certificate_data"]
    assert "https://k8s.example.com" == patched.cluster.cluster_data.server


def test_validation_errors_do_not_repeat_sensitive_input() -> None:
    raw = yaml.safe_load((DATA / "vm-ssh.yaml").read_text())
    raw["runner_configuration"]["connection"]["private_key"] = "TOP-SECRET-NOT-A-KEY"
    raw["runner_configuration"]["job"]["secrets"]["TOKEN"] = "TOP-SECRET-VALUE"
    with pytest.raises(pydantic.ValidationError) as info:
        RunnerCreateBody.model_validate({"id": "r1", **raw})
    assert len(info.value.errors()) == 2
    assert "TOP-SECRET" not in str(info.value)
    with pytest.raises(InvalidInputError) as invalid:
        parse_runner_configuration(raw["runner_configuration"])
    assert "TOP-SECRET" not in str(invalid.value)
    assert "TOP-SECRET" not in str(invalid.value.details)
