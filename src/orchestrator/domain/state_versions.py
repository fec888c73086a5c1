"""Terraform state versions the orchestrator keeps (state storage ``orchestrator``): what a version is, read
from its document, and the document a rollback writes."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

#: Longest lineage stored (Terraform's are UUIDs); a longer one is cut.
MAX_LINEAGE = 100
#: Largest serial stored (a signed 64-bit column; Terraform's serial is unsigned 64 bits).
MAX_SERIAL = 2**63 - 1


class Kind(StrEnum):
    #: Written by a deployment's Terraform through the state backend (or recovered from its errored.tfstate).
    TERRAFORM = "terraform"
    #: An earlier version made current again (``rolled_back_from``), with a new serial.
    ROLLBACK = "rollback"


@dataclass(frozen=True, kw_only=True)
class Summary:
    """What a state document says of itself; None where it does not say (it is whatever was written)."""

    serial: int | None
    lineage: str | None
    #: Managed resource instances (data sources left out), as a deployment's ``num_tf_resources`` counts.
    resources: int | None


@dataclass(frozen=True, kw_only=True)
class StateVersion:
    org_id: str
    env_uuid: uuid.UUID
    version: int
    serial: int | None
    lineage: str | None
    resources: int | None
    kind: str
    rolled_back_from: int | None
    deployment_id: uuid.UUID | None
    #: The token that created the deployment, or that asked for the rollback.
    created_by: str | None
    created_at: datetime
    md5: str
    size: int


def summarize(data: bytes) -> Summary:
    """Serial, lineage and resource count of a state document, read leniently."""
    try:
        document: Any = json.loads(data)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        return Summary(serial=None, lineage=None, resources=None)
    serial = document.get("serial")
    if not isinstance(serial, int) or isinstance(serial, bool) or not 0 <= serial <= MAX_SERIAL:
        serial = None
    lineage = document.get("lineage")
    return Summary(
        serial=serial,
        lineage=lineage[:MAX_LINEAGE] if isinstance(lineage, str) else None,
        resources=_resources(document.get("resources")),
    )


def _resources(resources: Any) -> int | None:
    if not isinstance(resources, list):
        return None
    count = 0
    for resource in resources:
        if isinstance(resource, dict) and resource.get("mode", "managed") == "managed":
            instances = resource.get("instances")
            count += len(instances) if isinstance(instances, list) else 0
    return count


def rollback_document(data: bytes, *, serial: int) -> bytes:
    """``data`` with ``serial`` (Terraform refuses a state older than the one it last saw); everything
    else, the lineage too, as it was. ``ValueError`` when ``data`` is not a JSON object."""
    document: Any = json.loads(data)
    if not isinstance(document, dict):
        raise ValueError("the state is not a JSON object")
    document["serial"] = serial
    return (json.dumps(document, indent=2) + "\n").encode()
