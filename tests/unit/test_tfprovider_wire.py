"""The provider's own protocol pieces: cty's msgpack and JSON forms, defaults, plans, the cached schema."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import msgpack
import pytest

from orchestrator.tfprovider import certificate, cty, registry, resource, rpc, runners, server, tfplugin6
from orchestrator.tfprovider.schema import a_bool, a_dyn, a_map, a_num, a_obj, a_str, object_type
from orchestrator.tfprovider.session import ApiProblem

BLOCK = {
    "id": a_str(required=True, requires_replace=True),
    "size": a_num(optional=True),
    "tags": a_map(a_str(), optional=True),
    "params": a_dyn(optional=True),
    "job": a_obj(
        {"runtime": a_str(optional=True, default="process"), "image": a_str(optional=True)},
        optional=True,
    ),
    "enabled": a_bool(optional=True, default=False),
    "uuid": a_str(computed=True),
}
TYPE = object_type(BLOCK)


def test_msgpack__round_trips_every_kind_of_value() -> None:
    value = {
        "id": "a",
        "size": 2.5,
        "tags": {"b": "2", "a": "1"},
        "params": cty.DynamicValue(cty.Object({"x": cty.Tuple((cty.NUMBER, cty.STRING))}), {"x": [1, "y"]}),
        "job": {"runtime": "docker", "image": None},
        "enabled": True,
        "uuid": cty.UNKNOWN,
    }
    assert cty.from_msgpack(cty.to_msgpack(value, TYPE), TYPE) == value


def test_msgpack__writes_what_cty_writes() -> None:
    """Unknown is extension 0 (``d4 00 00``); an object has every attribute, in name order; a dynamic
    value is [type JSON, value]; a whole float is an integer."""
    raw = msgpack.unpackb(
        cty.to_msgpack({"id": "a", "size": 3.0, "params": {"k": True}, "uuid": cty.UNKNOWN}, TYPE),
        raw=False,
    )
    assert list(raw) == sorted(BLOCK)
    assert raw["size"] == 3 and isinstance(raw["size"], int)
    assert raw["tags"] is None and raw["job"] is None
    assert raw["uuid"] == msgpack.ExtType(0, b"\x00")
    assert raw["params"] == [b'["object",{"k":"bool"}]', {"k": True}]
    assert cty.to_msgpack(cty.UNKNOWN, cty.STRING) == b"\xd4\x00\x00"


def test_msgpack__reads_refined_unknowns_missing_attributes_and_numbers_as_text() -> None:
    refined = msgpack.ExtType(12, msgpack.packb({1: True}))
    data = msgpack.packb({"id": refined, "size": "12345678901234567890"}, use_bin_type=True)
    value = cty.from_msgpack(data, TYPE)
    assert value["id"] is cty.UNKNOWN
    assert value["size"] == 12345678901234567890
    assert value["tags"] is None and value["uuid"] is None


def test_msgpack__refuses_what_the_schema_does_not_have() -> None:
    with pytest.raises(cty.CtyError, match="unsupported attribute 'nope'"):
        cty.from_msgpack(msgpack.packb({"nope": 1}), TYPE)
    with pytest.raises(cty.CtyError, match="a string was expected"):
        cty.to_msgpack({"id": 1}, TYPE)


def test_json__reads_state_with_typed_dynamic_values_and_drops_removed_attributes() -> None:
    state = {
        "id": "a",
        "params": {"value": {"x": ["y"]}, "type": ["object", {"x": ["tuple", ["string"]]}]},
        "removed_since": "old",
    }
    value = cty.from_json(state, TYPE)
    assert value["params"] == cty.DynamicValue(cty.Object({"x": cty.Tuple((cty.STRING,))}), {"x": ["y"]})
    assert "removed_since" not in value and value["job"] is None


def test_types__are_written_and_read_as_json() -> None:
    assert json.loads(cty.type_bytes(TYPE))[1]["tags"] == ["map", "string"]
    assert cty.parse_type(["list", ["object", {"a": "number"}]]) == cty.List(cty.Object({"a": cty.NUMBER}))
    assert cty.literal_type({"a": [1, "b"]}) == cty.Object({"a": cty.Tuple((cty.NUMBER, cty.STRING))})


def test_tfplugin6__messages_keep_their_field_numbers() -> None:
    """A few wire bytes by hand: field numbers are the protocol, whatever the names."""
    request = tfplugin6.message("PlanResourceChange.Request")(type_name="t", prior_private=b"p")
    assert request.SerializeToString() == b"\n\x01t*\x01p"
    schema = tfplugin6.message("Schema.Attribute")(name="n", nested_type={"nesting": 1}, sensitive=True)
    assert schema.SerializeToString() == b"\n\x01n8\x01R\x02\x18\x01"


async def _no_call(*args: object) -> dict[str, object]:
    raise AssertionError("a plan calls no API")


async def _no_delete(*args: object) -> None:
    raise AssertionError("a plan calls no API")


SPEC = resource.Spec(
    name="thing",
    attributes=BLOCK,
    create=_no_call,
    read=_no_call,
    delete=_no_delete,
    to_state=lambda found, prior: found,
    validate=lambda config: ["size must be positive"] if (config.get("size") or 0) < 0 else [],
)


def _config(**values: object) -> dict[str, object]:
    return {name: values.get(name) for name in BLOCK}


def test_plan__a_create_fills_defaults_and_plans_computed_values_unknown() -> None:
    config = _config(id="a", job={"runtime": None, "image": "x"})
    diags = resource.Diagnostics()
    planned, replaced = resource.plan(SPEC, None, dict(config), config, diags)
    assert diags.errors == [] and replaced == []
    assert planned is not None
    assert planned["enabled"] is False and planned["job"] == {"runtime": "process", "image": "x"}
    assert planned["uuid"] is cty.UNKNOWN


def test_plan__an_update_keeps_computed_values_and_names_what_replaces() -> None:
    prior = _config(id="a", enabled=False, uuid="u-1")
    config = _config(id="b", enabled=None)
    proposed = {**config, "uuid": "u-1", "enabled": True}  # Terraform proposes the prior value of a default
    planned, replaced = resource.plan(SPEC, prior, proposed, config, resource.Diagnostics())
    assert planned is not None and planned["uuid"] == "u-1" and planned["enabled"] is False
    assert replaced == ["id"]


def test_plan__validates_known_configurations_only_and_a_destroy_is_null() -> None:
    diags = resource.Diagnostics()
    assert resource.plan(SPEC, None, _config(id="a", size=-1), _config(id="a", size=-1), diags) == (None, [])
    assert diags.errors == [("size must be positive", "")]
    unknown = _config(id=cty.UNKNOWN, size=-1)
    assert resource.validate(SPEC, unknown) == []
    assert resource.plan(SPEC, _config(id="a"), None, None, resource.Diagnostics()) == (None, [])


async def test_apply__without_a_configured_provider_is_a_diagnostic() -> None:
    diags = resource.Diagnostics()
    assert await resource.apply(SPEC, None, _config(id="a"), _config(id="a"), diags) is None
    assert diags.errors == [
        ("provider not configured", "Terraform called a resource before configuring the provider")
    ]
    assert isinstance(ApiProblem("a", "b"), Exception)


def test_runner_spec__plans_the_seed_runner_configuration_defaults() -> None:
    spec = registry.RESOURCES["platform-orchestrator_kubernetes_gke_runner"]
    config = cty.from_msgpack(
        cty.to_msgpack({"id": "r"}, object_type(spec.attributes)), object_type(spec.attributes)
    )
    config["runner_configuration"] = {
        "cluster": {
            "name": "c",
            "project_id": "p",
            "location": "l",
            "internal_ip": None,
            "proxy_url": None,
            "auth": {"gcp_audience": "a", "gcp_service_account": "s"},
        },
        "job": {"namespace": "n", "service_account": "s", "pod_template": None},
    }
    planned, _ = resource.plan(spec, None, dict(config), config, resource.Diagnostics())
    assert planned is not None
    assert planned["runner_configuration"]["cluster"]["internal_ip"] is False
    assert runners.KUBERNETES_GKE.name == "kubernetes_gke_runner"


def test_handlers__serve_every_method_rpc_implements() -> None:
    assert set(rpc.HANDLERS) == set(server.RPC_METHODS)
    assert set(server.RPC_METHODS) < set(server.HANDLERS)


def test_schema_file__is_what_the_code_declares() -> None:
    """provider_schema.binpb answers GetProviderSchema without loading the resources: it must not drift.
    Regenerate it with `python -m orchestrator.tfprovider.server --write`."""
    assert Path(server.SCHEMA_FILE).read_bytes() == rpc.build_schema_response(), (
        "stale: python -m orchestrator.tfprovider.server --write"
    )
    response = tfplugin6.message("GetProviderSchema.Response").FromString(
        Path(server.SCHEMA_FILE).read_bytes()
    )
    assert set(response.resource_schemas) == set(registry.RESOURCES)
    assert set(response.data_source_schemas) == set(registry.DATA_SOURCES)
    assert [a.name for a in response.provider.block.attributes] == [
        "api_url",
        "auth_token",
        "org_id",
        "octl_config_file",
    ]


def test_certificate__is_a_valid_self_signed_localhost_server_certificate() -> None:
    """What certificate.py writes by hand, read by cryptography's X.509 parser (and by Go's TLS in every
    acceptance test): the signature verifies with its own key, and the extensions are go-plugin's."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    der, key_pem = certificate.certificate_and_key()
    parsed = x509.load_der_x509_certificate(der)
    assert x509.load_pem_x509_certificate(certificate.pem(der)) == parsed
    public = parsed.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    public.verify(parsed.signature, parsed.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key().public_numbers() == public.public_numbers()
    assert parsed.version == x509.Version.v3 and parsed.serial_number > 0
    assert parsed.subject == parsed.issuer
    assert parsed.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "localhost"
    assert parsed.not_valid_before_utc < datetime.datetime.now(datetime.UTC) < parsed.not_valid_after_utc
    extensions = parsed.extensions
    assert extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    ) == ["localhost"]
    assert extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    usage = extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.digital_signature and usage.value.key_cert_sign
    assert list(extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    assert certificate.certificate_and_key()[0] != der  # a new key every start
