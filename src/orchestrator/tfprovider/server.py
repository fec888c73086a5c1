"""The provider's RPCs (``tfplugin6.Provider``): each takes a request's bytes and answers a response's.

`HANDLERS` maps each served method to its handler; the go-plugin server (`plugin`) registers them as they
are, so a request is parsed only by the handler that needs it. ``GetProviderSchema`` answers the bytes of
`provider_schema.binpb`, generated from the code (`python -m orchestrator.tfprovider.server --write`,
checked by a test), so a provider start that Terraform makes only for the schema loads neither the
protobuf messages nor a single resource definition; every other method is in `rpc`, imported at its
first request.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from functools import cache

SCHEMA_FILE = os.path.join(os.path.dirname(__file__), "provider_schema.binpb")

Handler = Callable[[bytes], Awaitable[bytes]]

#: The methods `rpc` serves.
RPC_METHODS = (
    "GetMetadata",
    "ValidateProviderConfig",
    "ConfigureProvider",
    "ValidateResourceConfig",
    "ValidateDataResourceConfig",
    "UpgradeResourceState",
    "ReadResource",
    "PlanResourceChange",
    "ApplyResourceChange",
    "ImportResourceState",
    "ReadDataSource",
)


@cache
def schema_response() -> bytes:
    """The ``GetProviderSchema`` response: `SCHEMA_FILE`, or from the code when the file is missing."""
    try:
        with open(SCHEMA_FILE, "rb") as file:
            return file.read()
    except FileNotFoundError:
        from orchestrator.tfprovider import rpc

        return rpc.build_schema_response()


async def get_provider_schema(request: bytes) -> bytes:
    return schema_response()


async def empty(request: bytes) -> bytes:
    """An empty response: ``StopProvider`` (nothing runs between requests), ``GetFunctions`` and
    ``GetResourceIdentitySchemas`` (none)."""
    return b""


def _in_rpc(method: str) -> Handler:
    async def handle(request: bytes) -> bytes:
        from orchestrator.tfprovider import rpc

        return await rpc.HANDLERS[method](request)

    return handle


HANDLERS: dict[str, Handler] = {
    "GetProviderSchema": get_provider_schema,
    "GetFunctions": empty,
    "GetResourceIdentitySchemas": empty,
    "StopProvider": empty,
    **{method: _in_rpc(method) for method in RPC_METHODS},
}


def main(argv: list[str] | None = None) -> int:
    """``--write``: regenerate `SCHEMA_FILE` from the code; ``--check``: fail when it differs."""
    args = sys.argv[1:] if argv is None else argv
    from orchestrator.tfprovider import rpc

    built = rpc.build_schema_response()
    from pathlib import Path

    schema_file = Path(SCHEMA_FILE)
    if args == ["--write"]:
        schema_file.write_bytes(built)
        print(f"wrote {SCHEMA_FILE} ({len(built)} bytes)")
        return 0
    if args == ["--check"]:
        current = schema_file.read_bytes() if schema_file.exists() else b""
        if current != built:
            print(
                f"{SCHEMA_FILE} is stale: python -m orchestrator.tfprovider.server --write", file=sys.stderr
            )
            return 1
        return 0
    print("usage: python -m orchestrator.tfprovider.server --write|--check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
