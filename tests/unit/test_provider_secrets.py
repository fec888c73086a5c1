"""Credentials in module providers' configurations: which values count, how they are masked, kept on
update and moved out of main.tf."""

from __future__ import annotations

import pytest

from orchestrator.domain import provider_secrets
from orchestrator.errors import InvalidInputError


@pytest.mark.parametrize(
    "key",
    [
        "access_key",
        "secret_key",
        "client_secret",
        "token",
        "access_token",
        "password",
        "api_key",
        "apikey",
        "private_key",
        "credentials",
        "client_certificate",
        "client_key",
        "sas_token",
        "SECRET_ACCESS_KEY",
        "assume_role_auth[0]",
    ],
)
def test_sensitive_key__credential_names(key: str) -> None:
    assert provider_secrets.is_sensitive_key(key)


@pytest.mark.parametrize(
    "key", ["region", "project", "endpoint", "role_arn", "default_tags", "monkey", "host"]
)
def test_sensitive_key__other_names(key: str) -> None:
    assert not provider_secrets.is_sensitive_key(key)


def test_public_configuration__literals_under_credential_keys_masked_references_kept() -> None:
    configuration = {
        "region": "eu-west-1",
        "secret_key": "s3cr3t",
        "token": "${var.session_token}",
        "auth": {"username": "deploy", "pin": 1234, "enabled": True, "nothing": None},
        "endpoints": [{"url": "https://x", "api_key": "k"}],
    }

    public = provider_secrets.public_configuration(configuration)

    assert {
        "region": "eu-west-1",
        "secret_key": "SECRET",
        "token": "${var.session_token}",
        "auth": {"username": "SECRET", "pin": "SECRET", "enabled": True, "nothing": None},
        "endpoints": [{"url": "https://x", "api_key": "SECRET"}],
    } == public
    assert "s3cr3t" == configuration["secret_key"]


def test_keep_existing__secret_takes_the_stored_value_or_names_the_field() -> None:
    stored = {"region": "eu-west-1", "secret_key": "s3cr3t", "endpoints": [{"api_key": "k"}]}
    edited = {"region": "us-east-1", "secret_key": "SECRET", "endpoints": [{"api_key": "SECRET"}]}

    kept = provider_secrets.keep_existing(edited, stored)
    with pytest.raises(InvalidInputError) as missing:
        provider_secrets.keep_existing({"password": "SECRET"}, stored)
    with pytest.raises(InvalidInputError) as on_create:
        provider_secrets.keep_existing({"endpoints": [{"api_key": "SECRET"}]}, None)

    assert {"region": "us-east-1", "secret_key": "s3cr3t", "endpoints": [{"api_key": "k"}]} == kept
    assert missing.value.message.startswith("configuration.password: the placeholder 'SECRET'")
    assert on_create.value.message.startswith("configuration.endpoints[0].api_key:")


def test_extract_secrets__variables_named_per_provider_and_path() -> None:
    configuration = {
        "region": "eu-west-1",
        "secret_key": "s3cr3t",
        "token": "${var.t}",
        "assume_role[0]": {"external_id": "e", "session_token": "literal $\\{not a reference}"},
    }

    moved, values = provider_secrets.extract_secrets("aws", "main-1", configuration)

    assert {
        "region": "eu-west-1",
        "secret_key": "${var.po_aws_main_1_secret_key}",
        "token": "${var.t}",
        "assume_role[0]": {
            "external_id": "e",
            "session_token": "${var.po_aws_main_1_assume_role_0_session_token}",
        },
    } == moved
    assert {
        "po_aws_main_1_secret_key": "s3cr3t",
        "po_aws_main_1_assume_role_0_session_token": "literal ${not a reference}",
    } == values
