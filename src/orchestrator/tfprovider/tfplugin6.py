"""The messages of Terraform's plugin protocol 6 that this provider reads and writes.

Declared here by name, field number and type (those of Terraform's ``docs/plugin-protocol/tfplugin6.proto``,
protocol 6.9) and built into a private descriptor pool when first used, so no generated code is shipped
and nothing collides with another copy of the protocol in the same process. Only what the provider
serves is declared: a request's other fields are kept as unknown fields and ignored, and the RPCs not
served here answer ``UNIMPLEMENTED``.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

PACKAGE: Final = "tfplugin6"

#: (message, ((field, number, type, repeated), ...)); a type is a scalar, a message or ``enum:<name>``.
#: Nested messages are written ``Outer.Inner`` after their outer message.
MESSAGES: Final[tuple[tuple[str, tuple[tuple[str, int, str, bool], ...]], ...]] = (
    ("DynamicValue", (("msgpack", 1, "bytes", False), ("json", 2, "bytes", False))),
    (
        "Diagnostic",
        (
            ("severity", 1, "enum:Diagnostic.Severity", False),
            ("summary", 2, "string", False),
            ("detail", 3, "string", False),
            ("attribute", 4, "AttributePath", False),
        ),
    ),
    ("AttributePath", (("steps", 1, "AttributePath.Step", True),)),
    (
        "AttributePath.Step",
        (
            ("attribute_name", 1, "string", False),
            ("element_key_string", 2, "string", False),
            ("element_key_int", 3, "int64", False),
        ),
    ),
    ("RawState", (("json", 1, "bytes", False),)),
    ("Schema", (("version", 1, "int64", False), ("block", 2, "Schema.Block", False))),
    (
        "Schema.Block",
        (
            ("version", 1, "int64", False),
            ("attributes", 2, "Schema.Attribute", True),
            ("description", 4, "string", False),
            ("description_kind", 5, "enum:StringKind", False),
        ),
    ),
    (
        "Schema.Attribute",
        (
            ("name", 1, "string", False),
            ("type", 2, "bytes", False),
            ("nested_type", 10, "Schema.Object", False),
            ("description", 3, "string", False),
            ("required", 4, "bool", False),
            ("optional", 5, "bool", False),
            ("computed", 6, "bool", False),
            ("sensitive", 7, "bool", False),
            ("description_kind", 8, "enum:StringKind", False),
        ),
    ),
    (
        "Schema.Object",
        (
            ("attributes", 1, "Schema.Attribute", True),
            ("nesting", 3, "enum:Schema.Object.NestingMode", False),
        ),
    ),
    (
        "ServerCapabilities",
        (("plan_destroy", 1, "bool", False), ("get_provider_schema_optional", 2, "bool", False)),
    ),
    ("GetMetadata", ()),
    ("GetMetadata.Request", ()),
    (
        "GetMetadata.Response",
        (
            ("server_capabilities", 1, "ServerCapabilities", False),
            ("diagnostics", 2, "Diagnostic", True),
            ("data_sources", 3, "GetMetadata.DataSourceMetadata", True),
            ("resources", 4, "GetMetadata.ResourceMetadata", True),
        ),
    ),
    ("GetMetadata.DataSourceMetadata", (("type_name", 1, "string", False),)),
    ("GetMetadata.ResourceMetadata", (("type_name", 1, "string", False),)),
    ("GetProviderSchema", ()),
    ("GetProviderSchema.Request", ()),
    (
        "GetProviderSchema.Response",
        (
            ("provider", 1, "Schema", False),
            ("resource_schemas", 2, "map:Schema", True),
            ("data_source_schemas", 3, "map:Schema", True),
            ("diagnostics", 4, "Diagnostic", True),
            ("server_capabilities", 6, "ServerCapabilities", False),
        ),
    ),
    ("ValidateProviderConfig", ()),
    ("ValidateProviderConfig.Request", (("config", 1, "DynamicValue", False),)),
    ("ValidateProviderConfig.Response", (("diagnostics", 2, "Diagnostic", True),)),
    ("UpgradeResourceState", ()),
    (
        "UpgradeResourceState.Request",
        (
            ("type_name", 1, "string", False),
            ("version", 2, "int64", False),
            ("raw_state", 3, "RawState", False),
        ),
    ),
    (
        "UpgradeResourceState.Response",
        (("upgraded_state", 1, "DynamicValue", False), ("diagnostics", 2, "Diagnostic", True)),
    ),
    ("ValidateResourceConfig", ()),
    (
        "ValidateResourceConfig.Request",
        (("type_name", 1, "string", False), ("config", 2, "DynamicValue", False)),
    ),
    ("ValidateResourceConfig.Response", (("diagnostics", 1, "Diagnostic", True),)),
    ("ValidateDataResourceConfig", ()),
    (
        "ValidateDataResourceConfig.Request",
        (("type_name", 1, "string", False), ("config", 2, "DynamicValue", False)),
    ),
    ("ValidateDataResourceConfig.Response", (("diagnostics", 1, "Diagnostic", True),)),
    ("ConfigureProvider", ()),
    (
        "ConfigureProvider.Request",
        (("terraform_version", 1, "string", False), ("config", 2, "DynamicValue", False)),
    ),
    ("ConfigureProvider.Response", (("diagnostics", 1, "Diagnostic", True),)),
    ("ReadResource", ()),
    (
        "ReadResource.Request",
        (
            ("type_name", 1, "string", False),
            ("current_state", 2, "DynamicValue", False),
            ("private", 3, "bytes", False),
        ),
    ),
    (
        "ReadResource.Response",
        (
            ("new_state", 1, "DynamicValue", False),
            ("diagnostics", 2, "Diagnostic", True),
            ("private", 3, "bytes", False),
        ),
    ),
    ("PlanResourceChange", ()),
    (
        "PlanResourceChange.Request",
        (
            ("type_name", 1, "string", False),
            ("prior_state", 2, "DynamicValue", False),
            ("proposed_new_state", 3, "DynamicValue", False),
            ("config", 4, "DynamicValue", False),
            ("prior_private", 5, "bytes", False),
        ),
    ),
    (
        "PlanResourceChange.Response",
        (
            ("planned_state", 1, "DynamicValue", False),
            ("requires_replace", 2, "AttributePath", True),
            ("planned_private", 3, "bytes", False),
            ("diagnostics", 4, "Diagnostic", True),
        ),
    ),
    ("ApplyResourceChange", ()),
    (
        "ApplyResourceChange.Request",
        (
            ("type_name", 1, "string", False),
            ("prior_state", 2, "DynamicValue", False),
            ("planned_state", 3, "DynamicValue", False),
            ("config", 4, "DynamicValue", False),
            ("planned_private", 5, "bytes", False),
        ),
    ),
    (
        "ApplyResourceChange.Response",
        (
            ("new_state", 1, "DynamicValue", False),
            ("private", 2, "bytes", False),
            ("diagnostics", 3, "Diagnostic", True),
        ),
    ),
    ("ImportResourceState", ()),
    ("ImportResourceState.Request", (("type_name", 1, "string", False), ("id", 2, "string", False))),
    (
        "ImportResourceState.ImportedResource",
        (
            ("type_name", 1, "string", False),
            ("state", 2, "DynamicValue", False),
            ("private", 3, "bytes", False),
        ),
    ),
    (
        "ImportResourceState.Response",
        (
            ("imported_resources", 1, "ImportResourceState.ImportedResource", True),
            ("diagnostics", 2, "Diagnostic", True),
        ),
    ),
    ("ReadDataSource", ()),
    ("ReadDataSource.Request", (("type_name", 1, "string", False), ("config", 2, "DynamicValue", False))),
    (
        "ReadDataSource.Response",
        (("state", 1, "DynamicValue", False), ("diagnostics", 2, "Diagnostic", True)),
    ),
)

ENUMS: Final[tuple[tuple[str, tuple[tuple[str, int], ...]], ...]] = (
    ("StringKind", (("PLAIN", 0), ("MARKDOWN", 1))),
    ("Diagnostic.Severity", (("INVALID", 0), ("ERROR", 1), ("WARNING", 2))),
    (
        "Schema.Object.NestingMode",
        (("INVALID", 0), ("SINGLE", 1), ("LIST", 2), ("SET", 3), ("MAP", 4)),
    ),
)

SEVERITY_ERROR: Final = 1
NESTING_SINGLE: Final = 1


@cache
def _pool() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool

    proto = descriptor_pb2.FileDescriptorProto(name="orchestrator/tfplugin6.proto", package=PACKAGE)
    proto.syntax = "proto3"
    built: dict[str, Any] = {}

    def container(name: str) -> tuple[Any, str]:
        outer, _, inner = name.rpartition(".")
        return (built[outer] if outer else proto), inner

    field_types = descriptor_pb2.FieldDescriptorProto
    scalars = {
        "string": field_types.TYPE_STRING,
        "bytes": field_types.TYPE_BYTES,
        "bool": field_types.TYPE_BOOL,
        "int64": field_types.TYPE_INT64,
    }
    enums = dict(ENUMS)
    for name, _fields in MESSAGES:
        parent, short = container(name)
        built[name] = (parent.message_type if parent is proto else parent.nested_type).add(name=short)
    for name, values in ENUMS:
        parent, short = container(name)
        enum = (parent.enum_type).add(name=short)
        for value_name, number in values:
            enum.value.add(name=value_name, number=number)
    for name, fields in MESSAGES:
        message = built[name]
        for field_name, number, kind, repeated in fields:
            field = message.field.add(name=field_name, number=number)
            field.label = field_types.LABEL_REPEATED if repeated else field_types.LABEL_OPTIONAL
            if kind in scalars:
                field.type = scalars[kind]
            elif kind.startswith("enum:"):
                assert kind[5:] in enums, kind
                field.type = field_types.TYPE_ENUM
                field.type_name = f".{PACKAGE}.{kind[5:]}"
            elif kind.startswith("map:"):
                entry_name = "".join(part.capitalize() for part in field_name.split("_")) + "Entry"
                entry = message.nested_type.add(name=entry_name)
                entry.options.map_entry = True
                entry.field.add(
                    name="key", number=1, type=field_types.TYPE_STRING, label=field_types.LABEL_OPTIONAL
                )
                entry.field.add(
                    name="value",
                    number=2,
                    type=field_types.TYPE_MESSAGE,
                    type_name=f".{PACKAGE}.{kind[4:]}",
                    label=field_types.LABEL_OPTIONAL,
                )
                field.type = field_types.TYPE_MESSAGE
                field.type_name = f".{PACKAGE}.{name}.{entry_name}"
            else:
                field.type = field_types.TYPE_MESSAGE
                field.type_name = f".{PACKAGE}.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return pool


@cache
def message(name: str) -> Any:
    """The message class ``tfplugin6.<name>`` (e.g. ``PlanResourceChange.Request``)."""
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"{PACKAGE}.{name}"))
